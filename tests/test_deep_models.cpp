// Deep models: every scheme at 100 layers, a 1000-layer model, stable parameter names.
#include <chrono>

#include "model/fused_attention.h"
#include "normlab/model/attention.h"
#include "speed_levers.h"
#include "test_support.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_deep_models {

using namespace normlab;

namespace {

double fwd_bwd(TransformerModelImpl& model, Arch arch, int64_t B, int64_t T) {
  auto src = torch::randint(1, 50, {B, T}, torch::kLong);
  auto tgt = torch::randint(1, 50, {B, T + 1}, torch::kLong);
  model.run_setup_pass([&] {
    arch == Arch::LM ? model.forward_lm(tgt.narrow(1, 0, T))
                     : model.forward(src, tgt.narrow(1, 0, T));
  });
  model.on_update(0);
  auto logits = arch == Arch::LM ? model.forward_lm(tgt.narrow(1, 0, T))
                                 : model.forward(src, tgt.narrow(1, 0, T));
  auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 50}),
                                                   tgt.narrow(1, 1, T).reshape({-1}));
  loss.backward();
  return loss.item<double>();
}

}  // namespace

TEST_SUITE("deep_models") {
  TEST_CASE("a 100-layer model of each scheme runs forward and backward on CPU") {
    for (const auto* info : test::builtin_registry().plugins()) {
      for (Arch arch : {Arch::EncDec, Arch::LM}) {
        CAPTURE(info->name);
        CAPTURE(to_string(arch));
        torch::manual_seed(1);
        // encdec 50L-50L = 100 layers; LM 100 layers.
        ModelConfig cfg = test::small_config(arch, 50, arch == Arch::LM ? 100 : 50);
        cfg.dropout = 0.1;
        auto model = test::make_model(info->name, cfg);
        model->train();
        const double loss = fwd_bwd(*model, arch, 4, 8);
        CHECK(std::isfinite(loss));
        int64_t with_grad = 0, total = 0;
        bool finite = true;
        for (const auto& p : model->parameters()) {
          ++total;
          if (!p.grad().defined()) continue;
          ++with_grad;
          finite = finite && torch::isfinite(p.grad()).all().item<bool>();
        }
        CHECK(finite);
        // Every parameter takes part (Admin's omegas too); BranchNorm's first update has alpha_1 >
        // 0.
        CHECK(with_grad == total);
      }
    }
  }

  TEST_CASE("1000 layers in total (asymmetric 600L-400L), forward and backward") {
    torch::manual_seed(2);
    ModelConfig cfg = test::small_config(Arch::EncDec, 600, 400, 8, 2, 16);
    auto t0 = std::chrono::steady_clock::now();
    auto model = test::make_model("deepnorm", cfg);
    const double build_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("built 600L-400L in " << build_s << " s");
    CHECK(model->encoder->num_layers() == 600);
    CHECK(model->decoder->num_layers() == 400);
    CHECK(std::isfinite(fwd_bwd(*model, Arch::EncDec, 2, 4)));
  }

  TEST_CASE("parameter names are stable and address sublayers") {
    ModelConfig cfg = test::small_config(Arch::EncDec, 2, 8);
    auto model = test::make_model("post-ln", cfg);
    auto names = model->named_parameters().keys();
    auto has = [&](const std::string& n) {
      return std::find(names.begin(), names.end(), n) != names.end();
    };
    CHECK(has("decoder.layers.7.cross_attn.v_proj.weight"));
    CHECK(has("decoder.layers.7.self_attn.q_proj.bias"));
    CHECK(has("encoder.layers.1.ffn.fc2.weight"));
    CHECK(has("encoder.layers.1.ffn_norm.weight"));
    CHECK(has("decoder.layers.0.cross_attn_norm.bias"));
    CHECK(has("encoder.embed_tokens.weight"));
    CHECK(has("decoder.output_projection.weight"));
    CHECK_FALSE(has("encoder.layers.1.cross_attn.v_proj.weight"));
  }

  TEST_CASE("embedding sharing: all, decoder input/output, none") {
    ModelConfig cfg = test::small_config(Arch::EncDec, 1, 1);
    cfg.sharing = EmbeddingSharing::All;
    auto all = test::make_model("post-ln", cfg);
    auto n_all = all->named_parameters().size();
    cfg.sharing = EmbeddingSharing::DecoderInputOutput;
    auto dio = test::make_model("post-ln", cfg);
    cfg.sharing = EmbeddingSharing::None;
    auto none = test::make_model("post-ln", cfg);
    CHECK(dio->named_parameters().size() == n_all + 1);
    CHECK(none->named_parameters().size() == n_all + 2);
    // Shared matrices are one tensor, counted once.
    int64_t numel = 0;
    for (const auto& p : all->parameters()) numel += p.numel();
    int64_t numel_none = 0;
    for (const auto& p : none->parameters()) numel_none += p.numel();
    CHECK(numel_none - numel == 2 * 50 * 16);
    // Tied output: logits are h·Eᵀ with the (scaled) decoder embedding matrix itself.
    CHECK(all->encoder->embedding_weight().data_ptr() ==
          all->decoder->embedding_weight().data_ptr());
  }

  TEST_CASE(
      "fused attention: the unfused path's values and gradients (self and cross, causal and "
      "padding masks)") {
    torch::manual_seed(7);
    const int64_t B = 3, T = 7, S = 5, D = 32, H = 4;
    for (bool self : {true, false}) {
      CAPTURE(self);
      MultiheadAttention attn(D, H, 0.0);
      const LayerInputs in =
          test::layer_test_inputs(/*encoder=*/false, /*memory=*/true, B, T, S, D);
      const torch::Tensor& mask = self ? in.self_mask : in.memory_mask;
      auto query = torch::randn({B, T, D}).requires_grad_(true);
      auto memory = in.memory.clone().requires_grad_(true);
      const auto weight = torch::randn({B, T, D});  // a loss that weighs every output differently
      std::vector<std::vector<torch::Tensor>> runs;
      for (bool fused : {true, false}) {
        speed_levers().fused_attention = fused;
        CHECK(fused_attention_applies(query, mask, 0.0) == fused);
        attn->zero_grad();
        query.mutable_grad() = torch::Tensor();
        memory.mutable_grad() = torch::Tensor();
        auto y = attn->forward(query, self ? query : memory, mask, self);
        (y * weight).sum().backward();
        std::vector<torch::Tensor> r = {y.detach(), query.grad().clone()};
        if (!self) r.push_back(memory.grad().clone());
        for (const auto& p : attn->parameters()) r.push_back(p.grad().clone());
        runs.push_back(std::move(r));
      }
      speed_levers().fused_attention = true;
      REQUIRE(runs[0].size() == runs[1].size());
      for (size_t i = 0; i < runs[0].size(); ++i) {
        CAPTURE(i);  // 0 output, 1 query gradient, (2 memory gradient), then the parameters'
        const double scale = std::max(1.0, runs[1][i].abs().max().item<double>());
        CHECK(test::max_abs_diff(runs[0][i], runs[1][i]) <= 2e-6 * scale);
        CHECK(runs[0][i].abs().max().item<double>() > 0);
      }
    }
  }
}  // TEST_SUITE

}  // namespace normlab_test_deep_models
