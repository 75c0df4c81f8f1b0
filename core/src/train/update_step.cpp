#include "update_step.h"

#include <torch/torch.h>

#include "label_smoothing.h"
#include "torch_compat.h"

namespace normlab {

DeviceBatch to_device(const data::Batch& b, const torch::Device& dev) {
  DeviceBatch d;
  auto make = [&](const std::vector<int64_t>& v, int64_t len) {
    return torch::tensor(v, torch::kLong).view({b.size, len}).to(dev);
  };
  if (!b.src.empty()) d.src = make(b.src, b.src_len);
  d.tgt_in = make(b.tgt_in, b.tgt_len);
  d.tgt_out = make(b.tgt_out, b.tgt_len);
  d.tokens = b.target_tokens;
  return d;
}

torch::Tensor forward(TransformerModelImpl& model, const DeviceBatch& b) {
  return b.src.defined() ? model.forward(b.src, b.tgt_in) : model.forward_lm(b.tgt_in);
}

UpdateLoss accumulate_gradients(TransformerModelImpl& model, const std::vector<DeviceBatch>& batches,
                                const UpdateOptions& o, const std::function<void()>& before_last) {
  UpdateLoss sums;
  for (const auto& b : batches) sums.tokens += b.tokens;
  // Each batch's loss is divided by the tokens of the whole update before its backward, so the
  // gradients add up to those of one big batch (and one batch is exactly the old k = 1 path).
  const double ntok = double(std::max<int64_t>(sums.tokens, 1));
  const bool autocast = o.dtype != "fp32";
  const at::ScalarType dtype = o.dtype == "fp16" ? at::kHalf : at::kBFloat16;
  torch::Tensor loss_sum, nll_sum;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (i + 1 == batches.size() && before_last) before_last();
    torch::Tensor logits;
    {
      compat::AutocastGuard guard(autocast ? compat::autocast_to(o.cuda, dtype) : compat::autocast_state());
      logits = forward(model, batches[i]);
    }
    // The loss in fp32 whatever the forward's precision (log-softmax over the vocabulary).
    LossSums s = label_smoothed_loss(logits.to(torch::kFloat), batches[i].tgt_out, o.label_smoothing, o.pad_id);
    ((s.loss * o.loss_scale) / ntok).backward();
    loss_sum = loss_sum.defined() ? loss_sum + s.loss.detach() : s.loss.detach();
    nll_sum = nll_sum.defined() ? nll_sum + s.nll.detach() : s.nll.detach();
  }
  if (loss_sum.defined()) {
    sums.loss = loss_sum.item<double>();
    sums.nll = nll_sum.item<double>();
  }
  return sums;
}

}  // namespace normlab
