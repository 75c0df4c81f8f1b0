// `normlab plugins list | new | show`: the scheme plugins.
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "commands/commands.h"
#include "verb.h"

namespace normlab::verbs {

namespace {

std::map<std::string, std::string> parse_assignments(const std::vector<std::string>& items) {
  std::map<std::string, std::string> out;
  for (const auto& item : items) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw CLI::ValidationError("--param", "expected KEY=VALUE, got '" + item + "'");
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

}  // namespace

Verb add_plugins(CLI::App& app, const Globals& g) {
  struct S {
    std::string new_name, new_dir = ".", show_name, arch = "encdec";
    int enc_layers = 6, dec_layers = 6;
    bool json = false;
    std::vector<std::string> params;
  };
  auto s = state<S>();
  auto* plugins = app.add_subcommand("plugins", "list and inspect scheme plugins");
  plugins->require_subcommand(1);
  auto* list =
      plugins->add_subcommand("list", "name, version, ABI, file and description of each plugin");
  auto* plugin_new =
      plugins->add_subcommand("new", "write a commented starting point for a scheme plugin");
  plugin_new->add_option("NAME", s->new_name, "scheme name, e.g. my-scheme")->required();
  plugin_new->add_option("--dir", s->new_dir, "parent folder (default: the working directory)");
  auto* show =
      plugins->add_subcommand("show", "parameters, equation and derived values of a scheme");
  show->add_option("NAME", s->show_name, "scheme name")->required();
  show->add_option("--arch", s->arch, "encdec | lm")->check(CLI::IsMember({"encdec", "lm"}));
  show->add_option("--enc-layers", s->enc_layers, "encoder layers N")->check(kPositive);
  show->add_option("--dec-layers", s->dec_layers, "decoder layers M")->check(kPositive);
  show->add_option("--param", s->params, "scheme parameter KEY=VALUE (repeatable)");
  show->add_flag("--json", s->json, "machine-readable output");
  return {plugins, [s, &g, plugin_new, list, show]() -> int {
            if (plugin_new->parsed())
              return normlab::plugins_new(s->new_name, s->new_dir, std::cout);
            normlab::PluginRegistry registry(
                std::vector<std::filesystem::path>(g.plugin_paths.begin(), g.plugin_paths.end()));
            if (list->parsed()) return normlab::plugins_list(registry, std::cout, std::cerr);
            normlab::PluginShowOptions opt;
            opt.name = s->show_name;
            opt.geometry.arch = parse_arch(s->arch);
            opt.geometry.enc_layers = opt.geometry.arch == normlab::Arch::LM ? 0 : s->enc_layers;
            opt.geometry.dec_layers = s->dec_layers;
            opt.params = parse_assignments(s->params);
            opt.json = s->json;
            return show->parsed() ? normlab::plugins_show(registry, opt, std::cout) : 0;
          }};
}

}  // namespace normlab::verbs
