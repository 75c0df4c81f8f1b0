#include "tokenize_corpus.h"

#include <archive.h>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <thread>

#include "internal.h"
#include "token_shards.h"
#include "util/atomic_file.h"
#include "util/owned_dir.h"
#include "util/utf8.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab::data {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool compressed(const fs::path& p) {
  const std::string s = p.string();
  return ends_with(s, ".gz") || ends_with(s, ".zst");
}

bool is_jsonl(const fs::path& p) {
  std::string s = p.string();
  for (const char* z : {".gz", ".zst"})
    if (ends_with(s, z)) s.resize(s.size() - std::string(z).size());
  return ends_with(s, ".jsonl") || ends_with(s, ".json");
}

// One piece of work: an input file, or a byte range of a plain one starting at a line.
struct Unit {
  fs::path path;
  int64_t begin = 0, end = -1;  // bytes; end -1: to the end (compressed files: whole)
  std::string key;              // what the shard depends on (for a resume)
  int64_t size_bytes() const {  // what reading it consumes (compressed: the file's bytes)
    std::error_code ec;
    return end >= 0 ? end - begin : int64_t(fs::file_size(path, ec)) - begin;
  }
};

std::string bytes_text(int64_t b) {
  return b >= (int64_t(1) << 30) ? fmt::format("{:.2f} GB", double(b) / 1e9)
                                 : fmt::format("{:.0f} MB", double(b) / 1e6);
}

// The lines of a unit, in order: plain bytes read in blocks, .gz/.zst through libarchive's raw
// format (zlib and libzstd: no external programs).
// A line longer than `max_line_bytes` is refused as soon as it is seen: SentencePiece needs ~100
// bytes per byte of a line, so one 20 MB line took 2.6 GiB (issue 56.11).
// `bytes_read` (optional) counts the input bytes consumed: of a compressed file, its compressed
// ones.
template <class F>
void for_each_line(const Unit& u, int64_t max_line_bytes, F&& line,
                   std::atomic<int64_t>* bytes_read = nullptr) {
  std::string pending;
  int64_t number = 0;
  auto too_long = [&](int64_t bytes, bool whole) {
    return DataError(fmt::format(
        "{}:{}: a line of {}{} bytes, over --max-line-bytes {} (tokenizing it would take ~{} MiB); "
        "split the text into lines, or raise --max-line-bytes",
        u.path.string(), number + 1, whole ? "" : "more than ", bytes, max_line_bytes,
        bytes / 10000));
  };
  auto feed = [&](const char* data, size_t n) {
    pending.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view l(pending.data() + start, nl - start);
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      if (int64_t(l.size()) > max_line_bytes) throw too_long(int64_t(l.size()), true);
      line(l, ++number);
    }
    pending.erase(0, start);
    if (int64_t(pending.size()) > max_line_bytes + 1)
      throw too_long(int64_t(pending.size()), false);
  };
  if (!compressed(u.path)) {
    std::ifstream in(u.path, std::ios::binary);
    if (!in) throw DataError(fmt::format("{}: cannot be read", u.path.string()));
    in.seekg(u.begin);
    std::vector<char> buf(size_t(1) << 20);
    int64_t left = u.end < 0 ? INT64_MAX : u.end - u.begin;
    while (left > 0 && in) {
      in.read(buf.data(), std::streamsize(std::min<int64_t>(left, int64_t(buf.size()))));
      const auto got = in.gcount();
      if (got <= 0) break;
      feed(buf.data(), size_t(got));
      left -= got;
      if (bytes_read) *bytes_read += got;
    }
  } else {
    struct archive* a = archive_read_new();
    archive_read_support_filter_gzip(a);
    archive_read_support_filter_zstd(a);
    archive_read_support_format_raw(a);
    struct archive_entry* entry = nullptr;
    if (archive_read_open_filename(a, u.path.c_str(), 1 << 16) != ARCHIVE_OK ||
        archive_read_next_header(a, &entry) != ARCHIVE_OK) {
      const std::string why = archive_error_string(a) ? archive_error_string(a) : "unreadable";
      archive_read_free(a);
      throw DataError(fmt::format("{}: cannot be read ({})", u.path.string(), why));
    }
    std::vector<char> buf(size_t(1) << 20);
    la_ssize_t n;
    bool first = true;
    int64_t raw_counted = 0;
    while ((n = archive_read_data(a, buf.data(), buf.size())) > 0) {
      // A .tar.gz would be tokenized with its tar headers: "ustar" at byte 257 (POSIX tar).
      if (first && n >= 262 && std::memcmp(buf.data() + 257, "ustar", 5) == 0) {
        archive_read_free(a);
        throw DataError(
            fmt::format("{}: a tar archive, not text: unpack it (tar -xf) and tokenize "
                        "its files",
                        u.path.string()));
      }
      first = false;
      feed(buf.data(), size_t(n));
      if (bytes_read) {
        const int64_t raw = archive_filter_bytes(a, -1);  // compressed bytes read so far
        *bytes_read += raw - raw_counted;
        raw_counted = raw;
      }
    }
    const std::string why = n < 0 && archive_error_string(a) ? archive_error_string(a) : "";
    archive_read_free(a);
    if (n < 0) throw DataError(fmt::format("{}: truncated or corrupt ({})", u.path.string(), why));
  }
  if (!pending.empty()) {
    if (int64_t(pending.size()) > max_line_bytes) throw too_long(int64_t(pending.size()), true);
    line(std::string_view(pending), ++number);
  }
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

