#include <fmt/format.h>
#include <fmt/ostream.h>

#include <chrono>
#include <cmath>
#include <ostream>

#include "commands/commands.h"
#include "normlab/model/transformer_model.h"
#include "run/model_assembly.h"
#include "torch_api.h"

namespace normlab {

int smoke(const PluginRegistry& reg, const SmokeOptions& opt, std::ostream& out) {
  if (opt.threads > 0) at::set_num_threads(opt.threads);
  const torch::Device device(opt.device);
  std::vector<std::string> names = opt.schemes;
  if (names.empty())
    for (const auto* p : reg.plugins()) names.push_back(p->name);
  const ModelGeometry& g = opt.geometry;
  fmt::print(
      out,
      "normlab smoke: {} d={} ffn={} heads={} {}, batch {}x{}, vocab {}, device {}, {} thread(s)\n",
      g.arch == Arch::LM
          ? fmt::format("lm{} {}L", g.family == Family::Llama ? " llama" : "", g.dec_layers)
          : fmt::format("encdec {}L-{}L", g.enc_layers, g.dec_layers),
      g.d_model, g.ffn_dim, g.heads, "one forward+backward per scheme", opt.batch, opt.length,
      opt.vocab, opt.device, at::get_num_threads());
  int failures = 0;
  for (const auto& name : names) {
    torch::manual_seed(opt.seed);
    TransformerModel model =
        assemble_model(model_spec(g, name, opt.vocab, /*dropout=*/0.1), reg, device).model;

    // Tokens in [1, vocab), the last positions of every other row padded (pad id 0).
    auto tokens = [&] {
      auto t = torch::randint(1, opt.vocab, {opt.batch, opt.length}, torch::kLong);
      t.index_put_({torch::indexing::Slice(0, torch::indexing::None, 2),
                    torch::indexing::Slice(opt.length * 3 / 4, torch::indexing::None)},
                   0);
      return t.to(device);
    };
    auto src = tokens(), tgt = tokens();
    auto tgt_in = tgt.narrow(1, 0, opt.length - 1), tgt_out = tgt.narrow(1, 1, opt.length - 1);
    auto run = [&] {
      return g.arch == Arch::LM ? model->forward_lm(tgt_in) : model->forward(src, tgt_in);
    };

    const auto t0 = std::chrono::steady_clock::now();
    const bool setup = model->scheme().needs_setup_pass();
    model->run_setup_pass([&] { run(); });
    model->on_update(0);
    auto logits = run();
    auto loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), tgt_out.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(model->config().pad_id));
    loss.backward();
    double sq = 0;
    int64_t n_params = 0;
    for (const auto& p : model->parameters()) {
      n_params += p.numel();
      if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double l = loss.item<double>();
    const bool ok = std::isfinite(l) && std::isfinite(sq);
    failures += ok ? 0 : 1;
    const std::string status = model->scheme().status();
    fmt::print(
        out,
        "{:<11} params {:>9}  loss {:.4f} (uniform {:.4f})  grad-norm {:9.4f}  final-LN {:<3}  "
        "{}{:.0f} ms{}{}\n",
        name, n_params, l, std::log(double(opt.vocab)), std::sqrt(sq),
        model->decoder->has_final_norm() ? "yes" : "no", setup ? "setup pass + " : "", ms,
        status.empty() ? "" : "  " + status, ok ? "" : "  NON-FINITE");
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace normlab
