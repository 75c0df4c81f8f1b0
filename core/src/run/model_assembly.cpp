#include "run/model_assembly.h"

#include <chrono>

#include "normlab/model/projection.h"
#include "normlab/plugins/registry.h"

namespace normlab {

ModelConfig model_config(const ExperimentSpec& spec, const data::Dataset& ds) {
  ModelConfig c;
  c.arch = spec.model.arch == "lm" ? Arch::LM : Arch::EncDec;
  c.family = spec.model.family == "llama" ? Family::Llama : Family::Transformer;
  c.kv_heads = spec.model.kv_heads;
  c.rope_theta = spec.model.rope_theta;
  c.init_std = spec.model.init_std;
  c.scaled_init = spec.model.scaled_init;
  c.qk_norm = spec.model.qk_norm == "rms"     ? QkNorm::RMS
              : spec.model.qk_norm == "layer" ? QkNorm::Layer
                                              : QkNorm::None;
  c.qk_norm_all = spec.model.qk_norm_scope == "all";
  c.attn_logit_softcap = spec.model.attn_logit_softcap;
  c.final_logit_softcap = spec.model.final_logit_softcap;
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
  c.sharing = sh == "all"       ? EmbeddingSharing::All
              : sh == "decoder" ? EmbeddingSharing::DecoderInputOutput
                                : EmbeddingSharing::None;
  c.pad_id = ds.pad_id;  // -1 for token shards: no id is padding
  // The manifest's choices were validated against the same names.
  c.norm = NormSpec::of(parse_norm_kind(spec.scheme.norm).value_or(NormKind::LayerNorm));
  c.norm.eps = spec.scheme.norm_eps;
  return c;
}

ModelSpec model_spec(const ExperimentSpec& spec, const data::Dataset& ds) {
  return {model_config(spec, ds), spec.scheme.name, spec.scheme.params, spec.run.init_on_cpu};
}

ModelSpec model_spec(const ModelGeometry& g, const std::string& scheme, int64_t vocab,
                     double dropout) {
  ModelSpec m;
  m.config.arch = g.arch;
  m.config.family = g.family;
  m.config.kv_heads = g.kv_heads;
  m.config.norm = g.norm;
  m.config.d_model = g.d_model;
  m.config.ffn_dim = g.ffn_dim;
  m.config.heads = g.heads;
  m.config.enc_layers = g.arch == Arch::LM ? 0 : g.enc_layers;
  m.config.dec_layers = g.dec_layers;
  m.config.src_vocab = m.config.tgt_vocab = vocab;
  m.config.dropout = dropout;
  m.scheme = scheme;
  return m;
}

AssembledModel assemble_model(const ModelSpec& spec, const PluginRegistry& registry,
                              const torch::Device& device) {
  SchemeHandle scheme = registry.create(spec.scheme, spec.scheme_params, spec.config.geometry());
  AssembledModel out;
  out.scheme_name = scheme.name;
  out.scheme_file = scheme.file;
  using Clock = std::chrono::steady_clock;
  out.built_on = spec.init_on_cpu ? torch::Device(torch::kCPU) : device;
  const auto t0 = Clock::now();
  {
    const ScopedParameterDevice building_on(out.built_on);
    out.model = TransformerModel(spec.config, std::move(scheme));
  }
  const auto t1 = Clock::now();
  out.model->to(device);
  out.build_seconds = std::chrono::duration<double>(t1 - t0).count();
  out.move_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  out.model->train();
  for (const auto& p : out.model->parameters()) out.parameters += p.numel();
  return out;
}

}  // namespace normlab
