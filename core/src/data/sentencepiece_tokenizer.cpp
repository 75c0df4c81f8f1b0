// SentencePiece tokenizers: loaded from a .model, or trained with our special ids and cached.
// SentencePiece itself lives in libnormlab_spm.so, loaded on first use (see spm_api.h for why).
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <fstream>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>

#include "internal.h"
#include "spm_api.h"

#ifndef NORMLAB_BUILD_LIBDIR
#define NORMLAB_BUILD_LIBDIR ""
#endif
#ifndef NORMLAB_INSTALL_LIBDIR
#define NORMLAB_INSTALL_LIBDIR "lib"
#endif

namespace fs = std::filesystem;

namespace normlab::data::detail {

namespace {

constexpr const char* kModuleName = "libnormlab_spm.so";

// Candidates: next to libnormlab.so (build tree and install prefix alike), the library folder
// beside the `normlab` executable's (which runs `normlab data` itself, runner/main.cpp), the build
// tree's lib directory, then the loader's search path.
const NormlabSpmApi* load_module() {
  std::vector<std::string> candidates;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&load_module), &info) && info.dli_fname) {
    const fs::path here = fs::path(info.dli_fname).parent_path();
    candidates.push_back((here / kModuleName).string());
    candidates.push_back(
        (here / ".." / NORMLAB_INSTALL_LIBDIR / kModuleName).lexically_normal().string());
  }
  if (*NORMLAB_BUILD_LIBDIR)
    candidates.push_back((fs::path(NORMLAB_BUILD_LIBDIR) / kModuleName).string());
  candidates.push_back(kModuleName);
  std::string errors;
  for (const auto& c : candidates) {
    if (c.find('/') != std::string::npos && !fs::exists(c)) continue;
    // RTLD_DEEPBIND: SentencePiece binds to its own bundled protobuf, not LibTorch's libprotobuf;
    // RTLD_LOCAL: its symbols stay out of the global scope.
    void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h) {
      errors += fmt::format("; {}: {}", c, dlerror());
      continue;
    }
    auto entry = reinterpret_cast<const NormlabSpmApi* (*)()>(dlsym(h, kNormlabSpmEntryPoint));
    const NormlabSpmApi* api = entry ? entry() : nullptr;
    if (api && api->version == kNormlabSpmApiVersion) return api;  // stays loaded for the process
    errors +=
        fmt::format("; {}: no {} of version {}", c, kNormlabSpmEntryPoint, kNormlabSpmApiVersion);
    dlclose(h);
  }
  throw DataError(
      fmt::format("SentencePiece support module {} could not be loaded{}", kModuleName, errors));
}

const NormlabSpmApi& api() {
  static const NormlabSpmApi* loaded = load_module();  // a throw leaves it unset: retried next time
  return *loaded;
}

void append_bytes(void* ctx, const char* data, size_t size) {
  static_cast<std::string*>(ctx)->append(data, size);
}

void assign_ids(void* ctx, const int32_t* ids, size_t size) {
  static_cast<std::vector<int32_t>*>(ctx)->assign(ids, ids + size);
}

int next_sentence(void* ctx, const char** data, size_t* size) {
  auto* state = static_cast<std::pair<const std::vector<const std::string*>*, size_t>*>(ctx);
  if (state->second >= state->first->size()) return 0;
  const std::string* s = (*state->first)[state->second++];
  *data = s->data();
  *size = s->size();
  return 1;
}

// SentencePiece's default max_sentence_length.
constexpr size_t kSpmMaxSentenceBytes = 4192;

}  // namespace

