// libnormlab_spm.so: SentencePiece behind the C interface of spm_api.h (see there for why).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "spm_api.h"

// Exported by libsentencepiece; declared only in its common.h, which Debian does not install.
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}

namespace {

using sentencepiece::SentencePieceProcessor;
using sentencepiece::util::Status;

// SentencePiece logs through std::cerr. Under RTLD_DEEPBIND (spm_api.h) its std::cerr binds to
// libstdc++'s own object, never constructed because the executable holds the copy-relocated one
// that libstdc++ initializes: any log line would segfault (e.g. the warning about a training line
// over max_sentence_length). So nothing below FATAL may be logged; errors come back as Status.
constexpr int kSilentLogLevel = 3;  // SentencePiece's LOG_FATAL

void report(NormlabSpmBytesSink err, void* ctx, const std::string& msg) {
  if (err) err(ctx, msg.data(), msg.size());
}

// Runs `f` for a C caller: an exception becomes a message on `err` and the result `failed`.
template <typename R, typename F>
R guarded(NormlabSpmBytesSink err, void* ctx, R failed, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    report(err, ctx, e.what());
  } catch (...) {
    report(err, ctx, "unknown error");
  }
  return failed;
}

// False, with SentencePiece's message on `err`, when `st` failed.
bool succeeded(const Status& st, NormlabSpmBytesSink err, void* ctx) {
  if (!st.ok()) report(err, ctx, st.ToString());
  return st.ok();
}

void emit_ids(NormlabSpmIdsSink out, void* ctx, const std::vector<int>& ids) {
  const std::vector<int32_t> ids32(ids.begin(), ids.end());
  out(ctx, ids32.data(), ids32.size());
}

void* spm_load(const char* model, size_t size, NormlabSpmBytesSink err, void* err_ctx) {
  return guarded(err, err_ctx, static_cast<void*>(nullptr), [&]() -> void* {
    auto sp = std::make_unique<SentencePieceProcessor>();
    if (!succeeded(sp->LoadFromSerializedProto(std::string_view(model, size)), err, err_ctx))
      return nullptr;
    return sp.release();
  });
}

void spm_release(void* processor) { delete static_cast<SentencePieceProcessor*>(processor); }

void spm_info(const void* processor, int32_t out[5]) {
  const auto* sp = static_cast<const SentencePieceProcessor*>(processor);
  out[0] = sp->GetPieceSize();
  out[1] = sp->pad_id();
  out[2] = sp->unk_id();
  out[3] = sp->bos_id();
  out[4] = sp->eos_id();
}

int spm_encode(const void* processor, const char* text, size_t size, NormlabSpmIdsSink out,
               void* out_ctx, NormlabSpmBytesSink err, void* err_ctx) {
  return guarded(err, err_ctx, 1, [&] {
    const auto* sp = static_cast<const SentencePieceProcessor*>(processor);
    std::vector<int> ids;
    if (!succeeded(sp->Encode(std::string_view(text, size), &ids), err, err_ctx)) return 1;
    emit_ids(out, out_ctx, ids);
    return 0;
  });
}

int spm_decode(const void* processor, const int32_t* ids, size_t size, NormlabSpmBytesSink out,
               void* out_ctx, NormlabSpmBytesSink err, void* err_ctx) {
  return guarded(err, err_ctx, 1, [&] {
    const auto* sp = static_cast<const SentencePieceProcessor*>(processor);
    std::string text;
    if (!succeeded(sp->Decode(std::vector<int>(ids, ids + size), &text), err, err_ctx)) return 1;
    out(out_ctx, text.data(), text.size());
    return 0;
  });
}

// ---- may a line be encoded word by word? (spm_api.h: word_split) ----------------------------

// The few ModelProto fields this needs, read from protobuf's wire format: Debian installs no
// generated sentencepiece_model.pb.h. Field numbers: sentencepiece_model.proto.
struct ModelSpec {
  int64_t model_type = 1;  // TrainerSpec.model_type (3): UNIGRAM 1, BPE 2, WORD 3, CHAR 4
  bool treat_whitespace_as_suffix = false;  // TrainerSpec (24)
  std::string normalizer;                   // NormalizerSpec.name (1)
  std::string charsmap;                     // NormalizerSpec.precompiled_charsmap (2): the rules
  bool add_dummy_prefix = true;             // NormalizerSpec (3)
  bool remove_extra_whitespaces = true;     // NormalizerSpec (4)
  bool escape_whitespaces = true;           // NormalizerSpec (5)
};

