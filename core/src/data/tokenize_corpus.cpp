#include "tokenize_corpus.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <random>
#include <regex>
#include <thread>

#include "internal.h"
#include "text_pieces.h"
#include "token_shards.h"
#include "util/atomic_file.h"
#include "util/file_lock.h"
#include "util/owned_dir.h"
#include "util/utf8.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab::data {
namespace {

// One piece of work: bytes [begin, end) of an input's text (decompressed, for .gz/.zst), starting
// at a line; one shard.
struct Unit {
  fs::path path;
  int64_t begin = 0, end = 0;
  std::string key;        // what the shard depends on (for a resume)
  bool streamed = false;  // a piece of a compressed input cut in several: its reader hands it over
  int64_t bytes() const { return end - begin; }
};

std::string bytes_text(int64_t b) {
  return b >= (int64_t(1) << 30) ? fmt::format("{:.2f} GB", double(b) / 1e9)
                                 : fmt::format("{:.0f} MB", double(b) / 1e6);
}

// "FILE:LINE" of a unit's line (a piece of a plain file counts from its first byte).
std::string where(const Unit& u, int64_t number) {
  return u.begin > 0 ? fmt::format("{}: line {} after byte {}", u.path.string(), number, u.begin)
                     : fmt::format("{}:{}", u.path.string(), number);
}

// The text of one line: the line itself, or a JSONL record's field.
std::string_view text_of(const Unit& u, std::string_view l, int64_t number,
                         const std::string& field, std::string& storage) {
  if (field.empty()) return l;
  // Each way a record can be wrong says what it is (issue 56.21).
  if (const size_t bad = util::find_invalid_utf8(l); bad != std::string_view::npos)
    throw DataError(fmt::format("{}: invalid UTF-8 at byte {} of the record (JSON is UTF-8)",
                                where(u, number), bad));
  json j;
  try {
    j = json::parse(l.begin(), l.end());
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("{}: not JSON: syntax error at byte {} of the record",
                                where(u, number), e.byte));
  }
  if (!j.is_object())
    throw DataError(fmt::format("{}: a JSON {}, not an object with a string field '{}'",
                                where(u, number), j.type_name(), field));
  if (!j.contains(field))
    throw DataError(fmt::format("{}: the record has no field '{}' (--jsonl-field names another)",
                                where(u, number), field));
  if (!j[field].is_string())
    throw DataError(fmt::format("{}: field '{}' is a JSON {}, expected a string", where(u, number),
                                field, j[field].type_name()));
  storage = j[field].get<std::string>();
  return storage;
}

// The JSONL field to read, "" for plain text.
std::string text_field(const TokenizeOptions& o, const fs::path& input) {
  if (!o.jsonl_field.empty()) return o.jsonl_field;
  return is_jsonl(input) ? "text" : "";
}