std::vector<const std::string*> split_long_sentences(
    const std::vector<const std::string*>& sentences, size_t max_bytes,
    std::deque<std::string>& storage) {
  // Every model type learns from whitespace-separated words (unigram and BPE count words, char
  // and word models need nothing across a space), so cutting at a space changes nothing they
  // learn; only a single word longer than max_bytes is cut inside (at a UTF-8 character boundary).
  std::vector<const std::string*> out;
  out.reserve(sentences.size());
  for (const std::string* s : sentences) {
    if (s->size() <= max_bytes) {
      out.push_back(s);
      continue;
    }
    const std::string_view text(*s);
    size_t begin = 0;
    while (begin < text.size()) {
      size_t end = std::min(text.size(), begin + max_bytes);
      size_t next = end;
      if (end < text.size()) {
        const size_t space = text.rfind(' ', end);
        if (space != std::string_view::npos && space > begin) {
          end = space;
          next = space + 1;
        } else {
          while (end > begin + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
          next = end;
        }
      }
      if (end > begin) {
        storage.emplace_back(text.substr(begin, end - begin));
        out.push_back(&storage.back());
      }
      begin = next;
    }
  }
  return out;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(std::string model_bytes, std::string origin,
                                               bool normlab_ids)
    : model_(std::move(model_bytes)), origin_(std::move(origin)), digest_(hash_bytes(model_)) {
  std::string err;
  processor_ = api().load(model_.data(), model_.size(), append_bytes, &err);
  if (!processor_)
    throw DataError(
        fmt::format("tokenizer model {}: not a valid SentencePiece model ({})", origin_, err));
  int32_t info[5];
  api().info(processor_, info);
  pieces_ = info[0];
  eos_ = info[4];
  if (normlab_ids && (info[1] != kPad || info[2] != kUnk || info[3] != kBos || info[4] != kEos)) {
    api().release(processor_);
    processor_ = nullptr;
    throw DataError(
        fmt::format("tokenizer model {}: special ids pad={} unk={} bos={} eos={}, expected pad={} "
                    "unk={} bos={} eos={} "
                    "(train it with --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3)",
                    origin_, info[1], info[2], info[3], info[4], kPad, kUnk, kBos, kEos));
  }
  if (!api().word_split(processor_, append_bytes, &word_split_refusal_) &&
      word_split_refusal_.empty())
    word_split_refusal_ = "no reason given";
  api().whitespace_split(processor_, append_bytes, &whitespace_split_);
  int32_t dummy = 0;
  if (!api().newline_split(processor_, &dummy, assign_ids, &newline_ids_, append_bytes,
                           &newline_split_refusal_) &&
      newline_split_refusal_.empty())
    newline_split_refusal_ = "no reason given";
  dummy_prefix_ = dummy != 0;
}

SentencePieceTokenizer::~SentencePieceTokenizer() {
  if (processor_) api().release(processor_);
}

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  std::string err;
  if (api().encode(processor_, text.data(), text.size(), assign_ids, &ids, append_bytes, &err) != 0)
    throw DataError(fmt::format("tokenizer {}: cannot encode '{}': {}", origin_, text, err));
  return ids;
}

void SentencePieceTokenizer::encode_into(std::string_view text, std::vector<int32_t>& ids) const {
  std::string err;
  if (api().encode(processor_, text.data(), text.size(), assign_ids, &ids, append_bytes, &err) != 0)
    throw DataError(fmt::format("tokenizer {}: cannot encode '{}': {}", origin_, text, err));
}

bool SentencePieceTokenizer::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  std::string err;
  const int rc =
      api().encode_word(processor_, word.data(), word.size(), assign_ids, &ids, append_bytes, &err);
  if (rc == 1)
    throw DataError(fmt::format("tokenizer {}: cannot encode '{}': {}", origin_, word, err));
  return rc == 0;
}

bool SentencePieceTokenizer::encode_segment(std::string_view segment,
                                            std::vector<int32_t>& ids) const {
  std::string err;
  const int rc = api().encode_segment(processor_, segment.data(), segment.size(), assign_ids, &ids,
                                      append_bytes, &err);
  if (rc == 1)
    throw DataError(fmt::format("tokenizer {}: cannot encode '{}': {}", origin_, segment, err));
  return rc == 0;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<int32_t> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids)
    if (id > kEos && id < pieces_) kept.push_back(id);
  std::string text, err;
  if (api().decode(processor_, kept.data(), kept.size(), append_bytes, &text, append_bytes, &err) !=
      0)
    throw DataError(fmt::format("tokenizer {}: cannot decode: {}", origin_, err));
  return text;
}

// NFKC alone (nmt_nfkc makes tabs and newlines spaces), no collapsing of spaces, pieces of spaces
// only, "\n" a piece of its own, any byte representable.
std::vector<std::pair<std::string, std::string>> keep_newlines_trainer_options() {
  return {{"normalization_rule_name", "nfkc"},
          {"remove_extra_whitespaces", "false"},
          {"allow_whitespace_only_pieces", "true"},
          {"user_defined_symbols", "\n"},
          {"byte_fallback", "true"}};
}

std::string train_sentencepiece(const std::vector<std::pair<std::string, std::string>>& options,
                                const std::vector<const std::string*>& sentences) {
  std::vector<const char*> keys, values;
  for (const auto& [k, v] : options) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  // Lines over SentencePiece's max_sentence_length would be dropped from training (and their
  // warning crashed the module, see spm_module.cpp); they are fed in pieces cut at spaces instead.
  std::deque<std::string> pieces;
  const std::vector<const std::string*> fed =
      split_long_sentences(sentences, kSpmMaxSentenceBytes, pieces);
  std::pair<const std::vector<const std::string*>*, size_t> state{&fed, 0};
  std::string model, err;
  if (api().train(keys.data(), values.data(), keys.size(), next_sentence, &state, append_bytes,
                  &model, append_bytes, &err) != 0)
    throw DataError("SentencePiece training failed: " + err);
  return model;
}

