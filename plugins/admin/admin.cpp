// Admin (Liu et al. 2020, "Understanding the Difficulty of Training Transformers"):
// y = LN(ω_i ⊙ x + Drop(F(x))), ω_i ∈ ℝ^d learnable per sublayer, Post-LN otherwise.
// ω from a profiling pass (default) or admin-torch's closed forms.
#include <normlab/sdk.h>

#include <cmath>
#include <vector>

namespace {

using namespace normlab;

enum class OmegaInit { Profile, OLogN, ON, O1 };

// admin-torch closed forms for n residual sublayers in the stack.
double closed_form_omega(OmegaInit mode, int n) {
  switch (mode) {
    case OmegaInit::OLogN:
      return std::sqrt((n + 1.0) / std::log(n + 1.0) - 1.0);
    case OmegaInit::ON:
      return 1.0;
    case OmegaInit::O1:
      return std::sqrt(double(n));
    case OmegaInit::Profile:
      break;
  }
  return 1.0;
}

// State of the profiling pass, shared by every layer: one accumulator r per stack.
struct Profiler {
  bool active = false;
  double r[2] = {1.0, 1.0};
  std::vector<double> omega[2];  // ω_i per stack in forward order (layer * sublayers + i)
};

class AdminWiring final : public PerSublayerWiring {
 public:
  AdminWiring(LayerBuilder& b, double omega0, std::shared_ptr<Profiler> prof)
      : PerSublayerWiring(b.geometry()), geom_(b.geometry()), prof_(std::move(prof)) {
    const int d = geom_.model.d_model;
    for (int i = 0; i < num_sublayers_; ++i) {
      norms_[i] = b.add_layer_norm(norm_name(sublayers_[i]));
      omegas_[i] = b.add_parameter(std::string(to_string(sublayers_[i])) + "_omega",
                                   torch::full({d}, omega0));
    }
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    const torch::Tensor& omega = ops.param(omegas_[i]);
    if (!prof_->active) return ops.residual_norm(norms_[i], omega * x, ops.branch(s, x));
    // Profiling: ω_i = r, then r ← √(Var(ω_i·x) + Var(Drop(F(x)))) (population variances).
    double& r = prof_->r[int(geom_.stack)];
    omega.fill_(r);
    prof_->omega[int(geom_.stack)][size_t(geom_.index * num_sublayers_ + i)] = r;
    torch::Tensor skip = omega * x;
    torch::Tensor b = ops.branch(s, x);
    r = std::sqrt(skip.to(torch::kFloat).var(/*unbiased=*/false).item<double>() +
                  b.to(torch::kFloat).var(/*unbiased=*/false).item<double>());
    return ops.norm(norms_[i], skip + b);
  }

 private:
  LayerGeometry geom_;
  std::shared_ptr<Profiler> prof_;
  int norms_[3] = {0, 0, 0};
  int omegas_[3] = {0, 0, 0};
};

class AdminScheme final : public Scheme {
 public:
  AdminScheme(const ParamView& p, const ModelGeometry& g)
      : geom_(g), prof_(std::make_shared<Profiler>()) {
    const std::string& m = p.text("omega_init");
    mode_ = m == "O(logn)" ? OmegaInit::OLogN
            : m == "O(n)"  ? OmegaInit::ON
            : m == "O(1)"  ? OmegaInit::O1
                           : OmegaInit::Profile;
    for (Stack s : {Stack::Encoder, Stack::Decoder})
      if (g.has_stack(s)) prof_->omega[int(s)].assign(size_t(g.residual_sublayers(s)), 1.0);
  }

  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    const Stack s = b.geometry().stack;
    const double omega0 =
        mode_ == OmegaInit::Profile ? 1.0 : closed_form_omega(mode_, geom_.residual_sublayers(s));
    return std::make_unique<AdminWiring>(b, omega0, prof_);
  }

  bool needs_setup_pass() const override { return mode_ == OmegaInit::Profile && !profiled_; }
  void setup(SetupPass& pass) override {
    prof_->r[0] = prof_->r[1] = 1.0;
    prof_->active = true;
    try {
      pass.forward_first_batch();
    } catch (...) {
      prof_->active = false;
      throw;
    }
    prof_->active = false;
    profiled_ = true;
  }

  // The profile (ω_i at initialization, per stack, [layers, sublayers]).
  NamedTensors state() const override {
    NamedTensors out;
    if (!profiled_) return out;
    for (Stack s : {Stack::Encoder, Stack::Decoder}) {
      if (!geom_.has_stack(s)) continue;
      const auto& v = prof_->omega[int(s)];
      out.emplace_back(
          std::string(to_string(s)) + ".omega_init",
          torch::tensor(v, torch::kDouble).view({geom_.layers(s), geom_.sublayers_per_layer(s)}));
    }
    return out;
  }
  void load_state(const NamedTensors& state) override {
    for (const auto& [k, t] : state) {
      for (Stack s : {Stack::Encoder, Stack::Decoder}) {
        if (k != std::string(to_string(s)) + ".omega_init" || !geom_.has_stack(s)) continue;
        auto flat = t.to(torch::kDouble).contiguous().view(-1);
        auto& v = prof_->omega[int(s)];
        if (size_t(flat.numel()) != v.size()) return;  // another geometry: profile again
        for (size_t i = 0; i < v.size(); ++i) v[i] = flat[int64_t(i)].item<double>();
        profiled_ = true;
      }
    }
  }

  std::vector<DerivedValue> derive() const override {
    std::vector<DerivedValue> out;
    for (Stack s : {Stack::Encoder, Stack::Decoder}) {
      if (!geom_.has_stack(s)) continue;
      const int n = geom_.residual_sublayers(s);
      const std::string where = std::string(to_string(s)) + " (n=" + std::to_string(n) + ")";
      out.push_back({"omega O(logn)", where, closed_form_omega(OmegaInit::OLogN, n),
                     "sqrt((n+1)/ln(n+1) - 1)"});
      out.push_back({"omega O(n)", where, closed_form_omega(OmegaInit::ON, n), "1"});
      out.push_back({"omega O(1)", where, closed_form_omega(OmegaInit::O1, n), "sqrt(n)"});
    }
    return out;
  }

 private:
  ModelGeometry geom_;
  OmegaInit mode_ = OmegaInit::Profile;
  bool profiled_ = false;
  std::shared_ptr<Profiler> prof_;
};

constexpr normlab_param_info kParams[] = {
    {"omega_init", "string", "profile", "profile|O(logn)|O(n)|O(1)", 0, 0,
     "profile: data pass on the first batch (Admin); else admin-torch's closed form for n "
     "sublayers"},
};

}  // namespace

NORMLAB_EXPORT_SCHEME(AdminScheme, "admin", "1.0.0",
                      "Admin: learnable per-sublayer skip weights omega set from a profiling pass",
                      "y = LN(omega_i * x + Drop(F(x))), omega_i^2 = 1 + sum_{j<i} Var F_j "
                      "[Liu et al. 2020, Admin; docs/schemes/admin.md]",
                      kParams)