// Every input cut into pieces at line starts (text_pieces.h); compressed inputs are decompressed
// once for it, over `jobs` threads.
std::vector<Unit> plan_units(const TokenizeOptions& o, const std::string& tokenizer_digest,
                             std::ostream& log) {
  const size_t n = o.inputs.size();
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cuts(n);
  const auto compressed = std::count_if(o.inputs.begin(), o.inputs.end(),
                                        [](const std::string& i) { return is_compressed(i); });
  if (compressed)
    fmt::print(log, "tokenize: cutting {} compressed input(s) into pieces of ~{} (one pass)\n",
               compressed, bytes_text(o.piece_bytes));
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::exception_ptr failure;
  auto cut = [&] {
    for (size_t i; (i = next++) < n;) {
      try {
        // A document never spans two pieces: whole files, or cuts after a blank line.
        const bool plain_text = !is_jsonl(o.inputs[i]);
        const bool files = plain_text && o.documents == "files";
        cuts[i] = cut_into_pieces(o.inputs[i], files ? INT64_MAX : o.piece_bytes,
                                  plain_text && o.documents == "paragraphs");
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int j = 0; j < std::min<int>(o.jobs, int(n)); ++j) threads.emplace_back(cut);
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  std::vector<Unit> units;
  for (size_t i = 0; i < n; ++i) {
    const fs::path p(o.inputs[i]);
    const std::string field = text_field(o, p);
    for (const auto& [b, e] : cuts[i]) {
      Unit u{p, b, e, "", is_compressed(p) && cuts[i].size() > 1};
      // Everything the shard's tokens depend on but its text (checked by its digest, which the
      // journal holds: finished_units): issue 66.3, a rerun with other --documents kept the old
      // shards. The tokenizer's content covers the vocabulary (so the dtype), EOS and
      // --keep-newlines; the version, how pieces are read (66.11 changed --documents files).
      detail::Hasher h;
      h.field("normlab-tokenize-piece-v2")
          .field(fs::absolute(p).string())
          .field(b)
          .field(e)
          .field(field)
          .field(field.empty() ? o.documents : std::string("records"))
          .field(tokenizer_digest);
      u.key = h.digest().hex();
      units.push_back(u);
    }
  }
  return units;
}

struct ShardResult {
  int64_t tokens = 0, max_token = -1;
  std::string sha256;
  std::string text_digest;  // of the piece's text (detail::Hasher)
};

std::string shard_name(size_t i) { return fmt::format("shard_{:05d}.bin", i); }

// The tokenizer's training sample: a uniform random sample of `sample_lines` non-empty lines (JSONL
// records) over all inputs, seeded (reservoir sampling, Algorithm R): the first lines of the first
// file gave a tokenizer of C headers for a corpus of prose and code (issue 59.1). A JSONL record is
// parsed when it enters the sample, or first when it may be empty: only an empty string is
// written `""`, and an empty record must not count (issue 66.9: one was drawn, then dropped, and
// every later draw into a slot past it was lost: 1 line sampled when the first record was empty).
// Says what it sampled.
std::vector<std::string> sample_lines_for_tokenizer(const TokenizeOptions& o, std::ostream& log) {
  std::vector<std::string> sample;
  std::vector<size_t> origin;  // which input each kept line came from
  std::mt19937_64 rng(detail::mix_seed(o.sample_seed, 0x746f6b73616d706cULL));
  int64_t seen = 0;  // non-empty lines (records) so far
  std::vector<int64_t> lines_of(o.inputs.size(), 0);
  for (size_t i = 0; i < o.inputs.size(); ++i) {
    const Unit u{o.inputs[i], 0, 0, "", false};
    const std::string field = text_field(o, u.path);
    for_each_line(u.path, 0, -1, o.max_line_bytes, [&](std::string_view l, int64_t n) {
      if (l.empty()) return;
      std::string storage;
      std::optional<std::string_view> text;
      if (!field.empty() && l.find("\"\"") != std::string_view::npos) {
        text = text_of(u, l, n, field, storage);
        if (text->empty()) return;
      }
      ++lines_of[i];
      // Algorithm R over the non-empty lines: the k-th (from 0) takes slot k while the sample
      // fills, then a uniform slot in [0, k], kept when below sample_lines.
      const int64_t slot =
          seen < o.sample_lines ? seen : int64_t(detail::uniform_below(rng, uint64_t(seen) + 1));
      ++seen;
      if (slot >= o.sample_lines) return;
      if (!text) text = text_of(u, l, n, field, storage);  // not empty: it has no `""`
      if (slot == int64_t(sample.size())) {
        sample.emplace_back(*text);
        origin.push_back(i);
      } else {
        sample[size_t(slot)].assign(*text);
        origin[size_t(slot)] = i;
      }
    });
  }
  std::vector<int64_t> kept(o.inputs.size(), 0);
  for (size_t i : origin) ++kept[i];
  std::string per_input;
  for (size_t i = 0; i < o.inputs.size() && i < 8; ++i)
    per_input += fmt::format("{}{} {} of {}", i ? ", " : "",
                             fs::path(o.inputs[i]).filename().string(), kept[i], lines_of[i]);
  if (o.inputs.size() > 8) per_input += fmt::format(", … ({} inputs)", o.inputs.size());
  fmt::print(log,
             "tokenize: training the tokenizer on {} of {} non-empty lines, sampled uniformly over "
             "all inputs (--sample-lines {}, --sample-seed {}): {}\n",
             sample.size(), seen, o.sample_lines, o.sample_seed, per_input);
  return sample;
}

// The tokenizer: the given model (any special ids: a LLaMA tokenizer has no pad), or one trained on
// a sample of the inputs (normlab's special ids, cached).
std::shared_ptr<const detail::SentencePieceTokenizer> obtain_tokenizer(const TokenizeOptions& o,
                                                                       const fs::path& cache,
                                                                       std::ostream& log) {
  if (!o.model.empty()) {
    detail::TextFile f = detail::read_text_file("--model", o.model);
    return std::make_shared<detail::SentencePieceTokenizer>(std::move(f.bytes), "'" + o.model + "'",
                                                            /*normlab_ids=*/false);
  }
  const std::vector<std::string> sample = sample_lines_for_tokenizer(o, log);
  std::vector<const std::string*> text;
  for (const auto& s : sample) text.push_back(&s);
  TokenizerConfig cfg;
  cfg.vocab_size = o.vocab_size;
  cfg.model_type = o.model_type;
  detail::Hasher h;
  h.field("tokenize-sample");
  for (const auto& s : sample) h.field(s);
  std::vector<std::pair<std::string, std::string>> extra;
  if (o.keep_newlines) extra = detail::keep_newlines_trainer_options();
  return detail::obtain_sentencepiece(
             cfg, h.digest(), [&] { return text; }, cache, "tokenize", log, extra)
      .tokenizer;
}

// The digest (detail::Hasher) of the text of each unit in `which` (indexes into `units`, in order),
// a compressed input decompressed once for all its units.
std::vector<std::string> text_digests(const std::vector<Unit>& units,
                                      const std::vector<size_t>& which) {
  std::vector<std::string> digests(which.size());
  for (size_t k = 0; k < which.size();) {
    const Unit& first = units[which[k]];
    if (!is_compressed(first.path)) {
      detail::Hasher h;
      read_text(first.path, first.begin, first.end,
                [&](const char* data, size_t n) { h.bytes(data, n); });
      digests[k++] = h.digest().hex();
      continue;
    }
    size_t last = k;  // [k, last]: this input's units
    while (last + 1 < which.size() && units[which[last + 1]].path == first.path) ++last;
    std::vector<detail::Hasher> h(last - k + 1);
    int64_t at = 0;
    size_t j = 0;  // the unit holding byte `at`, or past it
    read_text(first.path, 0, units[which[last]].end, [&](const char* data, size_t n) {
      for (size_t used = 0; used < n && j < h.size();) {
        const Unit& u = units[which[k + j]];
        if (at >= u.end) {
          ++j;
          continue;
        }
        const int64_t skip = std::max<int64_t>(u.begin - at, 0);
        if (skip >= int64_t(n - used)) {
          at += int64_t(n - used);
          break;
        }
        used += size_t(skip);
        at += skip;
        const size_t take = size_t(std::min<int64_t>(int64_t(n - used), u.end - at));
        h[j].bytes(data + used, take);
        used += take;
        at += int64_t(take);
      }
    });
    for (size_t i = 0; i < h.size(); ++i) digests[k + i] = h[i].digest().hex();
    k = last + 1;
  }
  return digests;
}

// What a killed run finished: progress.jsonl, one line per shard, kept when its shard file is
// whole and the text it was made of is the piece's now. Fills `results` and returns which units
// are done.
std::vector<bool> finished_units(const fs::path& out, const std::vector<Unit>& units, int bytes,
                                 std::vector<ShardResult>& results) {
  std::map<std::string, ShardResult> done;
  const fs::path journal = out / "progress.jsonl";
  std::ifstream in(journal);
  int64_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;  // a line cut by the kill
    // A field of the wrong type is named with its line, not as nlohmann's type_error (56.16).
    auto bad = [&](const char* key, const char* want) {
      return DataError(fmt::format(
          "{}:{}: '{}': expected {} (the journal of an earlier run; remove it to tokenize every "
          "piece again)",
          journal.string(), number, key, want));
    };
    if (!j.is_object()) throw bad("(record)", "a JSON object");
    if (!j.contains("key") || !j["key"].is_string()) throw bad("key", "a string");
    if (!j.contains("tokens") || !j["tokens"].is_number_integer() || j["tokens"].get<int64_t>() < 0)
      throw bad("tokens", "a whole number of 0 or more");
    if (!j.contains("sha256") || !j["sha256"].is_string() ||
        j["sha256"].get<std::string>().size() != 64)
      throw bad("sha256", "64 hex digits");
    if (j.contains("max_token") && !j["max_token"].is_number_integer())
      throw bad("max_token", "a whole number");
    if (j.contains("text_digest") &&
        (!j["text_digest"].is_string() || j["text_digest"].get<std::string>().size() != 32))
      throw bad("text_digest", "32 hex digits");
    done[j["key"].get<std::string>()] =
        ShardResult{j["tokens"].get<int64_t>(), j.value("max_token", int64_t(-1)),
                    j["sha256"].get<std::string>(), j.value("text_digest", std::string())};
  }
  std::vector<size_t> candidates;
  for (size_t i = 0; i < units.size(); ++i) {
    const auto it = done.find(units[i].key);
    std::error_code ec;
    const fs::path shard = out / shard_name(i);
    if (it == done.end() || it->second.text_digest.empty() ||
        fs::file_size(shard, ec) != uint64_t(it->second.tokens * bytes))
      continue;
    // A shard damaged in place keeps its size: its SHA-256 decides (issue 56.17), else every
    // rerun kept it and training refused it for ever.
    if (util::sha256_file(shard) != it->second.sha256) continue;
    results[i] = it->second;
    candidates.push_back(i);
  }
  // An input rewritten since (same size and time, or in place): its text decides (issue 66.3).
  const std::vector<std::string> digests = text_digests(units, candidates);
  std::vector<bool> skip(units.size(), false);
  for (size_t k = 0; k < candidates.size(); ++k) {
    const size_t i = candidates[k];
    if (digests[k] == results[i].text_digest)
      skip[i] = true;
    else
      results[i] = ShardResult{};
  }
  return skip;
}

// Lines into documents (TokenizeOptions::documents), each encoded as SentencePiece encodes its
// whole text. When the model turns newlines into collapsing spaces (whitespace_split()), a
// document's encoding is its lines' encodings one after the other (the word cache's split, exact
// by the same argument), so lines are encoded as they come; else a document is gathered, its
// lines joined by "\n", and encoded as one text (at most max_bytes; through the word cache's
// segments when the model keeps newlines, WordCacheEncoder). A file of `--documents files` held
// whole does not come here (tokenize_unit).
class Documents {
 public:
  Documents(const std::string& mode, detail::WordCacheEncoder& tok, int64_t max_bytes)
      : mode_(mode), tok_(tok), streamed_(tok.newline_separates()), max_bytes_(max_bytes) {}
  // Line `l`: ids to emit (then true when they end a document), or nullopt when nothing to emit.
  std::optional<bool> add(std::string_view l, std::vector<int32_t>& ids, const std::string& where) {
    if (mode_ == "lines") {
      tok_.encode_into(l, ids);
      return true;
    }
    if (mode_ == "paragraphs" && l.find_first_not_of(" \t\r\f\v") == std::string_view::npos)
      return finish(ids) ? std::optional<bool>(true) : std::nullopt;
    open_ = true;
    if (streamed_) {
      tok_.encode_into(l, ids);
      return false;
    }
    if (!text_.empty()) text_ += '\n';
    text_ += l;
    if (int64_t(text_.size()) > max_bytes_)
      throw DataError(fmt::format(
          "{}: a document of more than {} bytes, over --max-line-bytes (this tokenizer keeps "
          "newlines: a document is held whole); use --documents paragraphs or lines, or "
          "raise --max-line-bytes",
          where, max_bytes_));
    return std::nullopt;
  }
  // The end of the input: true with the last document's remaining ids, if one is open.
  bool finish(std::vector<int32_t>& ids) {
    if (!open_) return false;
    open_ = false;
    if (streamed_) {
      ids.clear();
    } else {
      tok_.encode_into(text_, ids);
      text_.clear();
    }
    return true;
  }

 private:
  const std::string mode_;
  detail::WordCacheEncoder& tok_;
  const bool streamed_;
  const int64_t max_bytes_;
  bool open_ = false;
  std::string text_;
};

// Whether `--documents files` holds a file whole: unless the model collapses newlines and CRs as
// spaces, where its lines one after the other (without "\r\n") encode as the whole text does.
bool files_held_whole(const detail::SentencePieceTokenizer& tok,
                      const detail::WordCacheEncoder& encoder) {
  return !(encoder.newline_separates() && tok.whitespace_split().find('\r') != std::string::npos);
}

// One unit into its shard, written atomically with its SHA-256 (and the digest of its text, for a
// resume): read from its input, or from `text` (a streamed piece). With `whole_files` a plain
// input's piece under `--documents files` (the whole file) is one document, its text exactly
// (issue 66.11: its leading blank lines, final newline and CRs were dropped). `tokens_done` and
// `bytes_done` count as it goes; `before_publish` runs before the shard replaces the file.
ShardResult tokenize_unit(const TokenizeOptions& o, const Unit& u, const std::string* text,
                          size_t index, detail::WordCacheEncoder& tok, bool whole_files,
                          int32_t eos, int bytes, const fs::path& out,
                          std::atomic<int64_t>& tokens_done, std::atomic<int64_t>& bytes_done,
                          const std::function<void()>& before_publish) {
  const std::string field = text_field(o, u.path);
  const bool whole = whole_files && field.empty() && o.documents == "files";
  util::AtomicFile file(out / shard_name(index));
  ShardResult r;
  std::vector<char> buf;
  std::vector<int32_t> ids;  // reused line after line
  auto put = [&](const int32_t* p, size_t n) {
    const size_t at = buf.size();
    buf.resize(at + n * size_t(bytes));
    char* out = buf.data() + at;
    for (size_t k = 0; k < n; ++k) {
      r.max_token = std::max<int64_t>(r.max_token, p[k]);
      const uint32_t v = uint32_t(p[k]);
      std::memcpy(out + k * size_t(bytes), &v, size_t(bytes));  // little-endian: the low bytes
    }
    r.tokens += int64_t(n);
  };
  Documents docs(field.empty() ? o.documents : "lines", tok, o.max_line_bytes);
  const auto emit = [&](bool end_of_document) {
    const int64_t before = r.tokens;
    put(ids.data(), ids.size());
    if (end_of_document && eos >= 0) put(&eos, 1);
    tokens_done += r.tokens - before;
    if (buf.size() >= (size_t(1) << 22)) {
      file.append(buf.data(), buf.size());
      buf.clear();
    }
  };
  const LineFn line = [&](std::string_view l, int64_t n) {
    std::string storage;
    const std::string_view t = text_of(u, l, n, field, storage);
    if (const size_t bad = util::find_invalid_utf8(t); bad != std::string_view::npos)
      throw DataError(fmt::format("{}: invalid UTF-8 at byte {} of the line", where(u, n), bad));
    if (const auto done = docs.add(t, ids, where(u, n))) emit(*done);
  };
  LineSplitter lines(
      u.begin > 0 ? fmt::format("{} (from byte {})", u.path.string(), u.begin) : u.path.string(),
      o.max_line_bytes, line);
  detail::Hasher text_hash;
  std::string document;  // whole: the file
  const auto feed = [&](const char* data, size_t n) {
    text_hash.bytes(data, n);
    bytes_done += int64_t(n);
    if (!whole) return lines.feed(data, n);
    document.append(data, n);
    if (int64_t(document.size()) > o.max_line_bytes)
      throw DataError(fmt::format(
          "{}: a document of more than {} bytes, over --max-line-bytes (with --documents files "
          "and this tokenizer, a file is held whole); use --documents paragraphs or lines, or "
          "raise --max-line-bytes",
          u.path.string(), o.max_line_bytes));
  };
  if (!text) {
    read_text(u.path, u.begin, u.end, feed);
  } else {
    for (size_t at = 0; at < text->size(); at += size_t(1) << 20)
      feed(text->data() + at, std::min(text->size() - at, size_t(1) << 20));
  }
  if (!whole) {
    lines.finish();
    if (docs.finish(ids)) emit(true);
  } else if (!document.empty()) {
    if (const size_t bad = util::find_invalid_utf8(document); bad != std::string::npos) {
      const size_t line_start = bad == 0 ? 0 : document.rfind('\n', bad - 1) + 1;  // npos + 1: 0
      throw DataError(fmt::format(
          "{}: invalid UTF-8 at byte {} of the line",
          where(u, 1 + std::count(document.begin(), document.begin() + int64_t(bad), '\n')),
          bad - line_start));
    }
    tok.encode_into(document, ids);
    emit(true);
  }
  file.append(buf.data(), buf.size());
  r.sha256 = file.finish();
  before_publish();
  file.publish();
  r.text_digest = text_hash.digest().hex();
  return r;
}

// Who reads which piece: a compressed input cut into several pieces is read by one reader thread,
// decompressed once, each piece's text handed to a worker (at most `capacity` waiting); any other
// piece is read by the worker that takes it.
class PieceQueue {
 public:
  using Piece = std::pair<size_t, std::shared_ptr<const std::string>>;  // unit, text (or null)
  PieceQueue(std::vector<size_t> direct, size_t capacity, int readers)
      : direct_(std::move(direct)), capacity_(capacity), readers_(readers) {}
  // A worker's next piece; none when every piece is taken or after fail().
  std::optional<Piece> take() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock,
             [&] { return failed_ || !ready_.empty() || next_ < direct_.size() || readers_ == 0; });
    if (failed_) return std::nullopt;
    if (!ready_.empty()) {
      Piece p = std::move(ready_.front());
      ready_.pop_front();
      cv_.notify_all();
      return p;
    }
    if (next_ < direct_.size()) return Piece{direct_[next_++], nullptr};
    return std::nullopt;
  }
  // A reader's piece; false after fail().
  bool put(size_t unit, std::shared_ptr<const std::string> text) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return failed_ || ready_.size() < capacity_; });
    if (failed_) return false;
    ready_.emplace_back(unit, std::move(text));
    cv_.notify_all();
    return true;
  }
  void reader_done() {
    std::lock_guard<std::mutex> lock(mutex_);
    --readers_;
    cv_.notify_all();
  }
  void fail() {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Piece> ready_;
  std::vector<size_t> direct_;
  size_t next_ = 0, capacity_;
  int readers_;
  bool failed_ = false;
};

