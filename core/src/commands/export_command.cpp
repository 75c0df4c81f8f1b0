// `normlab export RUN --to DIR`: a run's weights as a PyTorch state_dict that plain `torch.load`
// opens, plus config.json and the tokenizer, for python/normlab_torch.py.
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "commands/commands.h"
#include "data/internal.h"
#include "eval/run_model.h"
#include "input_errors.h"
#include "normlab/data/dataset.h"
#include "normlab/interop_commands.h"
#include "normlab/manifest/experiment.h"
#include "normlab/model/norm.h"
#include "normlab/model/transformer_model.h"
#include "normlab/train/trainer.h"
#include "run/checkpoint.h"
#include "run/model_assembly.h"
#include "torch_api.h"
#include "train/run_directory.h"
#include "util/atomic_file.h"
#include "util/safetensors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab {
namespace {

// A bad RUN, --checkpoint or --to: one line, exit code 2.
class ExportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

fs::path choose_checkpoint(const fs::path& run, const std::string& which) {
  const fs::path dir = run / "checkpoints";
  static const std::regex kStep("step_[0-9]+");
  if (!which.empty() && which != "best" && which != "last" && !std::regex_match(which, kStep))
    throw ExportError(fmt::format("--checkpoint: expected best, last or step_N, got '{}'", which));
  if (which.empty()) {  // best when validation kept one, else last
    if (fs::exists(dir / "best.safetensors")) return dir / "best.safetensors";
    if (fs::exists(dir / "last.safetensors")) return dir / "last.safetensors";
    throw ExportError(fmt::format("{}: no checkpoint (best.safetensors or last.safetensors) yet{}",
                                  dir.string(), legacy_checkpoint_hint(run)));
  }
  const fs::path file = dir / (which + ".safetensors");
  if (!fs::exists(file)) {
    std::string have;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors")
        have += (have.empty() ? "" : ", ") + e.path().stem().string();
    throw ExportError(fmt::format("--checkpoint {}: {} does not exist (this run has: {}){}", which,
                                  file.string(), have.empty() ? "none" : have,
                                  legacy_checkpoint_hint(run)));
  }
  return file;
}

// `staging` becomes `to`: an existing `to` is moved aside first and removed after.
void publish_folder(const fs::path& staging, const fs::path& to) {
  std::error_code ec;
  const fs::path old =
      to.parent_path() / fmt::format(".{}.old.{}", to.filename().string(), ::getpid());
  const bool had = fs::exists(to, ec);
  if (had && !fs::is_directory(to, ec))
    throw ExportError(fmt::format("--to {}: exists and is not a folder", to.string()));
  if (had) fs::rename(to, old, ec);
  if (!ec) fs::rename(staging, to, ec);
  if (ec)
    throw ExportError(fmt::format("--to {}: cannot be replaced ({})", to.string(), ec.message()));
  util::sync_directory(to.parent_path());
  if (had) fs::remove_all(old, ec);
}

void write_bytes(const fs::path& file, const void* data, size_t size) {
  util::AtomicFile f(file);
  f.append(data, size);
  f.commit();
}

// A str → tensor dict in torch.save's zip format, so `torch.load` returns a dict. Written with the
// pickler that torch::pickle_save uses, but with untagged aggregates: a typed dict's type tag
// (torch.jit._pickle.restore_type_tag) is a global that torch.load(weights_only=True), the
// default since PyTorch 2.6, refuses.
void save_tensor_dict(const fs::path& file,
                      const std::vector<std::pair<std::string, torch::Tensor>>& items) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [k, t] : items) dict.insert(k, t.detach().to(torch::kCPU).contiguous().clone());
  std::vector<char> pickle, archive;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
      nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    archive.insert(archive.end(), static_cast<const char*>(data),
                   static_cast<const char*>(data) + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  write_bytes(file, archive.data(), archive.size());
}

// model.safetensors for --format hf (util/safetensors.h writes the format).
void save_safetensors(const fs::path& file, const util::TensorList& items,
                      const std::map<std::string, std::string>& metadata) {
  util::AtomicFile f(file);
  util::write_safetensors(f, items, metadata);
  f.commit();
}

const char* sharing_name(EmbeddingSharing s) {
  return s == EmbeddingSharing::All                  ? "all"
         : s == EmbeddingSharing::DecoderInputOutput ? "decoder"
                                                     : "none";
}

json norm_spec_json(const NormSpec& s) {
  return {{"kind", to_string(s.kind)},
          {"eps", s.eps},
          {"affine", s.affine},
          {"bias", s.bias},
          {"dyt_alpha0", s.dyt_alpha0},
          {"gain_init", s.gain_init},
          {"gain_scale", s.gain_scale},
          {"out_scale", s.out_scale},
          {"gain_per_head", s.gain_per_head},
          {"gain_from_query", s.gain_from_query}};
}

