// normlab scheme SDK — model geometry as a scheme sees it.
#pragma once

#include <stdexcept>
#include <string>

#include "normlab/sdk/norm.h"

namespace normlab {

enum class Arch { EncDec, LM };
enum class Stack { Encoder, Decoder };
enum class Sublayer { SelfAttn, CrossAttn, FFN };
// The model family: which activation, positions and biases the core builds around a scheme.
//   Transformer: fairseq's (Vaswani et al. 2017): ReLU FFN fc2(ReLU(fc1 x)), sinusoidal positions,
//                √d-scaled embeddings, biases on every projection.
//   Llama:       LLaMA's (Touvron et al. 2023): SwiGLU FFN fc2(SiLU(gate x) ⊙ fc1 x), rotary
//                positions on q and k, unscaled embeddings, no biases (decoder-only here).
enum class Family { Transformer, Llama };

inline const char* to_string(Arch a) { return a == Arch::EncDec ? "encdec" : "lm"; }
inline const char* to_string(Family f) { return f == Family::Llama ? "llama" : "transformer"; }
inline const char* to_string(Stack s) { return s == Stack::Encoder ? "encoder" : "decoder"; }
inline const char* to_string(Sublayer s) {
  switch (s) {
    case Sublayer::SelfAttn:
      return "self_attn";
    case Sublayer::CrossAttn:
      return "cross_attn";
    case Sublayer::FFN:
      return "ffn";
  }
  return "?";
}

// The whole model. For Arch::LM only the decoder stack exists (dec_layers, no cross-attention).
struct ModelGeometry {
  Arch arch = Arch::EncDec;
  int enc_layers = 6;  // N
  int dec_layers = 6;  // M
  int d_model = 512;
  int heads = 8;
  int ffn_dim = 2048;
  NormSpec norm;  // the manifest's norm kind (`scheme.norm`), used by add_layer_norm
  Family family = Family::Transformer;
  int kv_heads = 0;  // key/value heads (grouped-query attention); 0 = heads

  // Whether the FFN has a gate projection (SwiGLU: ffn.gate) and the projections biases.
  bool gated_ffn() const { return family == Family::Llama; }
  bool has_biases() const { return family == Family::Transformer; }

  bool has_stack(Stack s) const { return s == Stack::Decoder || arch == Arch::EncDec; }
  int layers(Stack s) const { return s == Stack::Encoder ? enc_layers : dec_layers; }
  // A decoder layer of an encoder-decoder model has SA, CA, FFN; every other layer SA, FFN.
  int sublayers_per_layer(Stack s) const {
    return (s == Stack::Decoder && arch == Arch::EncDec) ? 3 : 2;
  }
  // Residual sublayers in one stack (Admin's n).
  int residual_sublayers(Stack s) const { return layers(s) * sublayers_per_layer(s); }
};

// One layer of one stack.
struct LayerGeometry {
  ModelGeometry model;
  Stack stack = Stack::Encoder;
  int index = 0;  // 0-based position in its stack

  int stack_layers() const { return model.layers(stack); }
  int num_sublayers() const { return model.sublayers_per_layer(stack); }
  bool has_cross_attn() const { return num_sublayers() == 3; }
  // Sublayers in forward order: SA, [CA], FFN.
  Sublayer sublayer(int i) const {
    if (i == 0) return Sublayer::SelfAttn;
    if (i == 1 && has_cross_attn()) return Sublayer::CrossAttn;
    if (i == num_sublayers() - 1) return Sublayer::FFN;
    throw std::out_of_range("sublayer index " + std::to_string(i));
  }
};

}  // namespace normlab
