// normlab scheme SDK, internal (sdk/detail: plugin.h includes it, plugin authors need not) — plugin
// metadata. NORMLAB_EXPORT_SCHEME turns it, at compile time, into one
// self-contained record (no pointers, nothing to relocate) in the ELF section ".normlab_plugin", so
// the registry reads a plugin's name, version, ABI and parameters from the file without loading
// it: none of the plugin's code runs while plugins are listed. The layout is covered by
// NORMLAB_ABI_VERSION.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// One declared scheme parameter. Declare the array `constexpr`: it is read at compile time.
struct normlab_param_info {
  const char* name;
  const char* type;           // "bool" | "int" | "float" | "string"
  const char* default_value;  // as text: "true", "4000", "0.5", "linear"
  const char* choices;        // strings only: "a|b|c", or "" for any
  double min_value;           // numbers only: inclusive range (use -INFINITY / INFINITY for none)
  double max_value;
  const char* help;  // one line
};

}  // extern "C"

#define NORMLAB_METADATA_SECTION ".normlab_plugin"

namespace normlab::metadata {

// The record, in the plugin's native byte order. Its first 16 bytes (magic, ABI, size) stay the
// same in every ABI, so a reader checks the ABI before it interprets anything else.
//    0  char magic[8]            "NLPLUGIN"
//    8  uint32 abi_version
//   12  uint32 total_size        bytes of the whole record
//   16  uint32 cxx11_abi         _GLIBCXX_USE_CXX11_ABI of the plugin
//   20  uint32 num_params
//   24  uint32 strings_offset
//   28  uint32 strings_size
//   32  double ranges[]          min, max of each parameter (one unused slot when there are none)
//   strings_offset: NUL-terminated texts: name, version, description, equation, torch_version,
//                   then per parameter name, type, default, choices, help
constexpr char kMagic[8] = {'N', 'L', 'P', 'L', 'U', 'G', 'I', 'N'};
constexpr std::size_t kPrefixSize = 16;
constexpr std::size_t kHeaderSize = 32;
constexpr int kTextsPerScheme = 5;
constexpr int kTextsPerParam = 5;

template <std::size_t NumRanges, std::size_t StringBytes>
struct Record {
  char magic[8];
  std::uint32_t abi_version, total_size, cxx11_abi, num_params, strings_offset, strings_size;
  double ranges[NumRanges];
  char strings[StringBytes];
};

constexpr std::size_t text_bytes(const char* s) {
  std::size_t n = 0;
  while (s && s[n]) ++n;
  return n + 1;
}

constexpr std::size_t ranges_size(const normlab_param_info*, int num_params) {
  return num_params > 0 ? 2 * std::size_t(num_params) : 1;
}

constexpr std::size_t strings_size(const char* name, const char* version, const char* description,
                                   const char* equation, const char* torch_version,
                                   const normlab_param_info* params, int num_params) {
  std::size_t n = text_bytes(name) + text_bytes(version) + text_bytes(description) +
                  text_bytes(equation) + text_bytes(torch_version);
  for (int i = 0; i < num_params; ++i)
    n += text_bytes(params[i].name) + text_bytes(params[i].type) +
         text_bytes(params[i].default_value) + text_bytes(params[i].choices) +
         text_bytes(params[i].help);
  return n;
}

template <std::size_t NumRanges, std::size_t StringBytes>
constexpr Record<NumRanges, StringBytes> make_record(int abi_version, int cxx11_abi,
                                                     const char* name, const char* version,
                                                     const char* description, const char* equation,
                                                     const char* torch_version,
                                                     const normlab_param_info* params,
                                                     int num_params) {
  Record<NumRanges, StringBytes> r{};
  for (std::size_t i = 0; i < sizeof(kMagic); ++i) r.magic[i] = kMagic[i];
  r.abi_version = std::uint32_t(abi_version);
  r.total_size = std::uint32_t(sizeof(Record<NumRanges, StringBytes>));
  r.cxx11_abi = std::uint32_t(cxx11_abi);
  r.num_params = std::uint32_t(num_params);
  r.strings_offset = std::uint32_t(kHeaderSize + NumRanges * sizeof(double));
  r.strings_size = std::uint32_t(StringBytes);
  std::size_t at = 0;
  auto put = [&r, &at](const char* s) {
    for (std::size_t i = 0; s && s[i]; ++i) r.strings[at++] = s[i];
    r.strings[at++] = '\0';
  };
  put(name);
  put(version);
  put(description);
  put(equation);
  put(torch_version);
  for (int i = 0; i < num_params; ++i) {
    r.ranges[2 * i] = params[i].min_value;
    r.ranges[2 * i + 1] = params[i].max_value;
    put(params[i].name);
    put(params[i].type);
    put(params[i].default_value);
    put(params[i].choices);
    put(params[i].help);
  }
  return r;
}

using SmallestRecord = Record<1, 1>;
static_assert(offsetof(SmallestRecord, ranges) == kHeaderSize &&
                  offsetof(SmallestRecord, strings) == kHeaderSize + sizeof(double),
              "metadata record layout");

}  // namespace normlab::metadata