// Calls field(number, wire_type, varint, bytes) for each field of one message; false when the
// bytes are not a well-formed message.
template <typename Field>
bool for_each_field(std::string_view msg, Field field) {
  size_t at = 0;
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && at < msg.size(); shift += 7) {
      const auto b = static_cast<uint8_t>(msg[at++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  while (at < msg.size()) {
    uint64_t key = 0, v = 0;
    if (!varint(key)) return false;
    std::string_view bytes;
    switch (key & 7) {
      case 0:
        if (!varint(v)) return false;
        break;
      case 1:
      case 5: {
        const size_t n = (key & 7) == 1 ? 8 : 4;
        if (msg.size() - at < n) return false;
        at += n;
        break;
      }
      case 2:
        if (!varint(v) || v > msg.size() - at) return false;
        bytes = msg.substr(at, v);
        at += v;
        break;
      default:
        return false;  // groups: not used by this proto
    }
    field(key >> 3, key & 7, v, bytes);
  }
  return true;
}

bool read_model_spec(std::string_view proto, ModelSpec& spec) {
  bool ok = true;
  ok &= for_each_field(proto, [&](uint64_t n, uint64_t type, uint64_t, std::string_view bytes) {
    if (type != 2) return;
    if (n == 2) {
      ok &= for_each_field(bytes, [&](uint64_t f, uint64_t t, uint64_t v, std::string_view) {
        if (t != 0) return;
        if (f == 3) spec.model_type = int64_t(v);
        if (f == 24) spec.treat_whitespace_as_suffix = v != 0;
      });
    } else if (n == 3) {
      ok &= for_each_field(bytes, [&](uint64_t f, uint64_t t, uint64_t v, std::string_view s) {
        if (f == 1 && t == 2) spec.normalizer = std::string(s);
        if (f == 2 && t == 2) spec.charsmap = std::string(s);
        if (f == 3 && t == 0) spec.add_dummy_prefix = v != 0;
        if (f == 4 && t == 0) spec.remove_extra_whitespaces = v != 0;
        if (f == 5 && t == 0) spec.escape_whitespaces = v != 0;
      });
    }
  });
  return ok;
}

// The first normalization rule whose key holds a space, in the rules the model carries (its
// precompiled_charsmap: a uint32 trie size, a Darts-clone double-array trie of the keys, then the
// replacements; sentencepiece normalizer.cc). nullopt when there is none; "?" when the rules are
// not readable. The rules are what SentencePiece applies, whatever the spec's name says
// (issue 56.5: a model named nmt_nfkc mapping "x y" to "Z").
// `c` other than ' ': only keys longer than the one character `c` count (a rule mapping "\n" alone
// to a space is what makes a newline a space).
std::optional<std::string> rule_with_space(const std::string& charsmap, char c = ' ') {
  if (charsmap.empty()) return std::nullopt;  // identity
  if (charsmap.size() < 4) return std::string("?");
  uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, charsmap.data(), 4);
  if (trie_bytes % 4 != 0 || trie_bytes > charsmap.size() - 4 || trie_bytes == 0)
    return std::string("?");
  std::vector<uint32_t> units(trie_bytes / 4);
  std::memcpy(units.data(), charsmap.data() + 4, trie_bytes);
  // Darts-clone's unit: label in the low byte (bit 31 set on leaves), has_leaf bit 8, the
  // offset to the children in bits 10-31 (shifted by 8 more when bit 9 is set).
  auto offset = [](uint32_t u) { return (u >> 10) << ((u & (1U << 9)) >> 6); };
  auto label = [](uint32_t u) { return u & ((1U << 31) | 0xFF); };
  auto has_leaf = [](uint32_t u) { return ((u >> 8) & 1) == 1; };
  // darts-clone builds the trie from a DAWG: common suffixes are shared, so keys can outnumber the
  // units many times over. Each unit is visited once: does a leaf lie below it, and a key with a
  // space? A cycle or a key deeper than 256 bytes (a malformed trie) is "not readable".
  enum : uint8_t { kUnseen, kOpen, kDone };
  std::vector<uint8_t> state(units.size(), kUnseen), leaf_below(units.size()),
      space_below(units.size());
  bool malformed = false;
  auto child = [&](uint32_t at, uint32_t c) -> int64_t {
    const uint32_t next = (at ^ offset(units[at])) ^ c;
    return next < units.size() && label(units[next]) == c ? int64_t(next) : -1;
  };
  std::function<void(uint32_t, int)> visit = [&](uint32_t at, int depth) {
    if (state[at] == kDone) return;
    if (state[at] == kOpen || depth > 256) {
      malformed = true;
      return;
    }
    state[at] = kOpen;
    leaf_below[at] = has_leaf(units[at]);
    for (uint32_t k = 1; k < 256 && !malformed; ++k) {
      const int64_t next = child(at, k);
      if (next < 0) continue;
      visit(uint32_t(next), depth + 1);
      leaf_below[at] |= leaf_below[next];
      // A key through this edge holds `c`; for c other than ' ', the key "c" alone does not count:
      // from the root, only a leaf below its child's children does.
      bool through = false;
      if (k == uint32_t(uint8_t(c))) {
        if (c == ' ' || at != 0) {
          through = leaf_below[next];
        } else {
          for (uint32_t j = 1; j < 256 && !through; ++j)
            if (const int64_t below = child(uint32_t(next), j); below >= 0) {
              visit(uint32_t(below), depth + 2);
              through = leaf_below[below];
            }
        }
      }
      space_below[at] |= through || space_below[next];
    }
    state[at] = kDone;
  };
  visit(0, 0);
  if (malformed) return std::string("?");
  if (!space_below[0]) return std::nullopt;
  // One such key, for the message: the path down to its space, then to a leaf.
  std::string key;
  for (uint32_t at = 0, seen_space = 0; key.size() < 64;) {
    if (seen_space && has_leaf(units[at])) break;
    bool moved = false;
    for (uint32_t k = 1; k < 256 && !moved; ++k) {
      const int64_t next = child(at, k);
      if (next < 0) continue;
      const bool take = seen_space
                            ? leaf_below[next]
                            : (k == uint32_t(uint8_t(c)) && leaf_below[next]) || space_below[next];
      if (!take) continue;
      seen_space |= k == uint32_t(uint8_t(c));
      key += char(k);
      at = uint32_t(next);
      moved = true;
    }
    if (!moved) break;
  }
  return key;
}

// Empty when the model encodes "w1 w2 … wn" (words separated by single spaces, each accepted by
// spm_encode_word) exactly as the concatenation of Encode(w1) … Encode(wn); else why not. It
// does when
// - the model is BPE or CHAR: BPE merges only into vocabulary pieces, ties broken by position
//   (bpe_model.cc), so a merge never crosses a word start when no piece does; unigram sums scores
//   along the whole line (a float tie could fall differently), WORD merges runs of unknown words;
// - no piece holds U+2581 "▁" except at its start or as a run of "▁" only, and "▁" itself is known
//   (a word's first symbol is then never unknown, so no run of unknowns spans two words, see
//   PopulateSentencePieceText);
// - no normalization rule the model holds is keyed by a string with a space (the built-in rule sets
//   are keyed by one character or a canonical decomposition: a starter and its combining marks),
//   so no rule spans the space between two words; spaces become "▁" and a "▁" is prefixed (the
//   first word and a word after a space start alike); whitespace marks the start of a piece, not
//   its end.
std::string word_split_refusal(const SentencePieceProcessor& sp) {
  ModelSpec spec;
  if (!read_model_spec(sp.serialized_model_proto(), spec)) return "model proto not readable";
  if (spec.model_type != 2 && spec.model_type != 4)
    return spec.model_type == 1   ? "unigram model"
           : spec.model_type == 3 ? "word model"
                                  : "model type";
  if (spec.treat_whitespace_as_suffix) return "treat_whitespace_as_suffix";
  // Decided by the rules, not the name: a rule keyed by a space could join two words.
  if (const auto rule = rule_with_space(spec.charsmap))
    return *rule == "?" ? "normalization rules not readable"
                        : "normalization rule '" + *rule + "' spans a space";
  if (!spec.add_dummy_prefix) return "add_dummy_prefix false";
  if (!spec.escape_whitespaces) return "escape_whitespaces false";
  constexpr std::string_view kSpace = "\xe2\x96\x81";  // U+2581
  if (sp.IsUnknown(sp.PieceToId(std::string(kSpace)))) return "no piece \"▁\"";
  for (int id = 0; id < sp.GetPieceSize(); ++id) {
    const std::string& piece = sp.IdToPiece(id);
    size_t runs = 0;
    while (runs + kSpace.size() <= piece.size() && piece.compare(runs, kSpace.size(), kSpace) == 0)
      runs += kSpace.size();
    if (runs == piece.size() || piece.find(kSpace, runs) == std::string::npos) continue;
    return "piece '" + piece + "' spans a word start";
  }
  return {};
}

// The ASCII whitespace characters other than ' ' ("\t\n\v\f\r", those of them) that separate
// words as a space does, and " " first, when runs of them collapse: a line is then its words split
// at any run of these, leading and trailing runs dropped. Empty when spaces do not collapse
// (remove_extra_whitespaces false) or the line must be split at single spaces (word_split_refusal
// is not empty). A character counts when no rule key longer than itself holds it (so what the
// normalizer makes of it does not depend on its neighbours) and the model encodes "x?y" and
// "?x? ?y?" as "x y" (it becomes whitespace, which collapses).
std::string whitespace_split_chars(const SentencePieceProcessor& sp) {
  ModelSpec spec;
  if (!read_model_spec(sp.serialized_model_proto(), spec) || !spec.remove_extra_whitespaces ||
      !word_split_refusal(sp).empty())
    return {};
  std::string chars = " ";
  std::vector<int> want, got;
  if (!sp.Encode("x y", &want).ok()) return {};
  for (const char c : std::string("\t\n\v\f\r")) {
    if (rule_with_space(spec.charsmap, c)) continue;
    const std::string s(1, c);
    if (!sp.Encode("x" + s + "y", &got).ok() || got != want) continue;
    if (!sp.Encode(s + "x" + s + " " + s + "y" + s, &got).ok() || got != want) continue;
    chars += c;
  }
  return chars;
}

// `text`'s ids and the normalized text they cover (a byte piece "<0xAB>" as its byte): each piece's
// id is its vocabulary id; an unknown piece (a run of unknown characters) is in no vocabulary
// entry, so it maps to unk (PopulateSentencePieceText). One encode, not two.
bool encode_normalized(const SentencePieceProcessor& sp, std::string_view text,
                       std::vector<int>& ids, std::string& normalized, NormlabSpmBytesSink err,
                       void* err_ctx) {
  std::vector<std::string> pieces;
  if (!succeeded(sp.Encode(text, &pieces), err, err_ctx)) return false;
  ids.clear();
  normalized.clear();
  for (const auto& p : pieces) {
    ids.push_back(sp.PieceToId(p));
    if (sp.IsByte(ids.back()) && p.size() == 6)
      normalized += char(std::stoi(p.substr(3, 2), nullptr, 16));
    else
      normalized += p;
  }
  return true;
}

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";  // U+2581, what a space becomes

// Encodes one word; 2 when it would not encode alone as it does inside a line (see spm_api.h).
// Alone, the word normalizes to "▁" + what the normalizer made of it (a leading space in the
// normalizer's output is dropped both alone and after a space, NormalizerSpec); inside a line
// "a WORD b" it gives the same text and the same pieces when that text is not empty and holds no
// other "▁": the word's normalization made no whitespace of its own, which a line could merge
// with its neighbours' or keep (remove_extra_whitespaces false).
int spm_encode_word(const void* processor, const char* text, size_t size, NormlabSpmIdsSink out,
                    void* out_ctx, NormlabSpmBytesSink err, void* err_ctx) {
  return guarded(err, err_ctx, 1, [&] {
    const auto* sp = static_cast<const SentencePieceProcessor*>(processor);
    const std::string_view word(text, size);
    std::vector<int> ids;
    std::string normalized;
    if (!encode_normalized(*sp, word, ids, normalized, err, err_ctx)) return 1;
    const auto n = kSpaceSymbol.size();
    if (normalized.size() <= n || normalized.compare(0, n, kSpaceSymbol) != 0 ||
        normalized.find(kSpaceSymbol, n) != std::string::npos)
      return 2;
    // A rule keyed by a space and what follows it could join a word that starts (or ends) with a
    // non-ASCII character to its neighbour; the built-in rules have none, and one neighbour shows.
    auto joins = [&](const std::string& left, const std::string& right) {
      std::vector<int> l, r, both;
      return !sp->Encode(left, &l).ok() || !sp->Encode(right, &r).ok() ||
             !sp->Encode(left + " " + right, &both).ok() ||
             (l.insert(l.end(), r.begin(), r.end()), l != both);
    };
    const std::string w(word);
    if ((static_cast<uint8_t>(word.front()) >= 0x80 && joins("a", w)) ||
        (static_cast<uint8_t>(word.back()) >= 0x80 && joins(w, "a")))
      return 2;
    emit_ids(out, out_ctx, ids);
    return 0;
  });
}

int spm_word_split(const void* processor, NormlabSpmBytesSink why, void* why_ctx) {
  return guarded(why, why_ctx, 0, [&] {
    const std::string refusal =
        word_split_refusal(*static_cast<const SentencePieceProcessor*>(processor));
    if (refusal.empty()) return 1;
    report(why, why_ctx, refusal);
    return 0;
  });
}

// ---- may a document that keeps its spaces and newlines be encoded segment by segment? ----------
//
// A model that keeps spaces (remove_extra_whitespaces false: `normlab data tokenize
// --keep-newlines`, LLaMA's) normalizes a document to T = "▁" + its text with each space a "▁" and
// "\n" kept. BPE (bpe_model.cc) starts from T's characters (user symbols whole, by longest match)
// and merges adjacent symbols into vocabulary pieces; a position of T that no vocabulary piece can
// span is never merged across, so the pieces on each side are those of each side alone (merges on
// one side never see the other; ties fall by position, the same on each side). When
// - every "▁" in a piece lies in its leading run (word_split_refusal), no piece spans a non-"▁"
//   followed by "▁": a document splits before each run of spaces that follows a non-space;
// - no piece but "\n" holds "\n", and "\n" is known or falls back to its byte, no piece spans
//   either side of a "\n" (and no run of unknown characters does): a document splits into lines;
// - no normalization rule's key holds a space, nor a "\n" with more (rule_with_space), and "\n"
//   alone normalizes to itself, each part of the text normalizes as it does alone;
// then a document's pieces are its lines' with the "\n" piece between them, and a line's are its
// segments' (a run of spaces and the non-spaces after it). A segment is encoded after a "\n" (see
// spm_encode_segment), where the same argument holds, and the first one of a document with the
// dummy prefix as one space more. Empty when all of this holds, else why not.
std::string newline_split_refusal(const SentencePieceProcessor& sp, bool& dummy_prefix,
                                  std::vector<int>& newline_ids) {
  ModelSpec spec;
  if (!read_model_spec(sp.serialized_model_proto(), spec)) return "model proto not readable";
  if (spec.remove_extra_whitespaces) return "spaces collapse (runs of them split the line)";
  if (std::string why = word_split_refusal(sp); !why.empty()) return why;
  if (const auto rule = rule_with_space(spec.charsmap, '\n'))
    return *rule == "?" ? "normalization rules not readable"
                        : "normalization rule '" + *rule + "' spans a newline";
  for (int id = 0; id < sp.GetPieceSize(); ++id) {
    const std::string& piece = sp.IdToPiece(id);
    if (piece != "\n" && piece.find('\n') != std::string::npos)
      return "piece '" + piece + "' holds a newline";
  }
  std::vector<int> ids;
  std::string normalized;
  if (!encode_normalized(sp, "\n", ids, normalized, nullptr, nullptr) || ids.empty())
    return "\"\\n\" does not encode";
  const std::string dummy = spec.add_dummy_prefix ? std::string(kSpaceSymbol) : "";
  if (normalized != dummy + "\n") return "\"\\n\" normalizes to something else";
  if (sp.IsUnknown(ids.back())) return "\"\\n\" is unknown (no piece, no byte fallback)";
  dummy_prefix = spec.add_dummy_prefix;
  newline_ids.assign(1, ids.back());
  return {};
}

int spm_newline_split(const void* processor, int32_t* dummy_prefix, NormlabSpmIdsSink newline_ids,
                      void* ids_ctx, NormlabSpmBytesSink why, void* why_ctx) {
  return guarded(why, why_ctx, 0, [&] {
    bool dummy = false;
    std::vector<int> ids;
    const std::string refusal =
        newline_split_refusal(*static_cast<const SentencePieceProcessor*>(processor), dummy, ids);
    if (!refusal.empty()) {
      report(why, why_ctx, refusal);
      return 0;
    }
    *dummy_prefix = dummy;
    emit_ids(newline_ids, ids_ctx, ids);
    return 1;
  });
}

// A segment's ids as it encodes after a line start or a non-space: "\n" + segment encoded, less the
// ids of "\n" alone (the "\n" side of that boundary, newline_split_refusal). Refused (2) when its
// normalization is empty, or ends in "▁" while the segment holds more than spaces (a segment that
// follows it would start at "▁" after "▁", inside a run a piece may span).
int spm_encode_segment(const void* processor, const char* text, size_t size, NormlabSpmIdsSink out,
                       void* out_ctx, NormlabSpmBytesSink err, void* err_ctx) {
  return guarded(err, err_ctx, 1, [&] {
    const auto& sp = *static_cast<const SentencePieceProcessor*>(processor);
    const std::string_view segment(text, size);
    std::vector<int> line_ids, ids;
    std::string line, normalized;
    if (!encode_normalized(sp, "\n", line_ids, line, err, err_ctx) ||
        !encode_normalized(sp, "\n" + std::string(segment), ids, normalized, err, err_ctx))
      return 1;
    if (ids.size() < line_ids.size() ||
        !std::equal(line_ids.begin(), line_ids.end(), ids.begin()) ||
        normalized.compare(0, line.size(), line) != 0)
      return 2;
    ids.erase(ids.begin(), ids.begin() + line_ids.size());
    normalized.erase(0, line.size());
    const bool spaces_only = segment.find_first_not_of(' ') == std::string_view::npos;
    if (normalized.empty() || (!spaces_only && normalized.size() >= kSpaceSymbol.size() &&
                               normalized.compare(normalized.size() - kSpaceSymbol.size(),
                                                  kSpaceSymbol.size(), kSpaceSymbol) == 0))
      return 2;
    emit_ids(out, out_ctx, ids);
    return 0;
  });
}

// Feeds the trainer from the caller's callback.
class CallbackIterator : public sentencepiece::SentenceIterator {
 public:
  CallbackIterator(NormlabSpmNextSentence next, void* ctx) : next_(next), ctx_(ctx) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    const char* data = nullptr;
    size_t size = 0;
    if (next_(ctx_, &data, &size)) {
      value_.assign(data, size);
    } else {
      done_ = true;
      value_.clear();
    }
  }
  const std::string& value() const override { return value_; }
  Status status() const override { return Status(); }

 private:
  NormlabSpmNextSentence next_;
  void* ctx_;
  bool done_ = false;
  std::string value_;
};