// Every norm module of the model by its state_dict prefix, with its full spec: schemes place norms
// of their own kinds and constants (nGPT's scaled L2 gains, LN-Scaling's 1/sqrt(l), ResiDual's
// eps), which the manifest's `norm` alone does not give.
json model_norms(TransformerModelImpl& model) {
  json norms = json::object();
  for (const auto& m : model.named_modules(/*name_prefix=*/"", /*include_self=*/false))
    if (const auto* norm = dynamic_cast<const NormImpl*>(m.value().get()))
      norms[m.key()] = norm_spec_json(norm->spec());
  return norms;
}

// config.json's description of the model: its shape, norms and scheme (parameters, scalar state,
// derived constants), what python/normlab_torch.py rebuilds it from.
json scheme_and_shape_json(const PluginRegistry& registry, const ExperimentSpec& spec,
                           const ModelConfig& cfg, TransformerModelImpl& model,
                           const std::string& scheme_name) {
  json params = json::object();
  const ParamView resolved = registry.resolve_params(spec.scheme.name, spec.scheme.params);
  for (const auto& [k, v] : resolved.values()) params[k] = param_json(v);
  json state = json::object();  // scalar scheme state, e.g. BranchNorm's updates_done
  for (const auto& [k, t] : model.scheme().state())
    if (t.numel() == 1)
      state[k] = t.is_floating_point() ? json(t.item<double>()) : json(t.item<int64_t>());
  json derived = json::array();
  for (const auto& d : model.scheme().derive())
    derived.push_back(
        {{"name", d.name}, {"where", d.where}, {"value", d.value}, {"formula", d.formula}});
  return {{"arch", to_string(cfg.arch)},
          {"family", to_string(cfg.family)},
          {"kv_heads", cfg.kv_head_count()},
          {"rope_theta", cfg.rope_theta},
          {"qk_norm_before_rope", model.scheme().qk_norm_before_rope()},
          // Issue 67.1's interventions (normlab_torch.py applies them; absent: off).
          {"qk_norm", cfg.qk_norm == QkNorm::RMS     ? "rms"
                      : cfg.qk_norm == QkNorm::Layer ? "layer"
                                                     : "none"},
          {"qk_norm_scope", cfg.qk_norm_all ? "all" : "head"},
          {"attn_logit_softcap", cfg.attn_logit_softcap},
          {"final_logit_softcap", cfg.final_logit_softcap},
          {"d_model", cfg.d_model},
          {"ffn_dim", cfg.ffn_dim},
          {"heads", cfg.heads},
          {"enc_layers", cfg.arch == Arch::EncDec ? cfg.enc_layers : 0},
          {"dec_layers", cfg.dec_layers},
          {"src_vocab", cfg.src_vocab},
          {"tgt_vocab", cfg.tgt_vocab},
          {"share_embeddings", sharing_name(cfg.sharing)},
          {"dropout", cfg.dropout},
          {"attention_dropout", cfg.attention_dropout},
          {"activation_dropout", cfg.activation_dropout},
          {"norm", to_string(cfg.norm.kind)},
          {"layer_norm_eps", cfg.norm.eps},
          {"norm_spec", norm_spec_json(cfg.norm)},
          {"norms", model_norms(model)},
          {"scheme",
           {{"name", scheme_name},
            {"params", params},
            {"state", state},
            {"status", model.scheme().status()},
            {"derived", derived}}}};
}

// Deterministic token ids in [4, vocab) (no specials but the ones placed on purpose).
torch::Tensor pattern_tokens(int64_t rows, int64_t cols, int64_t vocab, int64_t a, int64_t b) {
  auto r = torch::arange(rows, torch::kLong).unsqueeze(1),
       c = torch::arange(cols, torch::kLong).unsqueeze(0);
  return (r * a + c * b + 1) % std::max<int64_t>(vocab - 4, 1) + 4;
}

// The fixed input of --reference-logits and normlab's logits for it (eval mode): padding in one
// row of each side, so masks are exercised.
std::vector<std::pair<std::string, torch::Tensor>> reference_logits(TransformerModelImpl& model,
                                                                    const ModelConfig& cfg) {
  torch::NoGradGuard no_grad;
  model.eval();
  if (cfg.arch == Arch::LM) {
    auto tokens = pattern_tokens(3, 9, cfg.tgt_vocab, 5, 3);
    if (cfg.pad_id >= 0) tokens.index_put_({2, torch::indexing::Slice(6)}, cfg.pad_id);
    return {{"tokens", tokens}, {"logits", model.forward_lm(tokens)}};
  }
  auto src = pattern_tokens(3, 7, cfg.src_vocab, 5, 3);
  src.index_put_({2, torch::indexing::Slice(4)}, cfg.pad_id);
  src.index_put_({torch::indexing::Slice(0, 2), 6}, data::kEos);
  auto tgt_in = pattern_tokens(3, 6, cfg.tgt_vocab, 7, 2);
  tgt_in.index_put_({torch::indexing::Slice(), 0}, data::kBos);
  tgt_in.index_put_({1, torch::indexing::Slice(4)}, cfg.pad_id);
  return {{"src", src}, {"tgt_in", tgt_in}, {"logits", model.forward(src, tgt_in)}};
}

