// normlab scheme SDK — ABI version.
// Bump NORMLAB_ABI_VERSION whenever anything in normlab/sdk/ changes layout or meaning; the
// registry refuses plugins built against another number. (Test plugins may pre-define it.)
#pragma once

#ifndef NORMLAB_ABI_VERSION
#define NORMLAB_ABI_VERSION 3  // 3: SDK 2 (norm kinds, branch norms, streams, run hooks)
#endif
