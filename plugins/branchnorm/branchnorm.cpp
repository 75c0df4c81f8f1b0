// BranchNorm (Liu et al. 2023, sec. 4.2): y = LN(x + α_t·Drop(F(x))) — α_t scales the branch,
// the skip keeps weight 1 — with DeepNorm's β initialization (sec. 5.2).
#include <normlab/sdk.h>

#include <algorithm>
#include <cmath>

#include "common/deepnorm_init.h"

namespace {

using namespace normlab;

enum class Schedule { Linear, Exp, Sigmoid };

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// α_t, clipped to 1 (paper Fig. 5). `linear` is the paper's eq. (8); `exp` and `sigmoid` are
// normlab's own (the paper gives only a figure), with sharpness k.
double schedule_alpha(Schedule s, double t, double T, double k) {
  if (t >= T) return 1.0;
  const double u = std::max(t, 0.0) / T;
  switch (s) {
    case Schedule::Linear:
      return u;
    case Schedule::Exp:
      return std::expm1(k * u) / std::expm1(k);
    case Schedule::Sigmoid: {
      const double lo = sigmoid(-k / 2), hi = sigmoid(k / 2);
      return (sigmoid(k * (u - 0.5)) - lo) / (hi - lo);
    }
  }
  return 1.0;
}

// Read through a shared pointer so every layer sees the value set by on_update().
struct AlphaClock {
  double alpha = 0.0;
  // α as a float scalar on the model's device, filled by on_update(): what a replayed CUDA graph
  // of the update (run.cuda_graph) reads; a host number would stay the one recorded.
  mutable torch::Tensor on_device;

  void set(double a) {
    alpha = a;
    if (on_device.defined()) on_device.fill_(a);
  }
  // branch · α, rounded as a product with the host number: in float, then to the branch's dtype.
  torch::Tensor scale(const torch::Tensor& branch) const {
    if (!on_device.defined() || on_device.device() != branch.device())
      on_device = torch::full({}, alpha, branch.options().dtype(torch::kFloat));
    if (branch.scalar_type() == torch::kFloat) return branch * on_device;
    return (branch.to(torch::kFloat) * on_device).to(branch.scalar_type());
  }
};

class BranchNormWiring final : public PerSublayerWiring {
 public:
  BranchNormWiring(LayerBuilder& b, std::shared_ptr<const AlphaClock> clock)
      : PerSublayerWiring(b.geometry()), clock_(std::move(clock)) {
    for (int i = 0; i < num_sublayers_; ++i) norms_[i] = b.add_layer_norm(norm_name(sublayers_[i]));
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return ops.residual_norm(norms_[i], x, clock_->scale(ops.branch(s, x)));
  }

 private:
  std::shared_ptr<const AlphaClock> clock_;
  int norms_[3] = {0, 0, 0};
};

class BranchNormScheme final : public Scheme {
 public:
  BranchNormScheme(const ParamView& p, const ModelGeometry& g)
      : geom_(g),
        T_(double(p.integer("T"))),
        k_(p.number("k")),
        alpha_min_(p.number("alpha_min")),
        clock_(std::make_shared<AlphaClock>()) {
    const std::string& s = p.text("schedule");
    schedule_ = s == "exp" ? Schedule::Exp : s == "sigmoid" ? Schedule::Sigmoid : Schedule::Linear;
    for (Stack st : {Stack::Encoder, Stack::Decoder})
      if (g.has_stack(st))
        beta_[int(st)] = deepnorm_constants(deepnorm_form(g, st), g.enc_layers, g.dec_layers).beta;
    on_update(0);
  }

  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<BranchNormWiring>(b, clock_);
  }
  void init_layer(torch::nn::Module& layer, const LayerGeometry& g) override {
    deepnorm_init_layer(layer, g, beta_[int(g.stack)]);
  }

  // The forward pass of update u = updates_done + 1 uses α_u, so the first update already has
  // α_1 = α(1) > 0 and its branch gradients are not all zero.
  void on_update(int64_t updates_done) override {
    updates_done_ = updates_done;
    clock_->set(alpha_at(double(updates_done + 1)));
  }
  NamedTensors state() const override {
    return {{"updates_done", torch::tensor(updates_done_, torch::kLong)}};
  }
  void load_state(const NamedTensors& state) override {
    for (const auto& [k, v] : state)
      if (k == "updates_done") on_update(v.item<int64_t>());
  }
  std::vector<DerivedValue> derive() const override {
    std::vector<DerivedValue> out;
    const char* f = schedule_ == Schedule::Linear ? "min(1, t/T)"
                    : schedule_ == Schedule::Exp
                        ? "min(1, (e^(k t/T) - 1)/(e^k - 1))"
                        : "(sig(k(t/T - 1/2)) - sig(-k/2))/(sig(k/2) - sig(-k/2)), 1 for t >= T";
    for (double frac : {0.0, 0.25, 0.5, 1.0, 2.0})
      out.push_back({"alpha_t", "t=" + std::to_string(int64_t(frac * T_)), alpha_at(frac * T_), f});
    for (Stack st : {Stack::Encoder, Stack::Decoder})
      if (geom_.has_stack(st))
        out.push_back({"beta", to_string(st), beta_[int(st)], "DeepNorm beta (init)"});
    return out;
  }
  std::vector<SchemeValue> values() const override { return {{"alpha_t", clock_->alpha}}; }

 private:
  double alpha_at(double t) const {
    return std::max(alpha_min_, schedule_alpha(schedule_, t, T_, k_));
  }

  ModelGeometry geom_;
  Schedule schedule_ = Schedule::Linear;
  double T_, k_, alpha_min_;
  double beta_[2] = {1.0, 1.0};
  int64_t updates_done_ = 0;
  std::shared_ptr<AlphaClock> clock_;
};

constexpr normlab_param_info kParams[] = {
    {"schedule", "string", "linear", "linear|exp|sigmoid", 0, 0,
     "shape of alpha_t from 0 to 1 over T updates (linear = paper eq. 8)"},
    {"T", "int", "4000", "", 1, INFINITY, "updates until alpha_t reaches 1"},
    {"k", "float", "5", "", 1e-6, 100, "sharpness of the exp and sigmoid schedules"},
    {"alpha_min", "float", "0", "", 0, 1, "floor under alpha_t"},
};

}  // namespace

NORMLAB_EXPORT_SCHEME(
    BranchNormScheme, "branchnorm", "1.0.0",
    "BranchNorm: branch scaled by alpha_t rising 0->1 over T updates, DeepNorm init",
    "y = LN(x + alpha_t*Drop(F(x))), alpha_t = min(1, t/T) "
    "[Liu et al. 2023, BranchNorm sec. 4.2 eq. (8), sec. 5.2]",
    kParams)
