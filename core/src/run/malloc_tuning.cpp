// glibc malloc's thresholds for training (normlab/runtime_env.h: tune_malloc). No LibTorch: the
// normlab executable sets them for the verbs it runs itself (`data`, runner/main.cpp) too.
#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "normlab/runtime_env.h"

namespace normlab {

namespace {
bool user_sets_malloc() {
  for (const char* var :
       {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"})
    if (std::getenv(var)) return true;
  const char* off = std::getenv("NORMLAB_MALLOC_TUNE");
  return off && std::strcmp(off, "0") == 0;
}
}  // namespace

void tune_malloc() {
  if (user_sets_malloc()) return;
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void tune_malloc_for_checkpointing() {
  if (user_sets_malloc()) return;
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 2 << 20);
}

}  // namespace normlab