// Decompresses one compressed input and hands its streamed pieces (`group`: their units, in
// order) to the queue; a piece finished by an earlier run is skipped. False when the queue failed.
bool read_streamed_input(const std::vector<Unit>& units, const std::vector<size_t>& group,
                         const std::vector<bool>& skip, PieceQueue& queue) {
  const fs::path& path = units[group.front()].path;
  size_t k = 0;  // the piece being filled
  auto text = std::make_shared<std::string>();
  int64_t at = 0;
  struct Stop {};
  try {
    decompress(path, [&](const char* data, size_t n) {
      for (size_t used = 0; used < n && k < group.size();) {
        const Unit& u = units[group[k]];
        const size_t take = size_t(std::min<int64_t>(int64_t(n - used), u.end - at));
        if (!skip[group[k]]) text->append(data + used, take);
        used += take;
        at += int64_t(take);
        if (at == u.end) {
          if (!skip[group[k]] && !queue.put(group[k], std::move(text))) throw Stop{};
          text = std::make_shared<std::string>();
          ++k;
        }
      }
    });
  } catch (const Stop&) {
    return false;
  }
  if (k != group.size())
    throw DataError(fmt::format("{}: its text ended at byte {}, not {} (changed while tokenizing?)",
                                path.string(), at, units[group.back()].end));
  return true;
}

}  // namespace

