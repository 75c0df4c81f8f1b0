// WordCacheEncoder: SentencePiece encoding through a cache of words (internal.h says when and why
// it is exact).
#include <algorithm>

#include "internal.h"

namespace normlab::data::detail {

namespace {

// Words separated by single spaces, nothing before the first or after the last.
bool splits_at_spaces(std::string_view line) {
  return !line.empty() && line.front() != ' ' && line.back() != ' ' &&
         line.find("  ") == std::string_view::npos;
}

}  // namespace

WordCacheEncoder::WordCacheEncoder(const SentencePieceTokenizer& tok, bool enabled,
                                   size_t max_words)
    : tok_(tok),
      split_(enabled && tok.word_split_refusal().empty()),
      runs_(!tok.whitespace_split().empty()),
      separators_(runs_ ? tok.whitespace_split() : " "),
      max_words_(std::max<size_t>(max_words, 1)) {
  cache_.reserve(std::min<size_t>(max_words_, size_t(1) << 16));
}

void WordCacheEncoder::encode_into(std::string_view line, std::vector<int32_t>& ids) {
  const bool runs = runs_;
  if (!split_ || (runs ? line.find_first_not_of(separators_) == std::string_view::npos
                       : !splits_at_spaces(line))) {
    ++whole_;
    tok_.encode_into(line, ids);
    return;
  }
  ids.clear();
  for (size_t begin = runs ? line.find_first_not_of(separators_) : 0; begin <= line.size();) {
    size_t end = line.find_first_of(separators_, begin);
    if (end == std::string_view::npos) end = line.size();
    const std::string_view word = line.substr(begin, end - begin);
    begin = runs ? line.find_first_not_of(separators_, end) : end + 1;
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ++hits_;
    } else {
      ++misses_;
      const bool alone = tok_.encode_word(word, word_);
      if (cache_.size() >= max_words_) {  // start over: memory stays bounded
        cache_.clear();
        keys_.clear();
        ids_.clear();
      }
      keys_.emplace_back(word);
      it = cache_
               .emplace(keys_.back(),
                        Span{uint32_t(ids_.size()), alone ? uint32_t(word_.size()) : kRefused})
               .first;
      if (alone) ids_.insert(ids_.end(), word_.begin(), word_.end());
    }
    if (it->second.size == kRefused) {
      ++whole_;
      tok_.encode_into(line, ids);
      return;
    }
    ids.insert(ids.end(), ids_.begin() + it->second.begin,
               ids_.begin() + it->second.begin + it->second.size);
  }
}

}  // namespace normlab::data::detail