std::vector<Unit> plan_units(const TokenizeOptions& o, const std::string& tokenizer_digest) {
  std::vector<Unit> units;
  for (const std::string& input : o.inputs) {
    const fs::path p(input);
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) throw DataError(fmt::format("{}: not a readable file", input));
    const int64_t size = int64_t(fs::file_size(p));
    const auto mtime = fs::last_write_time(p).time_since_epoch().count();
    std::vector<std::pair<int64_t, int64_t>> ranges;
    if (compressed(p) || size <= o.piece_bytes) {
      ranges.emplace_back(0, -1);
    } else {  // cut at the first line start after every piece_bytes
      std::ifstream in(p, std::ios::binary);
      int64_t begin = 0;
      while (begin < size) {
        int64_t end = std::min(size, begin + o.piece_bytes);
        if (end < size) {
          in.seekg(end);
          char c;
          while (in.get(c) && c != '\n') ++end;
          end = std::min(size, end + 1);
        }
        ranges.emplace_back(begin, end);
        begin = end;
      }
    }
    for (const auto& [b, e] : ranges) {
      Unit u{p, b, e, ""};
      u.key = detail::hash_bytes(fmt::format("{}|{}|{}|{}|{}|{}|{}", fs::absolute(p).string(), size,
                                             mtime, b, e, o.jsonl_field, tokenizer_digest))
                  .hex();
      units.push_back(u);
    }
  }
  return units;
}

struct ShardResult {
  int64_t tokens = 0, max_token = -1;
  std::string sha256;
};

std::string shard_name(size_t i) { return fmt::format("shard_{:05d}.bin", i); }

// The JSONL field to read, "" for plain text.
std::string text_field(const TokenizeOptions& o, const fs::path& input) {
  if (!o.jsonl_field.empty()) return o.jsonl_field;
  return is_jsonl(input) ? "text" : "";
}