namespace {

// What the workers and readers share while the pieces are tokenized.
struct Progress {
  std::atomic<int64_t> tokens{0}, units{0}, bytes{0};
  std::atomic<uint64_t> words_cached{0}, words_encoded{0}, whole_lines{0};
  std::mutex mutex;  // the journal and the first failure
  std::exception_ptr failure;
  std::once_flag old_set_removed;  // before the first shard this run writes (invalidate_old_set)
  void fail(PieceQueue& queue) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure) failure = std::current_exception();
    queue.fail();
  }
};

// The folder's shards.json goes before the first shard of this run replaces one of its shards: a
// rerun that fails or is killed later leaves no shards.json (training refuses the folder at once)
// rather than one whose shards are partly another run's. A rerun that fails before writing a shard
// leaves the old folder whole.
void invalidate_old_set(const fs::path& out) {
  std::error_code ec;
  if (fs::remove(out / "shards.json", ec)) util::sync_directory(out);
}

// The progress line: pieces, text bytes (and %), tokens, speed, time left.
void print_progress(std::ostream& log, bool tty, const Progress& p, size_t units, int64_t total,
                    int64_t resumed_bytes, double seconds) {
  const int64_t read = p.bytes + resumed_bytes;
  const double left_s = p.bytes > 0 ? seconds * double(total - read) / double(p.bytes) : -1;
  fmt::print(
      log,
      "{}tokenize: {}/{} pieces, {} of {} ({:.0f} %), {:.1f} M tokens, {:.2f} M tokens/s, {}{}",
      tty ? "\r" : "", p.units.load(), units, bytes_text(read), bytes_text(total),
      100.0 * double(read) / double(std::max<int64_t>(total, 1)), double(p.tokens) / 1e6,
      double(p.tokens) / 1e6 / std::max(seconds, 1e-9),
      left_s < 0 ? std::string("time left unknown yet")
                 : fmt::format("~{}:{:02d} left", int64_t(left_s) / 60, int64_t(left_s) % 60),
      tty ? "" : "\n");
  log.flush();
}