// The pieces of a SentencePiece model's pad, unk, bos and eos ids ("" where the model has none),
// read from its ModelProto in protobuf's wire format: pieces (1) each with its text (1), and the
// TrainerSpec (2) with unk_id (40), bos_id (41), eos_id (42), pad_id (43).
struct SpecialPieces {
  std::string pad, unk, bos, eos;
};

SpecialPieces special_pieces(std::string_view proto) {
  // Each field of one message: (number, wire type, varint value, bytes); false when malformed.
  const auto fields = [](std::string_view msg, const auto& field) {
    size_t at = 0;
    const auto varint = [&](uint64_t& v) {
      v = 0;
      for (int shift = 0; shift < 64 && at < msg.size(); shift += 7) {
        const auto b = static_cast<uint8_t>(msg[at++]);
        v |= uint64_t(b & 0x7f) << shift;
        if (!(b & 0x80)) return true;
      }
      return false;
    };
    while (at < msg.size()) {
      uint64_t key = 0, v = 0;
      std::string_view bytes;
      if (!varint(key)) return false;
      const uint64_t type = key & 7;
      if (type == 0) {
        if (!varint(v)) return false;
      } else if (type == 1 || type == 5) {
        const size_t n = type == 1 ? 8 : 4;
        if (msg.size() - at < n) return false;
        at += n;
      } else if (type == 2) {
        if (!varint(v) || v > msg.size() - at) return false;
        bytes = msg.substr(at, v);
        at += v;
      } else {
        return false;
      }
      field(key >> 3, type, v, bytes);
    }
    return true;
  };
  std::vector<std::string> pieces;
  int64_t ids[4] = {-1, 0, 1, 2};  // pad, unk, bos, eos: the proto's defaults
  const bool ok = fields(proto, [&](uint64_t n, uint64_t type, uint64_t, std::string_view bytes) {
    if (type != 2) return;
    if (n == 1) {
      std::string piece;
      fields(bytes, [&](uint64_t f, uint64_t t, uint64_t, std::string_view text) {
        if (f == 1 && t == 2) piece = std::string(text);
      });
      pieces.push_back(std::move(piece));
    } else if (n == 2) {
      fields(bytes, [&](uint64_t f, uint64_t t, uint64_t v, std::string_view) {
        if (t == 0 && f >= 40 && f <= 43)  // int32: -1 is a 64-bit two's complement varint
          ids[f == 43 ? 0 : f - 39] = static_cast<int32_t>(static_cast<uint32_t>(v));
      });
    }
  });
  const auto piece = [&](int64_t id) {
    return ok && id >= 0 && id < int64_t(pieces.size()) ? pieces[size_t(id)] : std::string();
  };
  return {piece(ids[0]), piece(ids[1]), piece(ids[2]), piece(ids[3])};
}

// For Hugging Face tools (issue 66.15): tokenizer_config.json naming transformers' own
// SentencePieceBackend (transformers >= 5), which encodes with the `sentencepiece` package on the
// whole text, as normlab does: `AutoTokenizer.from_pretrained(DIR)` loads it, no remote code. No
// special token is added or matched in the text ("</s>" is characters, as for normlab), and no BOS
// (normlab's language models start at EOS), so the ids are exactly the run's.
void write_hf_tokenizer(const fs::path& to, const std::string& model_bytes) {
  const SpecialPieces special = special_pieces(model_bytes);
  const auto token = [](const std::string& piece) { return piece.empty() ? json() : json(piece); };
  const json config = {{"tokenizer_class", "SentencePieceBackend"},
                       {"legacy", true},  // plain SentencePiece, its dummy prefix kept
                       {"split_special_tokens", true},
                       {"add_bos_token", false},
                       {"add_eos_token", false},
                       {"bos_token", nullptr},
                       {"eos_token", token(special.eos)},
                       {"unk_token", token(special.unk)},
                       {"pad_token", token(special.pad)},
                       {"clean_up_tokenization_spaces", false},
                       {"padding_side", "right"},
                       {"model_input_names", json::array({"input_ids", "attention_mask"})}};
  const std::string text = config.dump(2) + "\n";
  write_bytes(to / "tokenizer_config.json", text.data(), text.size());
}

