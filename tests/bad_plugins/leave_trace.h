// For the fixtures that prove when plugin code runs: appends a line to the file named by
// $NORMLAB_TEST_PLUGIN_TRACE (nothing when it is unset).
#pragma once

#include <cstdio>
#include <cstdlib>

inline void leave_trace(const char* what) {
  const char* path = std::getenv("NORMLAB_TEST_PLUGIN_TRACE");
  if (!path) return;
  if (std::FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s\n", what);
    std::fclose(f);
  }
}