// Tokenizes every unit not in `skip` into its shard over o.jobs workers (and a reader per
// compressed input cut in several pieces, at most o.jobs at once), appending to progress.jsonl as
// each finishes; prints progress; rethrows the first failure.
void tokenize_units(const TokenizeOptions& o, const detail::SentencePieceTokenizer& tok, int bytes,
                    const std::vector<Unit>& units, const std::vector<bool>& skip,
                    std::vector<ShardResult>& results, Progress& p, std::ostream& log, bool tty) {
  const fs::path out(o.out);
  std::vector<size_t> direct;
  std::vector<std::vector<size_t>> streamed;  // per compressed input cut in several
  int64_t total = 0, resumed_bytes = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    total += units[i].bytes();
    if (skip[i]) resumed_bytes += units[i].bytes();
    if (!units[i].streamed) {
      if (!skip[i]) direct.push_back(i);
    } else if (i == 0 || !units[i - 1].streamed || units[i - 1].path != units[i].path) {
      streamed.push_back({i});
    } else {
      streamed.back().push_back(i);
    }
  }
  const int readers = std::min<int>(o.jobs, int(streamed.size()));
  PieceQueue queue(std::move(direct), 2, readers);
  std::atomic<size_t> next_input{0};
  auto reader = [&] {
    try {
      for (size_t g; (g = next_input++) < streamed.size();)
        if (!read_streamed_input(units, streamed[g], skip, queue)) break;
    } catch (...) {
      p.fail(queue);
    }
    queue.reader_done();
  };
  auto worker = [&] {
    detail::WordCacheEncoder encoder(tok, o.word_cache);  // its cache serves all its pieces
    const bool whole_files = files_held_whole(tok, encoder);
    while (const auto piece = queue.take()) {
      const size_t i = piece->first;
      try {
        results[i] = tokenize_unit(
            o, units[i], piece->second.get(), i, encoder, whole_files, tok.eos_id(), bytes, out,
            p.tokens, p.bytes, [&] { std::call_once(p.old_set_removed, invalidate_old_set, out); });
        std::lock_guard<std::mutex> lock(p.mutex);
        std::ofstream(out / "progress.jsonl", std::ios::app)
            << json{{"key", units[i].key},
                    {"tokens", results[i].tokens},
                    {"sha256", results[i].sha256},
                    {"max_token", results[i].max_token},
                    {"text_digest", results[i].text_digest}}
                   .dump()
            << "\n";
        ++p.units;
      } catch (...) {
        p.fail(queue);  // the others stop after their piece
      }
    }
    p.words_cached += encoder.words_cached();  // every error was caught above: always reached
    p.words_encoded += encoder.words_encoded();
    p.whole_lines += encoder.whole_lines();
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int j = 0; j < readers; ++j) threads.emplace_back(reader);
  for (int j = 0; j < o.jobs; ++j) threads.emplace_back(worker);
  // The progress line: rewritten on a terminal, every 10 s otherwise.
  auto last = t0;
  while (p.units < int64_t(units.size())) {
    {
      std::lock_guard<std::mutex> lock(p.mutex);
      if (p.failure) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::milliseconds(tty ? 500 : 10000)) continue;
    last = now;
    print_progress(log, tty, p, units.size(), total, resumed_bytes,
                   std::chrono::duration<double>(now - t0).count());
  }
  for (auto& t : threads) t.join();
  if (tty) fmt::print(log, "\n");
  if (p.failure) std::rethrow_exception(p.failure);
}