TokenizerOutcome obtain_sentencepiece(
    const TokenizerConfig& cfg, const Digest& text_key,
    const std::function<std::vector<const std::string*>()>& training_text,
    const fs::path& cache_dir, const std::string& what, std::ostream& log,
    const std::vector<std::pair<std::string, std::string>>& extra) {
  TokenizerOutcome out;
  if (!cfg.model.empty()) {
    TextFile f = read_text_file("tokenizer.model", cfg.model);
    out.tokenizer =
        std::make_shared<SentencePieceTokenizer>(std::move(f.bytes), "'" + cfg.model + "'");
    out.source = TokenizerOutcome::Given;
    return out;
  }
  static const std::vector<std::string> kTypes{"unigram", "bpe", "char", "word"};
  if (std::find(kTypes.begin(), kTypes.end(), cfg.model_type) == kTypes.end())
    throw DataError(
        fmt::format("tokenizer.model_type: unknown '{}' (expected unigram, bpe, char or word)",
                    cfg.model_type));
  if (cfg.vocab_size <= kEos + 1)
    throw DataError(fmt::format("tokenizer.vocab_size: {} leaves no room besides the 4 special ids",
                                cfg.vocab_size));
  if (!(cfg.character_coverage > 0 && cfg.character_coverage <= 1))
    throw DataError(
        fmt::format("tokenizer.character_coverage: {} is not in (0, 1]", cfg.character_coverage));

  // The key: the training text (its files' content hashes and the part used, from the caller) and
  // every setting that changes the model.
  constexpr int64_t kInputSentenceSize = 1000000;
  Hasher hasher;
  hasher.field("normlab-spm-v1")
      .field(text_key)
      .field(cfg.model_type)
      .field(int64_t(cfg.vocab_size))
      .field(cfg.character_coverage)
      .field(kInputSentenceSize);
  for (const auto& [k, v] : extra) hasher.field(k).field(v);  // none: the key of earlier versions
  const Digest key = hasher.digest();
  const fs::path file = cache_dir / "tokenizers" / (key.hex() + ".model");
  std::error_code ec;
  if (fs::is_regular_file(file, ec)) {
    std::ifstream in(file, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    try {
      out.tokenizer =
          std::make_shared<SentencePieceTokenizer>(std::move(ss).str(), "'" + file.string() + "'");
      out.source = TokenizerOutcome::CacheHit;
      return out;
    } catch (const DataError& e) {
      log << "data: ignoring unusable cached tokenizer (" << e.what() << "), training again\n";
    }
  }

  const auto sentences = training_text();
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  log << fmt::format("data: training SentencePiece ({} {}, vocab {}) on {} lines\n", what,
                     cfg.model_type, cfg.vocab_size, sentences.size())
      << std::flush;
  const auto t0 = std::chrono::steady_clock::now();
  std::string model;
  try {
    std::vector<std::pair<std::string, std::string>> options = {
        {"model_type", cfg.model_type},
        {"vocab_size", std::to_string(cfg.vocab_size)},
        {"character_coverage", fmt::format("{}", cfg.character_coverage)},
        {"pad_id", std::to_string(kPad)},
        {"unk_id", std::to_string(kUnk)},
        {"bos_id", std::to_string(kBos)},
        {"eos_id", std::to_string(kEos)},
        {"input_sentence_size", std::to_string(kInputSentenceSize)},
        {"shuffle_input_sentence", "true"},
        {"num_threads", std::to_string(threads)},
        {"minloglevel", "1"},
        {"random_seed", "1"}};
    options.insert(options.end(), extra.begin(), extra.end());
    model = train_sentencepiece(options, sentences);
  } catch (const DataError& e) {
    throw DataError(fmt::format("tokenizer ({} {}, vocab {}): {}", what, cfg.model_type,
                                cfg.vocab_size, e.what()));
  }
  out.seconds = seconds_since(t0);
  out.tokenizer = std::make_shared<SentencePieceTokenizer>(model, "trained " + what);
  out.source = TokenizerOutcome::Trained;
  try {
    write_file_atomic(file, model);
    log << fmt::format("data: trained in {:.1f} s, cached as {}\n", out.seconds, file.string());
  } catch (const std::exception& e) {
    log << "data: warning: could not cache the tokenizer: " << e.what() << "\n";
  }
  return out;
}

std::vector<std::vector<int32_t>> encode_all(const Tokenizer& tok,
                                             const std::vector<const std::string*>& lines) {
  std::vector<std::vector<int32_t>> out(lines.size());
  const size_t n = lines.size();
  size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  threads = std::min(threads, n / 2000 + 1);  // small inputs: not worth a thread
  std::vector<std::exception_ptr> errors(threads);
  auto work = [&](size_t t) {
    try {
      const auto* spm = dynamic_cast<const SentencePieceTokenizer*>(&tok);
      std::optional<WordCacheEncoder> cached;
      if (spm) cached.emplace(*spm);
      for (size_t i = n * t / threads; i < n * (t + 1) / threads; ++i) {
        if (cached)
          cached->encode_into(*lines[i], out[i]);
        else
          out[i] = tok.encode(*lines[i]);
      }
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

}  // namespace normlab::data::detail
