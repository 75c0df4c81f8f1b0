// Dynamic Hyper-Connections (DHC): `hyper-connections` with `dynamic = true` by default, under its
// own name. Equations, init and the readings followed: ../hyper_connections/hyper_connections.h.
#include "../hyper_connections/hyper_connections.h"

namespace {
constexpr normlab_param_info kParams[] = {
    {"n", "int", "4", "", 1, 64, "expansion rate: streams per stack (paper's main setting 4)"},
    {"dynamic", "bool", "true", "", 0, 0,
     "dynamic hyper-connections (DHC, paper sec. 2.2); false = SHC"},
};
}  // namespace

NORMLAB_EXPORT_SCHEME(
    normlab::hc::HyperConnections, "hyper-connections-dynamic", "1.0.0",
    "Dynamic Hyper-Connections: connection weights also depend on the token (tanh)",
    "A_m(H) = A_m + s_a tanh(norm(H) W_m), A_r(H) = A_r + s_a tanh(norm(H) W_r), "
    "B(H) = B + s_b tanh(norm(H) W_b); W = 0, s = 0.01 at init "
    "[Zhu et al., ICLR 2025, Hyper-Connections sec. 2.2, 2.3]",
    kParams)
