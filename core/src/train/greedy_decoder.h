// Greedy decoding for validation BLEU (batched; the decoder reruns on the growing prefix).
#pragma once

#include <vector>

#include "normlab/data/dataset.h"
#include "normlab/model/transformer_model.h"
#include "torch_api.h"

namespace normlab {

// Hypotheses (token ids without BOS/EOS) for `sources` (each ending with EOS), in input order.
// Output length is limited to int(a·|src| + b) tokens per sentence, as fairseq computes it.
std::vector<std::vector<int32_t>> greedy_decode(TransformerModelImpl& model,
                                                const std::vector<std::vector<int32_t>>& sources,
                                                const torch::Device& device, double max_len_a,
                                                int64_t max_len_b, int64_t max_tokens);

}  // namespace normlab
