// A plugin that throws an int (not a std::exception): from its factory (fail = "factory", the
// default) or from derive() (fail = "derive"). Each use is one error line for this plugin alone.
#include <normlab/sdk.h>

namespace {
class Throws42 final : public normlab::Scheme {
 public:
  Throws42(const normlab::ParamView& p, const normlab::ModelGeometry&) {
    if (p.text("fail") == "factory") throw 42;
  }
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder& b) override {
    return std::make_unique<normlab::PostLnWiring>(b);
  }
  std::vector<normlab::DerivedValue> derive() const override { throw 42; }
};

constexpr normlab_param_info kParams[] = {
    {"fail", "string", "factory", "factory|derive", 0, 0, "where to throw 42"}};
}  // namespace

NORMLAB_EXPORT_SCHEME(Throws42, "throws-42", "1.0.0", "throws 42 from its factory or derive()",
                      "y = ?", kParams)
