// normlab scheme SDK — ABI version.
// Bump NORMLAB_ABI_VERSION whenever anything in normlab/sdk/ changes layout or meaning; the
// registry refuses plugins built against another number. (Test plugins may pre-define it.)
#pragma once

#ifndef NORMLAB_ABI_VERSION
#define NORMLAB_ABI_VERSION \
  4  // 4: model families (ModelGeometry::family, kv_heads; Scheme::qk_norm_before_rope)
#endif
