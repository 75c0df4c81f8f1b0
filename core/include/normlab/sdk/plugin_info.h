// normlab scheme SDK — plugin metadata, plain C layout so the registry can read it without
// calling any scheme code. The layout is covered by NORMLAB_ABI_VERSION.
#pragma once

extern "C" {

struct normlab_param_info {
  const char* name;
  const char* type;           // "bool" | "int" | "float" | "string"
  const char* default_value;  // as text: "true", "4000", "0.5", "linear"
  const char* choices;        // strings only: "a|b|c", or "" for any
  double min_value;           // numbers only: inclusive range (use -INFINITY / INFINITY for none)
  double max_value;
  const char* help;           // one line
};

struct normlab_plugin_info {
  int abi_version;
  const char* name;         // scheme name used in manifests, e.g. "deepnorm"
  const char* version;      // the plugin's own version
  const char* description;  // one line
  const char* equation;     // the equation implemented, with its citation
  const char* torch_version;
  int cxx11_abi;            // _GLIBCXX_USE_CXX11_ABI the plugin was built with
  const normlab_param_info* params;
  int num_params;
};

}  // extern "C"
