// normlab scheme SDK — exporting a scheme from a plugin library.
//
//   static const normlab_param_info kParams[] = {
//       {"T", "int", "4000", "", 1, INFINITY, "updates until alpha_t reaches 1"}};
//   NORMLAB_EXPORT_SCHEME(MyScheme, "my-scheme", "1.0.0", "one line", "y = LN(x + F(x)) [ref]",
//                         kParams)
//
// MyScheme needs a constructor MyScheme(const normlab::ParamView&, const normlab::ModelGeometry&).
// Use NORMLAB_NO_PARAMS for a scheme without parameters.
#pragma once

#include <boost/config.hpp>
#include <boost/dll/alias.hpp>
#include <torch/version.h>

#include "normlab/sdk/abi.h"
#include "normlab/sdk/plugin_info.h"
#include "normlab/sdk/scheme.h"

#define NORMLAB_NO_PARAMS nullptr, 0

// The LibTorch a plugin is built against, recorded in its metadata (tests pre-define it).
#ifndef NORMLAB_PLUGIN_TORCH_VERSION
#define NORMLAB_PLUGIN_TORCH_VERSION TORCH_VERSION
#endif

namespace normlab {
using SchemeFactory = Scheme*(const ParamView&, const ModelGeometry&);
}

#define NORMLAB_PARAMS(array) array, int(sizeof(array) / sizeof(array[0]))

#define NORMLAB_EXPORT_SCHEME_IMPL(SchemeClass, NAME, VERSION, DESCRIPTION, EQUATION, PARAMS)  \
  namespace normlab_plugin_entry {                                                            \
  const int abi_version = NORMLAB_ABI_VERSION;                                                \
  const normlab_plugin_info info = {NORMLAB_ABI_VERSION, NAME, VERSION, DESCRIPTION,         \
                                    EQUATION, NORMLAB_PLUGIN_TORCH_VERSION, _GLIBCXX_USE_CXX11_ABI,     \
                                    PARAMS}; \
  normlab::Scheme* create(const normlab::ParamView& params, const normlab::ModelGeometry& g) { \
    return new SchemeClass(params, g);                                                        \
  }                                                                                           \
  }                                                                                           \
  BOOST_DLL_ALIAS(normlab_plugin_entry::abi_version, normlab_abi_version)                     \
  BOOST_DLL_ALIAS(normlab_plugin_entry::info, normlab_plugin_info)                            \
  BOOST_DLL_ALIAS(normlab_plugin_entry::create, normlab_create_scheme)

#define NORMLAB_EXPORT_SCHEME(SchemeClass, NAME, VERSION, DESCRIPTION, EQUATION, PARAM_ARRAY) \
  NORMLAB_EXPORT_SCHEME_IMPL(SchemeClass, NAME, VERSION, DESCRIPTION, EQUATION,             \
                             NORMLAB_PARAMS(PARAM_ARRAY))

#define NORMLAB_EXPORT_SCHEME_NO_PARAMS(SchemeClass, NAME, VERSION, DESCRIPTION, EQUATION) \
  NORMLAB_EXPORT_SCHEME_IMPL(SchemeClass, NAME, VERSION, DESCRIPTION, EQUATION, NORMLAB_NO_PARAMS)
