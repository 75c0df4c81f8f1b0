#include "model_config.h"

namespace normlab {

ModelConfig model_config(const ExperimentSpec& spec, const data::Dataset& ds) {
  ModelConfig c;
  c.arch = spec.model.arch == "lm" ? Arch::LM : Arch::EncDec;
  c.d_model = spec.model.d_model;
  c.ffn_dim = spec.model.ffn_dim;
  c.heads = spec.model.heads;
  c.enc_layers = spec.model.enc_layers;
  c.dec_layers = spec.model.dec_layers;
  c.dropout = spec.model.dropout;
  c.attention_dropout = spec.model.attention_dropout;
  c.activation_dropout = spec.model.activation_dropout;
  c.src_vocab = c.arch == Arch::EncDec ? ds.src_vocab : 0;
  c.tgt_vocab = ds.tgt_vocab;
  const std::string& sh = spec.model.share_embeddings;
  c.sharing = sh == "all" ? EmbeddingSharing::All : sh == "decoder" ? EmbeddingSharing::DecoderInputOutput
                                                                    : EmbeddingSharing::None;
  c.pad_id = data::kPad;
  // The manifest's choices were validated against the same names.
  c.norm = NormSpec::of(parse_norm_kind(spec.scheme.norm).value_or(NormKind::LayerNorm));
  c.norm.eps = spec.scheme.norm_eps;
  return c;
}

}  // namespace normlab
