// Hyper-Connections, static by default (SHC; `dynamic = true` gives DHC). Equations, init and the
// readings followed: hyper_connections.h.
#include "hyper_connections.h"

namespace {
constexpr normlab_param_info kParams[] = {
    {"n", "int", "4", "", 1, 64, "expansion rate: streams per stack (paper's main setting 4)"},
    {"dynamic", "bool", "false", "", 0, 0, "dynamic hyper-connections (DHC, paper sec. 2.2)"},
};
}  // namespace

NORMLAB_EXPORT_SCHEME(
    normlab::hc::HyperConnections, "hyper-connections", "1.0.0",
    "Hyper-Connections: n residual streams mixed by learned width/depth connections",
    "h_in = sum_i A_m[i] H_i; H_j = sum_i A_r[i,j] H_i + B[j] Drop(F(LN(h_in))); "
    "end: LN(sum_i H_i); init A_m = e_(k mod n), A_r = I, B = 1 "
    "[Zhu et al., ICLR 2025, Hyper-Connections sec. 2.1, 2.3]",
    kParams)
