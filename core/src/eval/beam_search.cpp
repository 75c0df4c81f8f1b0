#include "beam_search.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "normlab/data/dataset.h"

namespace normlab::eval {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Restores the model's training flag when decoding ends (or throws).
struct EvalModeScope {
  TransformerModelImpl& model;
  bool was_training;
  explicit EvalModeScope(TransformerModelImpl& m) : model(m), was_training(m.is_training()) {
    model.eval();
  }
  ~EvalModeScope() { model.train(was_training); }
};

int64_t max_output_len(const BeamOptions& opt, int64_t src_len) {
  return int64_t(opt.max_len_a * double(src_len) + double(opt.max_len_b));
}

// Sentence indices sorted by length (less padding), cut into chunks of at most `budget` tokens
// counted as rows × (longest source + its output limit).
std::vector<std::vector<size_t>> length_chunks(const std::vector<std::vector<int32_t>>& sources,
                                               int64_t rows_per_sentence, int64_t budget,
                                               const std::function<int64_t(int64_t)>& out_len) {
  std::vector<size_t> order(sources.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sources[a].size() < sources[b].size(); });
  std::vector<std::vector<size_t>> chunks;
  for (size_t i : order) {
    const int64_t len = int64_t(sources[i].size());
    if (!chunks.empty()) {
      const int64_t n = int64_t(chunks.back().size()) + 1;
      if (n * rows_per_sentence * (len + out_len(len)) <= budget) {
        chunks.back().push_back(i);
        continue;
      }
    }
    chunks.push_back({i});
  }
  return chunks;
}

torch::Tensor padded(const std::vector<std::vector<int32_t>>& rows, const torch::Device& device) {
  size_t T = 0;
  for (const auto& r : rows) T = std::max(T, r.size());
  std::vector<int64_t> flat(rows.size() * T, data::kPad);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(rows[i].begin(), rows[i].end(), flat.begin() + long(i * T));
  return torch::tensor(flat, torch::kLong).view({int64_t(rows.size()), int64_t(T)}).to(device);
}

}  // namespace