// The tokenizer(s) next to the weights; config.json's "tokenizer" says what they are.
json export_tokenizers(const data::Dataset& ds, const data::DataConfig& dc, const fs::path& to) {
  const auto* src =
      dynamic_cast<const data::detail::SentencePieceTokenizer*>(ds.src_tokenizer.get());
  const auto* tgt =
      dynamic_cast<const data::detail::SentencePieceTokenizer*>(ds.tgt_tokenizer.get());
  if (dc.format != "text" && !tgt)  // shards that do not record their tokenizer
    return {{"type", "ids"},
            {"format", dc.format},
            {"vocab_size", ds.tgt_vocab},
            {"note", "the ids of the tokenizer the shards were made with; no padding id"}};
  if (!tgt) {
    return {{"type", "synthetic"},
            {"task", dc.task},
            {"symbols", dc.synthetic_vocab},
            {"note", "ids 4.. are the symbols w0 w1 …; 0 pad, 1 unk, 2 bos, 3 eos"}};
  }
  json j = {{"type", "sentencepiece"}};
  if (dc.format != "text") j["from"] = "the token shards' shards.json";
  if (!src || src == tgt) {
    write_bytes(to / "tokenizer.model", tgt->model_bytes().data(), tgt->model_bytes().size());
    j["model"] = "tokenizer.model";
    write_hf_tokenizer(to, tgt->model_bytes());
    j["hf_tokenizer"] = "tokenizer_config.json: transformers' SentencePieceBackend";
  } else {
    write_bytes(to / "tokenizer.src.model", src->model_bytes().data(), src->model_bytes().size());
    write_bytes(to / "tokenizer.tgt.model", tgt->model_bytes().data(), tgt->model_bytes().size());
    j["src_model"] = "tokenizer.src.model";
    j["tgt_model"] = "tokenizer.tgt.model";
  }
  return j;
}

// ---- --format hf: the HF transformers class a model is exactly (issues 46.13, 67.3, 68.2a) ----

// Where a llama-family layer normalizes, as the HF classes lay it out: Llama and Qwen3 before each
// sublayer (pre-ln), OLMo 2 on each sublayer's output (reordered-norm), Gemma 2 on both sides
// (peri-ln).
enum class HfLayout { PreNorm, OutputNorm, PeriNorm };

// A model as an HF class (`model_type` empty: none, `why_not` says why, each reason once).
struct HfModel {
  std::string model_type, architecture;
  std::vector<std::string> why_not;
  double rms_norm_eps = 1e-6;
  util::TensorList tensors;  // HF's names
  // HF name -> normlab's, or {from, scale, add} where a constant is folded in: normlab·scale + add
  json weights = json::object();
};

// The HF layout of `scheme`'s layer, or none (a reason added to `why`).
std::optional<HfLayout> hf_layout(const std::string& scheme, TransformerModelImpl& model,
                                  std::vector<std::string>& why) {
  if (scheme == "pre-ln" || scheme == "ln-scaling") return HfLayout::PreNorm;  // LNS: 1/√ℓ folded
  if (scheme == "mix-ln") {  // Pre-LN where ⌊α·L⌋ = 0
    for (const auto& d : model.scheme().derive())
      if (d.name == "post_ln_layers" && d.where == "decoder" && d.value > 0) {
        why.push_back(fmt::format(
            "scheme mix-ln has {} Post-LN layer(s) (floor(alpha*L)); HF Llama's are all Pre-LN",
            d.value));
        return std::nullopt;
      }
    return HfLayout::PreNorm;
  }
  if (scheme == "reordered-norm") return HfLayout::OutputNorm;
  if (scheme == "peri-ln" || scheme == "sandwich-ln") return HfLayout::PeriNorm;
  why.push_back(fmt::format(
      "scheme {} changes the layer: no HF class has it (Llama and Qwen3 have pre-ln's, "
      "ln-scaling's and mix-ln's without Post-LN layers; OLMo 2 reordered-norm's; Gemma 2 "
      "peri-ln's and sandwich-ln's)",
      scheme));
  return std::nullopt;
}