// One file given twice, by two names or through a link, would be tokenized twice: its text twice
// in the training data, silently (issue 66, E). Also: each input is a regular file.
void check_distinct_inputs(const std::vector<std::string>& inputs) {
  std::map<std::pair<dev_t, ino_t>, size_t> seen;
  for (size_t i = 0; i < inputs.size(); ++i) {
    struct stat st {};
    if (::stat(inputs[i].c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      throw DataError(fmt::format("{}: not a readable file", inputs[i]));
    const auto [first, fresh] = seen.emplace(std::make_pair(st.st_dev, st.st_ino), i);
    if (!fresh)
      throw DataError(fmt::format(
          "inputs {} '{}' and {} '{}' are the same file (device {}, inode {}): its text would be "
          "tokenized twice; give it once",
          first->second + 1, inputs[first->second], i + 1, inputs[i], st.st_dev, st.st_ino));
  }
}

// One `data tokenize` per --out at a time: two runs with other options into one folder both ended
// well, leaving one run's shards.json over the other's shards (issue 66, B). Refused at once, as a
// second sweep driver is; the kernel drops the lock of a killed run.
util::FileLock lock_out(const fs::path& out) {
  int holder = 0;
  auto lock = util::FileLock::try_acquire(out / "tokenize.lock", &holder);
  if (!lock)
    throw TokenizeBusyError(
        fmt::format("{}: another `normlab data tokenize` (pid {}) is writing into this folder (it "
                    "holds tokenize.lock); wait for it or choose another --out",
                    out.string(), holder));
  return std::move(*lock);
}

// What killed runs left in --out: the temporaries (AtomicFile's NAME.tmp.PID.N) of this command's
// own files (issue 66, C). Only the holder of tokenize.lock writes them, so with the lock held
// every one of another pid is stale, even when that pid lives again as another process.
void remove_stale_tokenize_temporaries(const fs::path& out) {
  static const std::regex ours(
      R"((shard_\d{5,}\.bin|shards\.json|tokenizer\.model)\.tmp\.(\d+)\.\d+)");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, ours) || std::stol(m[2].str()) == long(::getpid())) continue;
    std::error_code rm;
    fs::remove(e.path(), rm);
  }
}

