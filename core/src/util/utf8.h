// Strict UTF-8 checking, for corpora and for manifest values given on the command line. No
// LibTorch.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace normlab::util {

// Offset of the first byte that breaks strict UTF-8 (no overlongs, surrogates or > U+10FFFF),
// or npos when the text is valid.
size_t find_invalid_utf8(std::string_view text);

// `text` for an error message: control characters and bytes past ASCII as \xNN, at most
// `max_bytes` of it, "..." after a longer one.
std::string printable(std::string_view text, size_t max_bytes = 40);

}  // namespace normlab::util