// The tokenizer's training sample: a uniform random sample of `sample_lines` non-empty lines (JSONL
// records) over all inputs, seeded (reservoir sampling, Algorithm R): the first lines of the first
// file gave a tokenizer of C headers for a corpus of prose and code (issue 59.1). A JSONL record is
// parsed only when it enters the sample. Says what it sampled.
std::vector<std::string> sample_lines_for_tokenizer(const TokenizeOptions& o, std::ostream& log) {
  std::vector<std::string> sample;
  std::vector<size_t> origin;  // which input each kept line came from
  std::mt19937_64 rng(detail::mix_seed(o.sample_seed, 0x746f6b73616d706cULL));
  int64_t seen = 0;
  std::vector<int64_t> lines_of(o.inputs.size(), 0);
  for (size_t i = 0; i < o.inputs.size(); ++i) {
    const Unit u{o.inputs[i], 0, -1, ""};
    const std::string field = text_field(o, u.path);
    for_each_line(u, o.max_line_bytes, [&](std::string_view l, int64_t n) {
      if (l.empty()) return;
      ++lines_of[i];
      const int64_t slot =
          seen < o.sample_lines ? seen : int64_t(detail::uniform_below(rng, uint64_t(seen) + 1));
      ++seen;
      if (slot >= o.sample_lines) return;
      std::string storage;
      const std::string_view t = text_of(u, l, n, field, storage);
      if (t.empty()) return;
      if (slot == int64_t(sample.size())) {
        sample.emplace_back(t);
        origin.push_back(i);
      } else if (slot < int64_t(sample.size())) {
        sample[size_t(slot)].assign(t);
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
  return detail::obtain_sentencepiece(
             cfg, h.digest(), [&] { return text; }, cache, "tokenize", log)
      .tokenizer;
}

// What a killed run finished: progress.jsonl, one line per shard, kept when its shard file is
// whole. Fills `results` and returns which units are done.
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
    done[j["key"].get<std::string>()] =
        ShardResult{j["tokens"].get<int64_t>(), j.value("max_token", int64_t(-1)),
                    j["sha256"].get<std::string>()};
  }
  std::vector<bool> skip(units.size(), false);
  for (size_t i = 0; i < units.size(); ++i) {
    const auto it = done.find(units[i].key);
    std::error_code ec;
    const fs::path shard = out / shard_name(i);
    if (it == done.end() || fs::file_size(shard, ec) != uint64_t(it->second.tokens * bytes))
      continue;
    // A shard damaged in place keeps its size: its SHA-256 decides (issue 56.17), else every
    // rerun kept it and training refused it for ever.
    if (util::sha256_file(shard) != it->second.sha256) continue;
    results[i] = it->second;
    skip[i] = true;
  }
  return skip;
}

// One unit into its shard, written atomically with its SHA-256; `tokens_done` counts as it goes.
ShardResult tokenize_unit(const TokenizeOptions& o, const Unit& u, size_t index,
                          detail::WordCacheEncoder& tok, int32_t eos, int bytes,
                          const fs::path& out, std::atomic<int64_t>& tokens_done,
                          std::atomic<int64_t>& bytes_done) {
  const std::string field = text_field(o, u.path);
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
  for_each_line(
      u, o.max_line_bytes,
      [&](std::string_view l, int64_t n) {
        std::string storage;
        const std::string_view t = text_of(u, l, n, field, storage);
        if (const size_t bad = util::find_invalid_utf8(t); bad != std::string_view::npos)
          throw DataError(
              fmt::format("{}: invalid UTF-8 at byte {} of the line", where(u, n), bad));
        const int64_t before = r.tokens;
        tok.encode_into(t, ids);
        put(ids.data(), ids.size());
        if (eos >= 0) put(&eos, 1);
        tokens_done += r.tokens - before;
        if (buf.size() >= (size_t(1) << 22)) {
          file.append(buf.data(), buf.size());
          buf.clear();
        }
      },
      &bytes_done);
  file.append(buf.data(), buf.size());
  r.sha256 = file.commit();
  return r;
}

}  // namespace

int64_t tokenize_to_shards(const TokenizeOptions& o, std::ostream& log, bool tty) {
  if (o.inputs.empty()) throw DataError("tokenize: no input files");
  if (o.jobs < 1) throw DataError(fmt::format("--jobs: expected at least 1, got {}", o.jobs));
  const fs::path out(o.out);
  util::claim_directory(out, "shards", "--out");
  const auto tok = obtain_tokenizer(o, detail::resolve_cache_dir(o.cache_dir), log);
  util::write_file_atomically(out / "tokenizer.model", tok->model_bytes());
  const int64_t vocab = tok->vocab_size();
  const int bytes = vocab <= 65536 ? 2 : 4;

  const std::vector<Unit> units = plan_units(o, tok->digest().hex());
  std::vector<ShardResult> results(units.size());
  const std::vector<bool> skip = finished_units(out, units, bytes, results);
  const int64_t resumed = std::count(skip.begin(), skip.end(), true);
  if (resumed)
    fmt::print(log, "tokenize: {} of {} shards done by an earlier run, kept\n", resumed,
               units.size());

  // Progress in input bytes (compressed files: their compressed bytes), finished pieces counted.
  int64_t total_bytes = 0, resumed_bytes = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const int64_t b = units[i].size_bytes();
    total_bytes += b;
    if (skip[i]) resumed_bytes += b;
  }
  std::atomic<size_t> next{0};
  std::atomic<int64_t> tokens_done{0}, units_done{resumed}, bytes_done{0};
  std::mutex mutex;  // the journal and the first failure
  std::exception_ptr failure;
  std::atomic<uint64_t> words_cached{0}, words_encoded{0}, whole_lines{0};
  auto worker = [&] {
    detail::WordCacheEncoder encoder(*tok, o.word_cache);  // its cache serves all its pieces
    for (size_t i; (i = next++) < units.size();) {
      if (skip[i]) continue;
      try {
        results[i] = tokenize_unit(o, units[i], i, encoder, tok->eos_id(), bytes, out, tokens_done,
                                   bytes_done);
        std::lock_guard<std::mutex> lock(mutex);
        std::ofstream(out / "progress.jsonl", std::ios::app)
            << json{{"key", units[i].key},
                    {"tokens", results[i].tokens},
                    {"sha256", results[i].sha256},
                    {"max_token", results[i].max_token}}
                   .dump()
            << "\n";
        ++units_done;
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
        next = units.size();  // the others stop after their piece
      }
    }
    words_cached += encoder.words_cached();  // every error was caught above: always reached
    words_encoded += encoder.words_encoded();
    whole_lines += encoder.whole_lines();
  };

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int j = 0; j < o.jobs; ++j) threads.emplace_back(worker);
  // The progress line: rewritten on a terminal, every 10 s otherwise.
  auto last = t0;
  while (units_done < int64_t(units.size())) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (failure) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::milliseconds(tty ? 500 : 10000)) continue;
    last = now;
    const double s = std::chrono::duration<double>(now - t0).count();
    const int64_t read = bytes_done + resumed_bytes;
    const double left_s = bytes_done > 0 ? s * double(total_bytes - read) / double(bytes_done) : -1;
    fmt::print(
        log,
        "{}tokenize: {}/{} pieces, {} of {} ({:.0f} %), {:.1f} M tokens, {:.2f} M tokens/s, {}{}",
        tty ? "\r" : "", units_done.load(), units.size(), bytes_text(read), bytes_text(total_bytes),
        100.0 * double(read) / double(std::max<int64_t>(total_bytes, 1)), double(tokens_done) / 1e6,
        double(tokens_done) / 1e6 / std::max(s, 1e-9),
        left_s < 0 ? std::string("time left unknown yet")
                   : fmt::format("~{}:{:02d} left", int64_t(left_s) / 60, int64_t(left_s) % 60),
        tty ? "" : "\n");
    log.flush();
  }
  for (auto& t : threads) t.join();
  if (tty) fmt::print(log, "\n");
  if (failure) std::rethrow_exception(failure);

  ShardSet set;
  set.bytes_per_token = bytes;
  set.vocab_size = vocab;
  set.eos_id = tok->eos_id();
  set.tokenizer = "tokenizer.model";
  int64_t total = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    set.shards.push_back(
        {shard_name(i), results[i].tokens, results[i].sha256, results[i].max_token});
    total += results[i].tokens;
  }
  util::write_file_atomically(out / "shards.json", shard_set_json(set));
  // Shards of an earlier corpus tokenized into this folder, beyond this one's: a glob over the
  // folder would take them (the folder is normlab's own: claimed above).
  for (size_t i = units.size();; ++i) {
    std::error_code ec;
    if (!fs::remove(out / shard_name(i), ec)) break;
  }
  const uint64_t words = words_cached + words_encoded;
  if (!o.word_cache)
    fmt::print(log, "tokenize: every line encoded whole (--no-word-cache)\n");
  else if (!tok->word_split_refusal().empty())
    fmt::print(log, "tokenize: every line encoded whole (this model: {}; no word cache)\n",
               tok->word_split_refusal());
  else
    fmt::print(log, "tokenize: word cache: {:.1f} % of {} words found, {} lines encoded whole\n",
               words ? 100.0 * double(words_cached) / double(words) : 0.0, words,
               whole_lines.load());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(log,
             "tokenize: {} tokens in {} shards ({}: vocab {}, eos {}) in {:.1f} s, {:.2f} M "
             "tokens/s on {} job(s); train with data.format = \"normlab\", data.train = \"{}\"\n",
             total, units.size(), (out / "shards.json").string(), vocab, tok->eos_id(), s,
             double(tokens_done) / 1e6 / std::max(s, 1e-9), o.jobs, (out / "shard_*.bin").string());
  return total;
}

}  // namespace normlab::data