int spm_train(const char* const* keys, const char* const* values, size_t n,
              NormlabSpmNextSentence next, void* next_ctx, NormlabSpmBytesSink model,
              void* model_ctx, NormlabSpmBytesSink err, void* err_ctx) {
  return guarded(err, err_ctx, 1, [&] {
    std::unordered_map<std::string, std::string> kwargs;
    for (size_t i = 0; i < n; ++i) {
      std::string key = keys[i];
      if (key == "random_seed")
        sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(std::stoul(values[i])));
      else
        kwargs[key] = values[i];
    }
    kwargs["minloglevel"] = std::to_string(kSilentLogLevel);  // see kSilentLogLevel
    CallbackIterator it(next, next_ctx);
    std::string proto;
    if (!succeeded(sentencepiece::SentencePieceTrainer::Train(kwargs, &it, &proto), err, err_ctx))
      return 1;
    model(model_ctx, proto.data(), proto.size());
    return 0;
  });
}

int spm_whitespace_split(const void* processor, NormlabSpmBytesSink chars, void* chars_ctx) {
  const std::string c =
      whitespace_split_chars(*static_cast<const SentencePieceProcessor*>(processor));
  chars(chars_ctx, c.data(), c.size());
  return 0;
}

const NormlabSpmApi kApi = {kNormlabSpmApiVersion,
                            spm_load,
                            spm_release,
                            spm_info,
                            spm_encode,
                            spm_decode,
                            spm_train,
                            spm_word_split,
                            spm_encode_word,
                            spm_whitespace_split,
                            spm_newline_split,
                            spm_encode_segment};

}  // namespace

extern "C" __attribute__((visibility("default"))) const NormlabSpmApi* normlab_spm_api(void) {
  // Before anything else runs: loading and encoding may log too (see kSilentLogLevel).
  sentencepiece::logging::SetMinLogLevel(kSilentLogLevel);
  return &kApi;
}
