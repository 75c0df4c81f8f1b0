#include "fused_linear.h"

#include <torch/autograd.h>

#include "cpu_gemm.h"
#include "cpu_rows.h"
#include "fp32_operand.h"
#include "speed_levers.h"
#include "torch_api.h"

namespace normlab {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// bf16: the products take x, W and dy rounded to bf16 (autocast's operands) and accumulate in fp32;
// y and the gradients stay fp32 (dx in x's dtype).
struct LinearFn : public torch::autograd::Function<LinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w,
                            const at::Tensor& b, bool bf16) {
    const at::Tensor x = bf16 ? x_in.to(at::kBFloat16).contiguous() : x_in.contiguous();
    const int64_t K = x.size(-1), N = w.size(0), M = x.numel() / K;
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = N;
    at::Tensor y = at::empty(sizes, w.options());
    const bool bias =
        b.numel() > 0;  // an empty tensor stands for none (undefined inputs are not allowed here)
    if (bias) cpu::fill_rows(y.data_ptr<float>(), b.data_ptr<float>(), M, N);
    if (bf16) {
      const at::Tensor wb = w.to(at::kBFloat16);
      cpu::gemm_bf16(false, true, M, N, K, 1.0f, x.data_ptr(), K, wb.data_ptr(), K,
                     bias ? 1.0f : 0.0f, y.data_ptr<float>(), N);
      ctx->saved_data["w_bf16"] = wb;
    } else {
      cpu::gemm(false, true, M, N, K, 1.0f, x.data_ptr<float>(), K, w.data_ptr<float>(), K,
                bias ? 1.0f : 0.0f, y.data_ptr<float>(), N);
    }
    ctx->save_for_backward({x, w});
    ctx->saved_data["bias"] = bias;
    ctx->saved_data["bf16"] = bf16;
    ctx->saved_data["x_dtype"] = int64_t(x_in.scalar_type());
    return y;
  }

  // dx = dy·W, dW = dyᵀ·x, db = Σ_rows dy
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    if (!grad[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const at::Tensor dy = grad[0].to(at::kFloat).contiguous();
    const int64_t K = x.size(-1), N = w.size(0), M = x.numel() / K;
    const float* g = dy.data_ptr<float>();
    at::Tensor dx = at::empty(x.sizes(), w.options());
    at::Tensor dw = at::empty({N, K}, w.options());
    if (ctx->saved_data["bf16"].toBool()) {
      const at::Tensor gb = dy.to(at::kBFloat16), wb = ctx->saved_data["w_bf16"].toTensor();
      cpu::gemm_bf16(false, false, M, K, N, 1.0f, gb.data_ptr(), N, wb.data_ptr(), K, 0.0f,
                     dx.data_ptr<float>(), K);
      cpu::gemm_bf16(true, false, N, K, M, 1.0f, gb.data_ptr(), N, x.data_ptr(), K, 0.0f,
                     dw.data_ptr<float>(), K);
      dx = dx.to(at::ScalarType(ctx->saved_data["x_dtype"].toInt()));
    } else {
      cpu::gemm(false, false, M, K, N, 1.0f, g, N, w.data_ptr<float>(), K, 0.0f,
                dx.data_ptr<float>(), K);
      cpu::gemm(true, false, N, K, M, 1.0f, g, N, x.data_ptr<float>(), K, 0.0f,
                dw.data_ptr<float>(), K);
    }
    if (!ctx->saved_data["bias"].toBool()) return {dx, dw, at::Tensor(), at::Tensor()};
    at::Tensor db = at::empty({N}, w.options());
    cpu::column_sums(g, M, N, db.data_ptr<float>());
    return {dx, dw, db, at::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_linear(const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias) {
  // The fp32 parameters (and fp32 or, under autocast, bf16 inputs) of a CPU model.
  const bool bf16 = cpu::bf16_operand(x);
  if (!speed_levers().fused_linear || !(bf16 || cpu::fp32_operand(x)) || !cpu::fp32_param(weight) ||
      (bias.defined() && (!cpu::fp32_param(bias) || !bias.is_contiguous())) || weight.dim() != 2 ||
      !weight.is_contiguous() || cpu::blas_sgemm() == nullptr)
    return torch::linear(x, weight, bias);
  if (!bias.defined()) {
    TORCH_CHECK(weight.size(1) == x.size(-1), "fused linear: weight ", weight.sizes(),
                " does not fit an input of width ", x.size(-1));
    return LinearFn::apply(x, weight, at::empty({0}, weight.options()), bf16);
  }
  TORCH_CHECK(weight.size(1) == x.size(-1) && bias.numel() == weight.size(0),
              "fused linear: weight ", weight.sizes(), " and bias ", bias.sizes(),
              " do not fit an input of width ", x.size(-1));
  return LinearFn::apply(x, weight, bias, bf16);
}

}  // namespace normlab
