// Model hyper-parameters (what `[model]` in a manifest resolves to).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "normlab/sdk/geometry.h"

namespace normlab {

enum class EmbeddingSharing {
  None,                // separate source, target and output matrices
  DecoderInputOutput,  // target embedding = output projection
  All,                 // one matrix for source, target and output (joint vocabulary)
};

// model.qk_norm (issue 67.1): a norm on q and k after their projections, before RoPE (Dehghani et
// al. 2023; Wortsman et al. 2023; Qwen3/Gemma 3 per head, OLMo 2 over the whole projection).
enum class QkNorm { None, RMS, Layer };

// A scheme that places q/k norms of its own (HybridNorm, nGPT) refuses model.qk_norm: the model's
// constructor throws this; the run names the manifest and key.
struct QkNormConflict : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct ModelConfig {
  Arch arch = Arch::EncDec;
  Family family = Family::Transformer;  // what the core builds around the scheme (sdk/geometry.h)
  int64_t d_model = 512;
  int64_t ffn_dim = 2048;
  int64_t heads = 8;
  int64_t enc_layers = 6;
  int64_t dec_layers = 6;
  double dropout = 0.1;             // residual dropout on each branch output, and on embeddings
  double attention_dropout = 0.0;   // on attention probabilities
  double activation_dropout = 0.0;  // after the FFN's ReLU
  int64_t src_vocab = 0;            // unused for Arch::LM
  int64_t tgt_vocab = 0;
  EmbeddingSharing sharing = EmbeddingSharing::None;
  int64_t pad_id = 0;
  NormSpec norm;  // the kind of the norms a scheme places with add_layer_norm (`scheme.norm`)
  // Llama family only:
  int64_t kv_heads = 0;  // key/value heads, a divisor of heads (grouped-query attention); 0 = heads
  double rope_theta = 10000;  // rotary positions' base θ (Su et al. 2021; LLaMA: 10000)
  double init_std =
      0.02;  // every projection and embedding ~ N(0, init_std²) (HF LlamaPreTrainedModel)
  bool scaled_init = false;  // out_proj and fc2 ~ N(0, (init_std/√(2L))²) (GPT-2, Megatron, OLMo)
  // Interventions orthogonal to the scheme (issue 67.1), either family:
  QkNorm qk_norm = QkNorm::None;
  bool qk_norm_all = false;         // over the whole q and k projections (OLMo 2), else per head
  double attn_logit_softcap = 0.0;  // s·tanh(x/s) on q·kᵀ/√dh before mask and softmax; 0 = off
  double final_logit_softcap = 0.0;  // s·tanh(x/s) on the output logits (Gemma 2); 0 = off

  int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }

  ModelGeometry geometry() const {
    ModelGeometry g;
    g.arch = arch;
    g.enc_layers = arch == Arch::EncDec ? int(enc_layers) : 0;
    g.dec_layers = int(dec_layers);
    g.d_model = int(d_model);
    g.heads = int(heads);
    g.ffn_dim = int(ffn_dim);
    g.norm = norm;
    g.family = family;
    g.kv_heads = int(kv_head_count());
    return g;
  }
};

}  // namespace normlab
