// The C interface of libnormlab_spm.so, the module that wraps SentencePiece.
//
// Why a separate module: Debian's libsentencepiece bundles its own protobuf-lite (3.14) and exports
// its google::protobuf symbols, while LibTorch links the system libprotobuf (3.21). Both in the
// global symbol scope crash at load time (libprotobuf's initializers bind to SentencePiece's copy).
// libnormlab therefore never links SentencePiece; it dlopen()s this module with RTLD_LOCAL |
// RTLD_DEEPBIND, so SentencePiece resolves protobuf to its own copy and stays invisible to
// LibTorch. Only C types cross the boundary; errors come back through a sink, never as exceptions.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

typedef void (*NormlabSpmBytesSink)(void* ctx, const char* data, size_t size);
typedef void (*NormlabSpmIdsSink)(void* ctx, const int32_t* ids, size_t size);
// Next training sentence: returns 0 at the end, else sets *data/*size (valid until the next call).
typedef int (*NormlabSpmNextSentence)(void* ctx, const char** data, size_t* size);

struct NormlabSpmApi {
  int version;  // kNormlabSpmApiVersion
  // A processor from a serialized ModelProto; null on error (message to err).
  void* (*load)(const char* model, size_t size, NormlabSpmBytesSink err, void* err_ctx);
  void (*release)(void* processor);
  // pieces, pad, unk, bos, eos ids (-1: not defined)
  void (*info)(const void* processor, int32_t out[5]);
  // Thread-safe on one processor. Return 0 on success, else an error message went to err.
  int (*encode)(const void* processor, const char* text, size_t size, NormlabSpmIdsSink out,
                void* out_ctx, NormlabSpmBytesSink err, void* err_ctx);
  int (*decode)(const void* processor, const int32_t* ids, size_t size, NormlabSpmBytesSink out,
                void* out_ctx, NormlabSpmBytesSink err, void* err_ctx);
  // Trains on the sentences with `n` key/value options (keys[i] = values[i], SentencePiece's
  // trainer flags; the extra key "random_seed" seeds SentencePiece's generator). The serialized
  // model goes to `model`.
  int (*train)(const char* const* keys, const char* const* values, size_t n,
               NormlabSpmNextSentence next, void* next_ctx, NormlabSpmBytesSink model,
               void* model_ctx, NormlabSpmBytesSink err, void* err_ctx);
  // 1 when a line of words separated by single spaces encodes as its words encoded one by one by
  // encode_word, for every word that encode_word accepts (the model, its normalizer and its
  // vocabulary allow no other result); else 0, and why not went to `why`. What makes it exact:
  // spm_module.cpp, word_split_refusal and spm_encode_word.
  int (*word_split)(const void* processor, NormlabSpmBytesSink why, void* why_ctx);
  // As encode, for one word (no ASCII space in it): 0 with the ids, 2 when the word would not
  // encode alone as it does between two spaces (its normalization is empty or makes whitespace),
  // 1 on error.
  int (*encode_word)(const void* processor, const char* text, size_t size, NormlabSpmIdsSink out,
                     void* out_ctx, NormlabSpmBytesSink err, void* err_ctx);
  // The characters a line may also be split at, in runs, with its leading and trailing runs
  // dropped (" " then those of "\t\n\v\f\r" the model turns into collapsing whitespace), to
  // `chars`; nothing when only single spaces separate words. spm_module.cpp,
  // whitespace_split_chars.
  int (*whitespace_split)(const void* processor, NormlabSpmBytesSink chars, void* chars_ctx);
  // 1 when a document of a model that keeps spaces (remove_extra_whitespaces false) encodes as its
  // lines' segments (a run of spaces and the non-spaces after it) encoded one by one by
  // encode_segment, with the ids of "\n" (to `newline_ids`) between lines, and the first segment
  // prefixed by " " when *dummy_prefix is set; else 0, and why not went to `why`. spm_module.cpp,
  // newline_split_refusal.
  int (*newline_split)(const void* processor, int32_t* dummy_prefix, NormlabSpmIdsSink newline_ids,
                       void* ids_ctx, NormlabSpmBytesSink why, void* why_ctx);
  // One segment (no "\n") as it encodes after a line start or after a non-space: 0 with the ids,
  // 2 when it would not (its normalization is empty, or ends in whitespace while it holds more
  // than spaces), 1 on error.
  int (*encode_segment)(const void* processor, const char* text, size_t size, NormlabSpmIdsSink out,
                        void* out_ctx, NormlabSpmBytesSink err, void* err_ctx);
};

const NormlabSpmApi* normlab_spm_api(void);
}

constexpr int kNormlabSpmApiVersion = 4;
constexpr const char* kNormlabSpmEntryPoint = "normlab_spm_api";
