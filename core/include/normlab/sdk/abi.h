// normlab scheme SDK — ABI version.
// Bump NORMLAB_ABI_VERSION whenever anything in normlab/sdk/ changes layout or meaning; the
// registry refuses plugins built against another number. (Test plugins may pre-define it.)
#pragma once

#ifndef NORMLAB_ABI_VERSION
#define NORMLAB_ABI_VERSION \
  7  // 7: Scheme::weight_decay; 6: LayerOps::residual_norm; 5: per-head q/k gains, final_norm
#endif