// The HF name of normlab parameter `name` in `layout`, or "" when the class has none. The body
// is HF's: no biases, half-split RoPE, SwiGLU down(silu(gate(x)) * up(x)) with up = fc1.
std::string hf_name(const std::string& name, HfLayout layout) {
  static const std::regex layer(R"(decoder\.layers\.(\d+)\.(.+))");
  static const std::map<std::string, std::string> body = {
      {"self_attn.q_proj.weight", "self_attn.q_proj.weight"},
      {"self_attn.k_proj.weight", "self_attn.k_proj.weight"},
      {"self_attn.v_proj.weight", "self_attn.v_proj.weight"},
      {"self_attn.out_proj.weight", "self_attn.o_proj.weight"},
      {"self_attn.q_qknorm.weight", "self_attn.q_norm.weight"},
      {"self_attn.k_qknorm.weight", "self_attn.k_norm.weight"},
      {"ffn.gate.weight", "mlp.gate_proj.weight"},
      {"ffn.fc1.weight", "mlp.up_proj.weight"},
      {"ffn.fc2.weight", "mlp.down_proj.weight"}};
  static const std::map<std::string, std::string> pre = {
      {"self_attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"}};
  static const std::map<std::string, std::string> output = {
      {"self_attn_out_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_out_norm.weight", "post_feedforward_layernorm.weight"}};
  static const std::map<std::string, std::string> peri = {
      {"self_attn_norm.weight", "input_layernorm.weight"},
      {"self_attn_out_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
      {"ffn_out_norm.weight", "post_feedforward_layernorm.weight"}};
  if (name == "decoder.embed_tokens.weight") return "model.embed_tokens.weight";
  if (name == "decoder.layer_norm.weight") return "model.norm.weight";
  if (name == "decoder.output_projection.weight") return "lm_head.weight";
  std::smatch m;
  if (!std::regex_match(name, m, layer)) return "";
  const auto& norms = layout == HfLayout::PreNorm      ? pre
                      : layout == HfLayout::OutputNorm ? output
                                                       : peri;
  for (const auto* names : {&body, &norms})
    if (const auto it = names->find(m[2].str()); it != names->end())
      return fmt::format("model.layers.{}.{}", m[1].str(), it->second);
  return "";
}

// Why model.qk_norm and the soft-caps keep `layout`'s class from the model (Qwen3: per-head
// RMSNorm; OLMo 2: RMSNorm over the whole projection; Gemma 2: none; only Gemma 2 caps logits).
void hf_interventions(const ModelConfig& cfg, HfLayout layout, std::vector<std::string>& why) {
  const bool rms = cfg.qk_norm == QkNorm::RMS, on = cfg.qk_norm != QkNorm::None;
  if (layout == HfLayout::PreNorm && on) {
    if (!rms) why.push_back("model.qk_norm = \"layer\": Qwen3's q/k norms are RMSNorms");
    if (cfg.qk_norm_all)
      why.push_back(
          "model.qk_norm_scope = \"all\": Qwen3's q/k norms are per head (OLMo 2's over the whole "
          "projection come with scheme reordered-norm)");
  }
  if (layout == HfLayout::OutputNorm) {
    if (!on)
      why.push_back(
          "model.qk_norm = \"none\": OLMo 2 normalizes q and k (qk_norm = \"rms\", "
          "qk_norm_scope = \"all\")");
    if (on && !rms) why.push_back("model.qk_norm = \"layer\": OLMo 2's q/k norms are RMSNorms");
    if (on && !cfg.qk_norm_all)
      why.push_back(
          "model.qk_norm_scope = \"head\": OLMo 2's q/k norms are over the whole projection "
          "(\"all\")");
  }
  if (layout == HfLayout::PeriNorm && on)
    why.push_back(
        "model.qk_norm: Gemma 2 has no q/k norm (Gemma 3's per-head ones are not mapped)");
  if (layout != HfLayout::PeriNorm) {
    const char* cls = layout == HfLayout::PreNorm ? "HF Llama and Qwen3 do" : "OLMo 2 does";
    if (cfg.attn_logit_softcap > 0)
      why.push_back(fmt::format(
          "model.attn_logit_softcap: {} not cap logits (Gemma 2 does, with scheme peri-ln)", cls));
    if (cfg.final_logit_softcap > 0)
      why.push_back(fmt::format(
          "model.final_logit_softcap: {} not cap logits (Gemma 2 does, with scheme peri-ln)", cls));
  }
}

// The model as the HF class it is exactly, constants folded into its tensors: a norm's out_scale
// (LN-Scaling's 1/√ℓ) and scaled gain into its gain, which Gemma 2 stores as γ − 1 (its RMSNorm
// multiplies by 1 + w); Gemma 2's input embedding, which it multiplies by √d, divided by √d (a
// tied output then gets the embedding itself as lm_head). Every reason it is no class otherwise.
HfModel hf_model(const ModelConfig& cfg, const std::string& scheme, TransformerModelImpl& model,
                 const util::TensorList& weights) {
  HfModel hf;
  auto& why = hf.why_not;
  if (cfg.family != Family::Llama || cfg.arch != Arch::LM) {
    why.push_back("only a language model of the llama family maps to an HF class");
    return hf;
  }
  const std::optional<HfLayout> layout = hf_layout(scheme, model, why);
  std::map<std::string, NormSpec> norms;  // by module name
  for (const auto& m : model.named_modules(/*name_prefix=*/"", /*include_self=*/false))
    if (const auto* norm = dynamic_cast<const NormImpl*>(m.value().get()))
      norms[m.key()] = norm->spec();
  std::set<std::string> kinds, gainless;
  std::set<double> eps;
  for (const auto& [name, s] : norms) {
    if (name.find("qknorm") != std::string::npos && s.kind != NormKind::RMSNorm) continue;
    if (s.kind != NormKind::RMSNorm)
      kinds.insert(to_string(s.kind));
    else if (!s.affine || s.gain_per_head || s.gain_from_query)
      gainless.insert(name);
    eps.insert(s.eps);
  }
  if (!kinds.empty())
    why.push_back(fmt::format("norm kind {}: HF's classes use RMSNorm", fmt::join(kinds, ", ")));
  if (!gainless.empty())
    why.push_back(
        fmt::format("{}: not one gain per channel as HF's RMSNorm has", fmt::join(gainless, ", ")));
  if (!layout) return hf;
  hf_interventions(cfg, *layout, why);
  if (eps.size() > 1)
    why.push_back(fmt::format("norms of different eps ({}): HF's classes have one rms_norm_eps",
                              fmt::join(eps, ", ")));
  if (cfg.rope_theta <= 0) why.push_back("model.rope_theta 0: HF's classes use rotary positions");
  std::vector<std::string> strays;  // the biases of norms of another kind are said above
  for (const auto& [name, t] : weights) {
    const auto norm = norms.find(name.substr(0, name.rfind('.')));
    if (name == "decoder.embed_norm.weight")
      why.push_back("scheme.embedding_norm: Gemma 2 does not normalize the embedding");
    else if (hf_name(name, *layout).empty() &&
             !(norm != norms.end() && norm->second.kind != NormKind::RMSNorm))
      strays.push_back(name);
  }
  if (!strays.empty())
    why.push_back(fmt::format(
        "{}{} without counterpart in HF's class",
        fmt::join(strays.begin(), strays.begin() + std::min<size_t>(3, strays.size()), ", "),
        strays.size() > 3 ? fmt::format(" (and {} more)", strays.size() - 3) : ""));
  if (!why.empty()) return hf;

  const bool gemma = *layout == HfLayout::PeriNorm;
  const bool qk = cfg.qk_norm != QkNorm::None;
  static const std::map<std::pair<HfLayout, bool>, std::pair<const char*, const char*>> kClass = {
      {{HfLayout::PreNorm, false}, {"llama", "LlamaForCausalLM"}},
      {{HfLayout::PreNorm, true}, {"qwen3", "Qwen3ForCausalLM"}},
      {{HfLayout::OutputNorm, true}, {"olmo2", "Olmo2ForCausalLM"}},
      {{HfLayout::PeriNorm, false}, {"gemma2", "Gemma2ForCausalLM"}}};
  std::tie(hf.model_type, hf.architecture) = kClass.at({*layout, qk});
  hf.rms_norm_eps = eps.empty() ? cfg.norm.eps : *eps.begin();
  // hf = normlab · scale + add, in double and rounded once.
  const auto add = [&](const std::string& from, const torch::Tensor& t, double scale,
                       double shift) {
    const std::string to = from == "lm_head" ? "lm_head.weight" : hf_name(from, *layout);
    const std::string source = from == "lm_head" ? "decoder.embed_tokens.weight" : from;
    if (scale == 1.0 && shift == 0.0) {
      hf.tensors.emplace_back(to, t);
      hf.weights[to] = source;
      return;
    }
    hf.tensors.emplace_back(to, (t.to(torch::kDouble) * scale + shift).to(t.scalar_type()));
    hf.weights[to] = {{"from", source}, {"scale", scale}, {"add", shift}};
  };
  bool tied = true;
  for (const auto& [name, t] : weights) {
    const std::string module = name.substr(0, name.rfind('.'));
    if (const auto it = norms.find(module); it != norms.end()) {
      const NormSpec& s = it->second;
      const double gain = s.out_scale * (s.gain_scale != 0 ? s.gain_init / s.gain_scale : 1.0);
      add(name, t, gain, gemma ? -1.0 : 0.0);
    } else if (gemma && name == "decoder.embed_tokens.weight") {
      // Gemma 2 multiplies by √d in float32 (its embed_scale buffer).
      add(name, t, 1.0 / double(static_cast<float>(std::sqrt(double(cfg.d_model)))), 0.0);
    } else {
      add(name, t, 1.0, 0.0);
    }
    if (name == "decoder.output_projection.weight") tied = false;
  }
  if (gemma && tied)
    for (const auto& [name, t] : weights)
      if (name == "decoder.embed_tokens.weight") add("lm_head", t, 1.0, 0.0);
  return hf;
}

// config.json's fields that transformers' config class of `hf` reads.
json hf_config(const HfModel& hf, const ModelConfig& cfg, const data::Dataset& ds,
               int64_t lm_block) {
  const auto id = [](int64_t v) { return v >= 0 ? json(v) : json(nullptr); };
  const int64_t positions = std::max<int64_t>(lm_block, 2048);
  const bool gemma = hf.model_type == "gemma2";
  json c = {{"model_type", hf.model_type},
            {"architectures", json::array({hf.architecture})},
            {"vocab_size", cfg.tgt_vocab},
            {"hidden_size", cfg.d_model},
            {"intermediate_size", cfg.ffn_dim},
            {"num_hidden_layers", cfg.dec_layers},
            {"num_attention_heads", cfg.heads},
            {"num_key_value_heads", cfg.kv_head_count()},
            {"head_dim", cfg.d_model / cfg.heads},
            {gemma ? "hidden_activation" : "hidden_act", "silu"},
            {"max_position_embeddings", positions},
            {"rms_norm_eps", hf.rms_norm_eps},
            {"rope_theta", cfg.rope_theta},
            {"attention_bias", false},
            {"mlp_bias", false},
            // Gemma 2 scales the input embedding, so its lm_head is never the embedding tensor.
            {"tie_word_embeddings", !gemma && cfg.sharing != EmbeddingSharing::None},
            {"torch_dtype", "float32"},
            {"pad_token_id", id(ds.pad_id)},
            {"bos_token_id", ds.pad_id < 0 ? json(nullptr) : json(data::kBos)},
            {"eos_token_id", id(ds.eos_id)}};
  if (hf.model_type == "qwen3" || gemma) {  // every layer full attention
    c["layer_types"] = std::vector<std::string>(size_t(cfg.dec_layers), "full_attention");
    c["use_sliding_window"] = false;
    // transformers 4's Gemma 2 slides every other layer whatever layer_types: a window of the
    // whole context is no window there.
    c["sliding_window"] = gemma ? json(positions) : json(nullptr);
  }
  if (gemma) {
    c["query_pre_attn_scalar"] = cfg.d_model / cfg.heads;  // scores · head_dim^-1/2, as normlab
    const auto cap = [](double s) { return s > 0 ? json(s) : json(nullptr); };
    c["attn_logit_softcapping"] = cap(cfg.attn_logit_softcap);
    c["final_logit_softcapping"] = cap(cfg.final_logit_softcap);
  }
  return c;
}

// What HuggingFace tools look for in config.json: the class's fields for a model that is one,
// else model_type normlab and every reason it is none.
void add_hf_fields(json& config, const HfModel& hf, const ModelConfig& cfg, const data::Dataset& ds,
                   const ExperimentSpec& spec) {
  if (!hf.model_type.empty()) {
    config.update(hf_config(hf, cfg, ds, spec.data.lm_block));
    config["weight_names"] = "hf-" + hf.model_type;
    config["hf_weights"] = hf.weights;  // normlab_torch maps them back
    return;
  }
  config["model_type"] = "normlab";
  config["model_type_note"] =
      fmt::format("not HF Llama, Qwen3, OLMo 2 or Gemma 2: {}", fmt::join(hf.why_not, "; "));
  config["architectures"] = json::array({"NormlabTransformer"});
  config["torch_dtype"] = "float32";
}

// `--to` is new, empty or an earlier export holding only what export writes: a user's other files
// (harness results, notes) in it are not replaced.
void check_replaceable(const fs::path& to, const fs::path& final_to) {
  std::error_code ec;
  if (fs::exists(final_to, ec) && !(fs::is_directory(final_to, ec) && fs::is_empty(final_to, ec))) {
    std::ifstream cf(final_to / "config.json");
    const json old = json::parse(cf, nullptr, /*allow_exceptions=*/false);
    if (!(old.is_object() && old.value("format", "") == "normlab-export"))
      throw ExportError(
          fmt::format("--to {}: exists and is not a normlab export (replacing it would lose its "
                      "files); choose a new or empty folder",
                      to.string()));
    // An export a user kept other files in (harness results, notes) is not replaced.
    static const std::set<std::string> exported = {"config.json",         "model.pt",
                                                   "model.safetensors",   "reference.pt",
                                                   "tokenizer.model",     "tokenizer.src.model",
                                                   "tokenizer.tgt.model", "tokenizer_config.json"};
    std::vector<std::string> others;
    for (const auto& e : fs::directory_iterator(final_to, ec))
      if (!exported.count(e.path().filename().string()))
        others.push_back(e.path().filename().string());
    std::sort(others.begin(), others.end());
    if (!others.empty())
      throw ExportError(fmt::format(
          "--to {}: a normlab export that also holds {} (not written by export: replacing "
          "it would lose them); move them, or choose a new or empty folder",
          to.string(), fmt::join(others, ", ")));
  }
}

}  // namespace

