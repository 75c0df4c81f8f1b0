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
      segments_(split_ && tok.newline_split_refusal().empty()),
      runs_(!tok.whitespace_split().empty()),
      separators_(runs_ ? tok.whitespace_split() : " "),
      max_words_(std::max<size_t>(max_words, 1)) {
  cache_.reserve(std::min<size_t>(max_words_, size_t(1) << 16));
}

void WordCacheEncoder::encode_into(std::string_view line, std::vector<int32_t>& ids) {
  ids.clear();
  if (segments_) {
    if (append_segments(line, ids)) return;
  } else if (split_ && (runs_ ? line.find_first_not_of(separators_) != std::string_view::npos
                              : splits_at_spaces(line))) {
    bool refused = false;
    for (size_t begin = runs_ ? line.find_first_not_of(separators_) : 0;
         begin <= line.size() && !refused;) {
      size_t end = line.find_first_of(separators_, begin);
      if (end == std::string_view::npos) end = line.size();
      refused = !append_word(line.substr(begin, end - begin), ids);
      begin = runs_ ? line.find_first_not_of(separators_, end) : end + 1;
    }
    if (!refused) return;
  }
  ++whole_;
  tok_.encode_into(line, ids);
}

bool WordCacheEncoder::append_segments(std::string_view text, std::vector<int32_t>& ids) {
  if (text.empty()) return true;
  const std::vector<int32_t>& newline = tok_.newline_ids();
  for (size_t line_begin = 0;;) {
    const size_t nl = std::min(text.find('\n', line_begin), text.size());
    const std::string_view line = text.substr(line_begin, nl - line_begin);
    // Segments: a run of spaces (maybe none) and the non-spaces up to the next space. The
    // document's first one goes after the dummy prefix's space (alone on an empty first line).
    const bool dummy = line_begin == 0 && tok_.dummy_prefix();
    for (size_t b = 0; b < line.size() || (dummy && b == 0);) {
      const size_t word = std::min(line.find_first_not_of(' ', b), line.size());
      const size_t e = std::min(line.find(' ', word), line.size());
      std::string_view segment = line.substr(b, e - b);
      if (dummy && b == 0) {
        first_.assign(1, ' ');
        first_ += segment;
        segment = first_;
      }
      if (!append_word(segment, ids)) return false;
      b = e;
      if (e == 0) break;  // the empty first line: the dummy's space alone
    }
    if (nl == text.size()) return true;
    ids.insert(ids.end(), newline.begin(), newline.end());
    line_begin = nl + 1;
  }
}

bool WordCacheEncoder::append_word(std::string_view word, std::vector<int32_t>& ids) {
  auto it = cache_.find(word);
  if (it != cache_.end()) {
    ++hits_;
  } else {
    ++misses_;
    const bool alone = segments_ ? tok_.encode_segment(word, word_) : tok_.encode_word(word, word_);
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
  if (it->second.size == kRefused) return false;
  ids.insert(ids.end(), ids_.begin() + it->second.begin,
             ids_.begin() + it->second.begin + it->second.size);
  return true;
}

}  // namespace normlab::data::detail
