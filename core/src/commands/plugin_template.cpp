// `normlab plugins new NAME`: a commented starting point for a scheme plugin that builds as is.
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <filesystem>
#include <fstream>
#include <ostream>
#include <regex>
#include <stdexcept>

#include "commands/commands.h"

namespace fs = std::filesystem;

namespace normlab {
namespace {

// {name} is the scheme name, {id} the same with underscores.
constexpr const char* kCMake = R"(# Scheme plugin "{name}", built against an installed normlab:
#   cmake -S . -B build -DCMAKE_PREFIX_PATH=<normlab prefix> && cmake --build build
#   NORMLAB_PLUGIN_PATH=build normlab plugins show {name}
cmake_minimum_required(VERSION 3.25)
project({id}_plugin LANGUAGES CXX)
find_package(normlab REQUIRED)
normlab_add_plugin({name} {id}.cpp)  # → build/normlab_{id}.so
)";

constexpr const char* kSource =
    R"(// Scheme "{name}": a starting point that implements Post-LN, y = LN(x + Drop(F(x))), with every
// hook of the normlab SDK shown. Change what your scheme changes; cite the equation you implement.
#include <normlab/sdk.h>

namespace {{
using namespace normlab;

// How one layer wires its sublayers. PerSublayerWiring calls sublayer() for SA, [CA], FFN in
// order; derive from LayerWiring instead for connections across sublayers (see B2T).
class Wiring final : public PerSublayerWiring {{
 public:
  explicit Wiring(LayerBuilder& b) : PerSublayerWiring(b.geometry()) {{
    // Declare what the layer owns: norms of the manifest's kind (add_layer_norm), norms of a
    // fixed kind (add_norm(name, NormSpec::of(NormKind::RMSNorm))), norms the core applies inside
    // a sublayer (add_branch_norm(Sublayer::SelfAttn, BranchPoint::Query, spec)) and learnable
    // tensors (add_parameter). They are registered under these names, e.g.
    // decoder.layers.3.self_attn_norm.weight.
    for (int i = 0; i < num_sublayers_; ++i) norms_[i] = b.add_layer_norm(norm_name(sublayers_[i]));
  }}

 protected:
  // ops.branch(s, x) = Drop(F(x)) by the core's instrumented sublayer; ops.norm(id, x) a declared
  // LayerNorm; ops.param(id) a declared tensor.
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {{
    return ops.norm(norms_[i], x + ops.branch(s, x));
  }}

 private:
  int norms_[3] = {{0, 0, 0}};
}};

class {cls} final : public Scheme {{
 public:
  // Parameters arrive validated, with the defaults declared in kParams below.
  {cls}(const ParamView& params, const ModelGeometry& geometry)
      : geometry_(geometry), scale_(params.number("init_scale")) {{}}

  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {{
    return std::make_unique<Wiring>(b);
  }}

  // Each stack's final norm: none for Post-LN. Pre-LN returns `configured` (a norm of the
  // manifest's kind); a NormSpec of its own gives another kind. Schemes with several residual
  // streams also override build_stack() (see plugins/residual).
  std::optional<NormSpec> final_norm(Stack, const NormSpec& /*configured*/) const override {{
    return std::nullopt;
  }}

  // After the core's standard init (fairseq Xavier). Parameters by name, e.g. "ffn.fc1.weight";
  // layer_projections(g) lists q/k/v/out of each attention and fc1/fc2.
  void init_layer(torch::nn::Module& layer, const LayerGeometry& g) override {{
    if (scale_ == 1.0) return;
    torch::NoGradGuard no_grad;
    for (const std::string& proj : layer_projections(g)) layer_param(layer, proj + ".weight").mul_(scale_);
  }}

  // Run hooks: before every optimizer update's forward pass (BranchNorm's alpha_t clock lives
  // here), after its backward pass, after the optimizer step (nGPT's weight projection; also
  // called once when the model is built) and after each validation.
  void on_update(int64_t /*updates_done*/) override {{}}
  void after_backward(const NamedTensors& /*params*/) override {{}}
  void after_step(const NamedTensors& /*params*/) override {{}}
  void on_validate(int64_t /*updates_done*/, double /*valid_nll*/) override {{}}

  // A data-dependent pass before training (Admin's profiling): return true and run
  // pass.forward_first_batch() inside setup().
  bool needs_setup_pass() const override {{ return false; }}
  void setup(SetupPass& /*pass*/) override {{}}

  // Saved with every checkpoint and restored on resume.
  NamedTensors state() const override {{ return {{}}; }}
  void load_state(const NamedTensors& /*state*/) override {{}}

  // Shown by `normlab plugins show {name}` for a geometry.
  std::vector<DerivedValue> derive() const override {{
    return {{{{"layers", "decoder", double(geometry_.dec_layers), "M"}}}};
  }}

  // Live state as numbers, for the scheme_state probe and log lines ("alpha_t=0.25").
  std::vector<SchemeValue> values() const override {{ return {{}}; }}

 private:
  ModelGeometry geometry_;
  double scale_;
}};

// name, type (bool|int|float|string), default, choices ("a|b"), min, max, meaning.
constexpr normlab_param_info kParams[] = {{
    {{"init_scale", "float", "1", "", 0, 10, "multiply every weight matrix by this after init"}},
}};

}}  // namespace

NORMLAB_EXPORT_SCHEME({cls}, "{name}", "0.1.0", "{name}: Post-LN starting point",
                      "y = LN(x + Drop(F(x))) [Vaswani et al. 2017]", kParams)
)";

}  // namespace

int plugins_new(const std::string& name, const std::string& dir, std::ostream& out) {
  if (!std::regex_match(name, std::regex("[a-z][a-z0-9-]*")))
    throw std::invalid_argument(
        fmt::format("plugin name '{}': expected lowercase letters, digits and '-', "
                    "starting with a letter",
                    name));
  std::string id = name, cls;
  for (char& c : id) c = c == '-' ? '_' : c;
  bool upper = true;
  for (char c : name) {
    if (c == '-') {
      upper = true;
      continue;
    }
    cls += upper ? char(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  cls += "Scheme";
  const fs::path root = fs::path(dir) / name;
  const fs::path cmake = root / "CMakeLists.txt", source = root / (id + ".cpp");
  for (const auto& f : {cmake, source})
    if (fs::exists(f))
      throw std::invalid_argument(fmt::format("{}: exists already; not overwritten", f.string()));
  fs::create_directories(root);
  std::ofstream(cmake) << fmt::format(kCMake, fmt::arg("name", name), fmt::arg("id", id));
  std::ofstream(source) << fmt::format(kSource, fmt::arg("name", name), fmt::arg("id", id),
                                       fmt::arg("cls", cls));
  fmt::print(out,
             "wrote {} and {}\nbuild: cmake -S {} -B {}/build -DCMAKE_PREFIX_PATH=<normlab prefix> "
             "&& cmake --build {}/build\n",
             cmake.string(), source.string(), root.string(), root.string(), root.string());
  return 0;
}

}  // namespace normlab