std::vector<Hypothesis> beam_search(TransformerModelImpl& model,
                                    const std::vector<std::vector<int32_t>>& sources,
                                    const torch::Device& device, const BeamOptions& opt) {
  torch::NoGradGuard no_grad;
  EvalModeScope eval_mode(model);
  const int64_t K = std::max<int64_t>(opt.beam, 1);
  std::vector<Hypothesis> out(sources.size());
  const auto chunks = length_chunks(sources, K, opt.batch_tokens,
                                    [&](int64_t len) { return max_output_len(opt, len); });
  int64_t done = 0;
  for (const auto& chunk : chunks) {
    std::vector<std::vector<int32_t>> src_rows;
    for (size_t i : chunk) src_rows.push_back(sources[i]);
    const int64_t B = int64_t(chunk.size());
    torch::Tensor src_mask;
    const torch::Tensor memory_all = model.encode(padded(src_rows, device), &src_mask);
    const torch::Tensor mask_all = src_mask;
    // Each sentence's own limit (not the batch's longest): results do not depend on batching.
    std::vector<int64_t> limit;
    for (const auto& row : src_rows) limit.push_back(max_output_len(opt, int64_t(row.size())));
    const int64_t max_len = *std::max_element(limit.begin(), limit.end());

    // Per sentence: its beams (token prefixes on the CPU, without BOS) and cumulative scores.
    struct Beam {
      std::vector<int32_t> tokens;
      double log_prob;
    };
    std::vector<std::vector<Beam>> beams(size_t(B), std::vector<Beam>{{{}, 0.0}});
    std::vector<std::vector<Hypothesis>> finished(static_cast<size_t>(B));
    std::vector<int64_t> active(static_cast<size_t>(B));
    std::iota(active.begin(), active.end(), 0);
    for (int64_t step = 0; step <= max_len && !active.empty(); ++step) {
      // Rows: each active sentence's beams (step 0: one each); memory rows follow them.
      std::vector<std::vector<int32_t>> prefixes;
      std::vector<int64_t> memory_rows, row_start;
      for (int64_t s : active) {
        row_start.push_back(int64_t(prefixes.size()));
        for (const Beam& b : beams[size_t(s)]) {
          std::vector<int32_t> p{data::kBos};
          p.insert(p.end(), b.tokens.begin(), b.tokens.end());
          prefixes.push_back(std::move(p));
          memory_rows.push_back(s);
        }
      }
      const auto rows_t = torch::tensor(memory_rows, torch::kLong).to(device);
      const torch::Tensor logits =
          model.decode(padded(prefixes, device), memory_all.index_select(0, rows_t),
                       mask_all.index_select(0, rows_t));
      torch::Tensor lprobs =
          torch::log_softmax(logits.select(1, logits.size(1) - 1).to(torch::kFloat), -1);
      const int64_t V = lprobs.size(1);
      lprobs.index_fill_(
          1, torch::tensor({int64_t(data::kPad), int64_t(data::kBos)}, torch::kLong).to(device),
          -std::numeric_limits<float>::infinity());
      if (step < opt.min_len)
        lprobs.select(1, data::kEos).fill_(-std::numeric_limits<float>::infinity());
      const torch::Tensor lp = lprobs.to(torch::kDouble).cpu();
      const auto lpa = lp.accessor<double, 2>();
      std::vector<int64_t> still_active;
      for (size_t a = 0; a < active.size(); ++a) {
        const int64_t s = active[a];
        auto& sb = beams[size_t(s)];
        // The 2K best (beam, token) extensions of this sentence.
        struct Cand {
          double log_prob;
          int64_t beam, token;
        };
        std::vector<Cand> cands;
        cands.reserve(sb.size() * size_t(V));
        const bool only_eos = step >= limit[size_t(s)];  // the length limit: EOS is forced
        for (size_t b = 0; b < sb.size(); ++b)
          for (int64_t v = only_eos ? int64_t(data::kEos) : 0;
               v < (only_eos ? int64_t(data::kEos) + 1 : V); ++v) {
            const double l = lpa[row_start[a] + int64_t(b)][v];
            if (l != kNegInf) cands.push_back({sb[b].log_prob + l, int64_t(b), v});
          }
        const size_t take = std::min(cands.size(), size_t(2 * K));
        std::partial_sort(cands.begin(), cands.begin() + long(take), cands.end(),
                          [](const Cand& x, const Cand& y) { return x.log_prob > y.log_prob; });
        std::vector<Beam> next;
        auto& fin = finished[size_t(s)];
        for (size_t r = 0; r < take; ++r) {
          const Cand& c = cands[r];
          if (c.token == data::kEos) {
            // Only EOS among the best K candidates ends a hypothesis (as fairseq).
            if (r < size_t(K) && int64_t(fin.size()) < K) {
              Hypothesis h;
              h.tokens = sb[size_t(c.beam)].tokens;
              h.log_prob = c.log_prob;
              h.score = c.log_prob / std::pow(double(h.tokens.size() + 1), opt.lenpen);
              fin.push_back(std::move(h));
            }
          } else if (int64_t(next.size()) < K) {
            Beam nb{sb[size_t(c.beam)].tokens, c.log_prob};
            nb.tokens.push_back(int32_t(c.token));
            next.push_back(std::move(nb));
          }
        }
        if (int64_t(fin.size()) >= K || next.empty()) continue;
        sb = std::move(next);
        still_active.push_back(s);
      }
      active = std::move(still_active);
    }
    for (int64_t s = 0; s < B; ++s) {
      const auto& fin = finished[size_t(s)];
      auto best = std::max_element(
          fin.begin(), fin.end(),
          [](const Hypothesis& x, const Hypothesis& y) { return x.score < y.score; });
      if (best != fin.end()) out[chunk[size_t(s)]] = *best;
    }
    done += B;
    if (opt.on_progress) opt.on_progress(done, int64_t(sources.size()));
  }
  return out;
}

std::vector<double> sequence_log_probs(TransformerModelImpl& model,
                                       const std::vector<std::vector<int32_t>>& sources,
                                       const std::vector<std::vector<int32_t>>& hypotheses,
                                       const torch::Device& device, int64_t batch_tokens) {
  torch::NoGradGuard no_grad;
  EvalModeScope eval_mode(model);
  std::vector<double> out(sources.size());
  const auto chunks = length_chunks(sources, 1, batch_tokens, [&](int64_t) {
    int64_t longest = 0;
    for (const auto& h : hypotheses) longest = std::max(longest, int64_t(h.size()) + 1);
    return longest;
  });
  for (const auto& chunk : chunks) {
    std::vector<std::vector<int32_t>> src, tgt_in, tgt_out;
    for (size_t i : chunk) {
      src.push_back(sources[i]);
      tgt_in.push_back({data::kBos});
      tgt_in.back().insert(tgt_in.back().end(), hypotheses[i].begin(), hypotheses[i].end());
      tgt_out.push_back(hypotheses[i]);
      tgt_out.back().push_back(data::kEos);
    }
    const torch::Tensor logits = model.forward(padded(src, device), padded(tgt_in, device));
    const torch::Tensor target = padded(tgt_out, device);
    const torch::Tensor lp = torch::log_softmax(logits.to(torch::kDouble), -1)
                                 .gather(-1, target.unsqueeze(-1))
                                 .squeeze(-1);
    const torch::Tensor sums = lp.masked_fill(target.eq(data::kPad), 0.0).sum(1).cpu();
    for (size_t r = 0; r < chunk.size(); ++r) out[chunk[r]] = sums[int64_t(r)].item<double>();
  }
  return out;
}

}  // namespace normlab::eval
