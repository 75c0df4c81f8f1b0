// Batched beam search for encoder-decoder models, as fairseq's SequenceGenerator decides: the
// 2·beam best extensions per step, EOS among the best `beam` candidates finalizes a hypothesis
// scored sum(log p) / len^lenpen (len counts EOS), a sentence stops at `beam` finished
// hypotheses, EOS is forced at max_len = a·src_len + b. The decoder reruns on the growing prefix.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "normlab/model/transformer_model.h"
#include "torch_api.h"

namespace normlab::eval {

struct BeamOptions {
  int64_t beam = 5;
  double lenpen = 1.0;
  double max_len_a = 0.0;  // fairseq's defaults: at most 200 tokens
  int64_t max_len_b = 200;
  int64_t min_len = 1;          // EOS is not allowed before this many tokens (fairseq: 1)
  int64_t batch_tokens = 8000;  // sentences × beam × (src + output length) per batch
  // After each batch: sentences decoded so far, of all (for a progress line).
  std::function<void(int64_t done, int64_t total)> on_progress;
};

struct Hypothesis {
  std::vector<int32_t> tokens;  // without BOS and EOS
  double score = 0;             // log_prob / (tokens + 1)^lenpen
  double log_prob = 0;          // sum of log p over the tokens and EOS
};

// The best hypothesis for each of `sources` (each ending with EOS), in input order.
std::vector<Hypothesis> beam_search(TransformerModelImpl& model,
                                    const std::vector<std::vector<int32_t>>& sources,
                                    const torch::Device& device, const BeamOptions& opt);

// sum log p(hyp + EOS | src) under the model (teacher forcing), one per pair: the model score of
// any decoder's output, to compare decoders.
std::vector<double> sequence_log_probs(TransformerModelImpl& model,
                                       const std::vector<std::vector<int32_t>>& sources,
                                       const std::vector<std::vector<int32_t>>& hypotheses,
                                       const torch::Device& device, int64_t batch_tokens = 8000);

}  // namespace normlab::eval