// shards.json and the tokenizer beside it change together (issue 66, A: a failed rerun with another
// --model swapped tokenizer.model before tokenizing and left the old shards and shards.json, every
// SHA-256 still right, so training took the old tokens with the new tokenizer). The tokenizer is
// written only now, after every shard; when it changes, the old shards.json goes first (if the
// first new shard has not removed it: invalidate_old_set), so a kill at any point leaves either
// the old folder whole, or no shards.json (refused: tokenize again), or the new one. shards.json
// records the tokenizer's SHA-256, which loading checks.
void publish_shard_set(const fs::path& out, const std::string& model, const ShardSet& set,
                       size_t shards) {
  std::error_code ec;
  bool same = false;
  try {
    same = fs::is_regular_file(out / "tokenizer.model", ec) &&
           util::sha256_file(out / "tokenizer.model") == set.tokenizer_sha256;
  } catch (const util::FileError&) {
  }
  if (!same) {
    if (fs::remove(out / "shards.json", ec)) util::sync_directory(out);
    util::write_file_atomically(out / "tokenizer.model", model);
  }
  // Shards of an earlier corpus tokenized into this folder, beyond this one's: a glob over the
  // folder would take them (the folder is normlab's own: claimed). Gone before the new shards.json.
  for (size_t i = shards;; ++i)
    if (!fs::remove(out / shard_name(i), ec)) break;
  util::write_file_atomically(out / "shards.json", shard_set_json(set));
}

}  // namespace

