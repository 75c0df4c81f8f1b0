#include "greedy_decoder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace normlab {

std::vector<std::vector<int32_t>> greedy_decode(TransformerModelImpl& model,
                                                const std::vector<std::vector<int32_t>>& sources,
                                                const torch::Device& device, double max_len_a,
                                                int64_t max_len_b, int64_t max_tokens) {
  torch::NoGradGuard no_grad;
  // fairseq's limit, per sentence (not per batch: results do not depend on batching).
  auto output_limit = [&](int64_t src_len) {
    return int64_t(max_len_a * double(src_len) + double(max_len_b));
  };
  const bool was_training = model.is_training();
  model.eval();
  std::vector<std::vector<int32_t>> out(sources.size());
  // Similar lengths together: less padding.
  std::vector<size_t> order(sources.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sources[a].size() < sources[b].size(); });
  size_t start = 0;
  while (start < order.size()) {
    // The longest source of a chunk is its last; keep batch × (src + output) within the budget.
    size_t end = start + 1;
    while (end < order.size()) {
      const int64_t len = int64_t(sources[order[end]].size());
      const int64_t out_len = output_limit(len);
      if (int64_t(end - start + 1) * (len + out_len) > max_tokens) break;
      ++end;
    }
    const int64_t B = int64_t(end - start);
    const int64_t S = int64_t(sources[order[end - 1]].size());
    std::vector<int64_t> src(size_t(B * S), data::kPad);
    for (int64_t i = 0; i < B; ++i) {
      const auto& s = sources[order[start + size_t(i)]];
      std::copy(s.begin(), s.end(), src.begin() + i * S);
    }
    auto src_t = torch::tensor(src, torch::kLong).view({B, S}).to(device);
    torch::Tensor src_mask;
    auto memory = model.encode(src_t, &src_mask);
    const int64_t max_len = output_limit(S);
    std::vector<int64_t> limits;
    for (int64_t i = 0; i < B; ++i)
      limits.push_back(output_limit(int64_t(sources[order[start + size_t(i)]].size())));
    const auto row_limit = torch::tensor(limits, torch::kLong).to(device);
    auto ys = torch::full({B, 1}, int64_t(data::kBos),
                          torch::TensorOptions().dtype(torch::kLong).device(device));
    auto finished = torch::zeros({B}, torch::TensorOptions().dtype(torch::kBool).device(device));
    for (int64_t step = 0; step < max_len; ++step) {
      auto logits = model.decode(ys, memory, src_mask);
      // PAD and BOS are never outputs (as in beam search): an untrained model may rank them first.
      auto last = logits.select(1, logits.size(1) - 1);
      last.index_fill_(
          -1, torch::tensor({int64_t(data::kPad), int64_t(data::kBos)}, torch::kLong).to(device),
          -std::numeric_limits<float>::infinity());
      auto next = last.argmax(-1);
      next = next.masked_fill(finished, data::kPad);
      ys = torch::cat({ys, next.unsqueeze(1)}, 1);
      finished = finished.logical_or(next.eq(data::kEos)).logical_or(row_limit.le(step + 1));
      if (finished.all().item<bool>()) break;
    }
    auto ys_cpu = ys.cpu();
    auto acc = ys_cpu.accessor<int64_t, 2>();
    for (int64_t i = 0; i < B; ++i) {
      auto& hyp = out[order[start + size_t(i)]];
      for (int64_t t = 1; t < ys_cpu.size(1); ++t) {
        const int64_t id = acc[i][t];
        if (id == data::kEos || id == data::kPad) break;
        hyp.push_back(int32_t(id));
      }
    }
    start = end;
  }
  model.train(was_training);
  return out;
}

}  // namespace normlab
