#include "fused_linear.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include "cpu_gemm.h"
#include "cpu_rows.h"
#include "fp32_operand.h"
#include "speed_levers.h"

namespace normlab {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearFn : public torch::autograd::Function<LinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w,
                            const at::Tensor& b) {
    const at::Tensor x = x_in.contiguous();
    const int64_t K = x.size(-1), N = w.size(0), M = x.numel() / K;
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = N;
    at::Tensor y = at::empty(sizes, x.options());
    const bool bias =
        b.numel() > 0;  // an empty tensor stands for none (undefined inputs are not allowed here)
    if (bias) cpu::fill_rows(y.data_ptr<float>(), b.data_ptr<float>(), M, N);
    cpu::gemm(false, true, M, N, K, 1.0f, x.data_ptr<float>(), K, w.data_ptr<float>(), K,
              bias ? 1.0f : 0.0f, y.data_ptr<float>(), N);
    ctx->save_for_backward({x, w});
    ctx->saved_data["bias"] = bias;
    return y;
  }

  // dx = dy·W, dW = dyᵀ·x, db = Σ_rows dy
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    if (!grad[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const at::Tensor dy = grad[0].contiguous();
    const int64_t K = x.size(-1), N = w.size(0), M = x.numel() / K;
    const float* g = dy.data_ptr<float>();
    at::Tensor dx = at::empty(x.sizes(), x.options());
    cpu::gemm(false, false, M, K, N, 1.0f, g, N, w.data_ptr<float>(), K, 0.0f, dx.data_ptr<float>(),
              K);
    at::Tensor dw = at::empty({N, K}, w.options());
    cpu::gemm(true, false, N, K, M, 1.0f, g, N, x.data_ptr<float>(), K, 0.0f, dw.data_ptr<float>(),
              K);
    if (!ctx->saved_data["bias"].toBool()) return {dx, dw, at::Tensor()};
    at::Tensor db = at::empty({N}, w.options());
    cpu::column_sums(g, M, N, db.data_ptr<float>());
    return {dx, dw, db};
  }
};

}  // namespace

torch::Tensor fused_linear(const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias) {
  if (!speed_levers().fused_linear || !cpu::fp32_operand(x) || !cpu::fp32_operand(weight) ||
      (bias.defined() && (!cpu::fp32_operand(bias) || !bias.is_contiguous())) ||
      weight.dim() != 2 || !weight.is_contiguous() || cpu::blas_sgemm() == nullptr)
    return torch::linear(x, weight, bias);
  if (!bias.defined()) {
    TORCH_CHECK(weight.size(1) == x.size(-1), "fused linear: weight ", weight.sizes(),
                " does not fit an input of width ", x.size(-1));
    return LinearFn::apply(x, weight, at::empty({0}, weight.options()));
  }
  TORCH_CHECK(weight.size(1) == x.size(-1) && bias.numel() == weight.size(0),
              "fused linear: weight ", weight.sizes(), " and bias ", bias.sizes(),
              " do not fit an input of width ", x.size(-1));
  return LinearFn::apply(x, weight, bias);
}

}  // namespace normlab
