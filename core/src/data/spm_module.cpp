// libnormlab_spm.so: SentencePiece behind the C interface of spm_api.h (see there for why).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <memory>
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

void* spm_load(const char* model, size_t size, NormlabSpmBytesSink err, void* err_ctx) {
  try {
    auto sp = std::make_unique<SentencePieceProcessor>();
    Status st = sp->LoadFromSerializedProto(std::string_view(model, size));
    if (!st.ok()) {
      report(err, err_ctx, st.ToString());
      return nullptr;
    }
    return sp.release();
  } catch (const std::exception& e) {
    report(err, err_ctx, e.what());
  } catch (...) {
    report(err, err_ctx, "unknown error");
  }
  return nullptr;
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
  try {
    const auto* sp = static_cast<const SentencePieceProcessor*>(processor);
    std::vector<int> ids;
    Status st = sp->Encode(std::string_view(text, size), &ids);
    if (!st.ok()) {
      report(err, err_ctx, st.ToString());
      return 1;
    }
    std::vector<int32_t> ids32(ids.begin(), ids.end());
    out(out_ctx, ids32.data(), ids32.size());
    return 0;
  } catch (const std::exception& e) {
    report(err, err_ctx, e.what());
  } catch (...) {
    report(err, err_ctx, "unknown error");
  }
  return 1;
}

int spm_decode(const void* processor, const int32_t* ids, size_t size, NormlabSpmBytesSink out,
               void* out_ctx, NormlabSpmBytesSink err, void* err_ctx) {
  try {
    const auto* sp = static_cast<const SentencePieceProcessor*>(processor);
    std::vector<int> v(ids, ids + size);
    std::string text;
    Status st = sp->Decode(v, &text);
    if (!st.ok()) {
      report(err, err_ctx, st.ToString());
      return 1;
    }
    out(out_ctx, text.data(), text.size());
    return 0;
  } catch (const std::exception& e) {
    report(err, err_ctx, e.what());
  } catch (...) {
    report(err, err_ctx, "unknown error");
  }
  return 1;
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
  try {
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
    Status st = sentencepiece::SentencePieceTrainer::Train(kwargs, &it, &proto);
    if (!st.ok()) {
      report(err, err_ctx, st.ToString());
      return 1;
    }
    model(model_ctx, proto.data(), proto.size());
    return 0;
  } catch (const std::exception& e) {
    report(err, err_ctx, e.what());
  } catch (...) {
    report(err, err_ctx, "unknown error");
  }
  return 1;
}

const NormlabSpmApi kApi = {
    kNormlabSpmApiVersion, spm_load, spm_release, spm_info, spm_encode, spm_decode, spm_train};

}  // namespace

extern "C" __attribute__((visibility("default"))) const NormlabSpmApi* normlab_spm_api(void) {
  // Before anything else runs: loading and encoding may log too (see kSilentLogLevel).
  sentencepiece::logging::SetMinLogLevel(kSilentLogLevel);
  return &kApi;
}