int export_command(const ExportOptions& opt, std::ostream& out, std::ostream& err) {
  try {
    return reporting_input_errors(err, [&]() -> int {
      const fs::path run(opt.run_dir);
      const fs::path manifest = run / "manifest.resolved.toml";
      if (!fs::is_regular_file(manifest))
        throw ExportError(
            fmt::format("{}: not a run directory (no manifest.resolved.toml)", run.string()));
      if (opt.to.empty()) throw ExportError("--to: an output directory is needed");
      const bool hf = opt.format == "hf";
      if (!hf && opt.format != "torch")
        throw ExportError(fmt::format("--format: expected torch or hf, got '{}'", opt.format));
      const fs::path checkpoint = choose_checkpoint(run, opt.checkpoint);

      // The run's own run.plugin_path too (an out-of-tree scheme), as eval and ablate find it.
      PluginRegistry registry(eval::run_plugin_paths(run, opt.plugin_paths));
      const ExperimentSpec spec = load_manifest(
          manifest.string(), eval::resolved_manifest_overrides(manifest, run), &registry);
      std::ostringstream data_log;  // the data summary is noise here
      const data::Dataset ds = data::load_dataset(spec.data, data_log);
      const ModelSpec model_of_run = model_spec(spec, ds);
      const ModelConfig& cfg = model_of_run.config;
      const AssembledModel scheme = assemble_model(model_of_run, registry);
      TransformerModel model = scheme.model;
      verify_checksum(checkpoint, opt.allow_unverified);
      // What ships is the run's: its data and tokenizer as the checkpoint recorded them (66.6/7).
      eval::check_run_data({checkpoint}, ds, /*other_run=*/false, /*all_tokens=*/false, err);
      load_model_weights(checkpoint, *model);
      const int64_t updates = checkpoint_updates(checkpoint);
      model->eval();

      std::error_code ec;
      // Everything goes into a staging folder beside --to, renamed into place at the end: a killed
      // export never leaves new weights beside an old config.json.
      const fs::path to(opt.to);
      const fs::path final_to = fs::weakly_canonical(fs::absolute(to));
      check_replaceable(to, final_to);
      const fs::path staging = final_to.parent_path() /
                               fmt::format(".{}.tmp.{}", final_to.filename().string(), ::getpid());
      fs::create_directories(final_to.parent_path(), ec);
      fs::remove_all(staging, ec);
      fs::create_directories(staging, ec);
      if (ec)
        throw ExportError(fmt::format("--to {}: cannot create it ({})", to.string(), ec.message()));
      struct Cleanup {
        fs::path dir;
        ~Cleanup() {
          std::error_code e;
          fs::remove_all(dir, e);
        }
      } cleanup{staging};

      std::vector<std::pair<std::string, torch::Tensor>> weights;
      for (const auto& p : model->named_parameters(/*recurse=*/true))
        weights.emplace_back(p.key(), p.value());
      for (const auto& b : model->named_buffers(/*recurse=*/true))
        weights.emplace_back(b.key(), b.value());
      const std::string weights_file = hf ? "model.safetensors" : "model.pt";
      const HfModel hf_class = hf ? hf_model(cfg, scheme.scheme_name, *model, weights) : HfModel{};
      if (!hf)
        save_tensor_dict(staging / weights_file, weights);
      else
        save_safetensors(staging / weights_file,
                         hf_class.model_type.empty() ? weights : hf_class.tensors,
                         {{"format", "pt"}});

      json config = scheme_and_shape_json(registry, spec, cfg, *model, scheme.scheme_name);
      config.update({
          {"format", "normlab-export"},
          {"format_version", 2},  // 2: adds norm_spec and norms (version 1 had LayerNorms only)
          {"weights", weights_file},
          {"special_ids", ds.pad_id < 0
                              ? json{{"pad", nullptr},
                                     {"unk", nullptr},
                                     {"bos", nullptr},
                                     {"eos", ds.eos_id >= 0 ? json(ds.eos_id) : json(nullptr)}}
                              : json{{"pad", data::kPad},
                                     {"unk", data::kUnk},
                                     {"bos", data::kBos},
                                     {"eos", data::kEos}}},
          // Relative to the run, and the run's folder name: a published folder names no path of
          // this machine (issue 66.22).
          {"checkpoint",
           {{"file", (fs::path("checkpoints") / checkpoint.filename()).generic_string()},
            {"run", (fs::absolute(run) / "").lexically_normal().parent_path().filename().string()},
            {"updates", updates}}},
          {"tokenizer", export_tokenizers(ds, spec.data, staging)},
          // the run's output length limit a·src_len + b (normlab translate's default)
          {"decoding", {{"max_len_a", spec.eval.max_len_a}, {"max_len_b", spec.eval.max_len_b}}},
      });
      if (hf) add_hf_fields(config, hf_class, cfg, ds, spec);
      if (opt.reference_logits) {
        save_tensor_dict(staging / "reference.pt", reference_logits(*model, cfg));
        config["reference"] = "reference.pt";
      }
      const std::string text = config.dump(2) + "\n";
      write_bytes(staging / "config.json", text.data(), text.size());
      publish_folder(staging, final_to);
      fmt::print(out, "exported {} (update {}, scheme {}, {} tensors) to {}\n", checkpoint.string(),
                 updates, scheme.scheme_name, weights.size(), to.string());
      return 0;
    });
  } catch (const ExportError& e) {
    fmt::print(err, "normlab: error: {}\n", e.what());
    return kExitBadInput;
  } catch (const eval::RunInputError& e) {  // an unreadable manifest.resolved.toml
    fmt::print(err, "normlab: error: {}\n", e.what());
    return kExitBadInput;
  } catch (const std::runtime_error& e) {  // an unreadable checkpoint or an unwritable --to
    fmt::print(err, "normlab: error: {}\n", e.what());
    return kExitFailed;
  }
}

}  // namespace normlab