int64_t tokenize_to_shards(const TokenizeOptions& o, std::ostream& log, bool tty) {
  if (o.inputs.empty()) throw DataError("tokenize: no input files");
  if (o.jobs < 1) throw DataError(fmt::format("--jobs: expected at least 1, got {}", o.jobs));
  const fs::path out(o.out);
  check_distinct_inputs(o.inputs);
  util::claim_directory(out, "shards", "--out");
  const util::FileLock lock = lock_out(out);
  remove_stale_tokenize_temporaries(out);
  const auto tok = obtain_tokenizer(o, detail::resolve_cache_dir(o.cache_dir), log);
  const int64_t vocab = tok->vocab_size();
  const int bytes = vocab <= 65536 ? 2 : 4;

  const std::vector<Unit> units = plan_units(o, tok->digest().hex(), log);
  std::vector<ShardResult> results(units.size());
  const std::vector<bool> skip = finished_units(out, units, bytes, results);
  const int64_t resumed = std::count(skip.begin(), skip.end(), true);
  if (resumed)
    fmt::print(log, "tokenize: {} of {} shards done by an earlier run, kept\n", resumed,
               units.size());
  Progress p;
  p.units = resumed;
  const auto t0 = std::chrono::steady_clock::now();
  tokenize_units(o, *tok, bytes, units, skip, results, p, log, tty);

  ShardSet set;
  set.bytes_per_token = bytes;
  set.vocab_size = vocab;
  set.eos_id = tok->eos_id();
  set.tokenizer = "tokenizer.model";
  util::Sha256 model_sha256;
  model_sha256.update(tok->model_bytes().data(), tok->model_bytes().size());
  set.tokenizer_sha256 = model_sha256.hex();
  int64_t total = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    set.shards.push_back(
        {shard_name(i), results[i].tokens, results[i].sha256, results[i].max_token});
    total += results[i].tokens;
  }
  publish_shard_set(out, tok->model_bytes(), set, units.size());
  const uint64_t words = p.words_cached + p.words_encoded;
  if (!o.word_cache)
    fmt::print(log, "tokenize: every line encoded whole (--no-word-cache)\n");
  else if (!tok->word_split_refusal().empty())
    fmt::print(log, "tokenize: every line encoded whole (this model: {}; no word cache)\n",
               tok->word_split_refusal());
  else
    fmt::print(log, "tokenize: word cache: {:.1f} % of {} words found, {} lines encoded whole\n",
               words ? 100.0 * double(p.words_cached) / double(words) : 0.0, words,
               p.whole_lines.load());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(log,
             "tokenize: {} tokens in {} shards ({}: vocab {}, eos {}) in {:.1f} s, {:.2f} M "
             "tokens/s on {} job(s); train with data.format = \"normlab\", data.train = \"{}\"\n",
             total, units.size(), (out / "shards.json").string(), vocab, tok->eos_id(), s,
             double(p.tokens) / 1e6 / std::max(s, 1e-9), o.jobs, (out / "shard_*.bin").string());
  return total;
}

std::vector<std::string> tokenizer_sample(const TokenizeOptions& opts, std::ostream& log) {
  return sample_lines_for_tokenizer(opts, log);
}

}  // namespace normlab::data
