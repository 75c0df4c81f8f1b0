// normlab scheme SDK — exporting a scheme from a plugin library.
//
//   constexpr normlab_param_info kParams[] = {
//       {"T", "int", "4000", "", 1, INFINITY, "updates until alpha_t reaches 1"}};
//   NORMLAB_EXPORT_SCHEME(MyScheme, "my-scheme", "1.0.0", "one line", "y = LN(x + F(x)) [ref]",
//                         kParams)
//
// MyScheme needs a constructor MyScheme(const normlab::ParamView&, const normlab::ModelGeometry&).
// Use NORMLAB_EXPORT_SCHEME_NO_PARAMS for a scheme without parameters. The metadata (names, texts,
// parameters) must be compile-time constants: it is written into the library file as data
// (normlab/sdk/detail/plugin_info.h) and read from there without loading the plugin.
#pragma once

#include <torch/version.h>

#include <boost/config.hpp>
#include <boost/dll/alias.hpp>

#include "normlab/sdk/abi.h"
#include "normlab/sdk/detail/plugin_info.h"
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
  namespace normlab_plugin_entry {                                                             \
  constexpr std::size_t metadata_ranges = normlab::metadata::ranges_size(PARAMS);              \
  constexpr std::size_t metadata_strings = normlab::metadata::strings_size(                    \
      NAME, VERSION, DESCRIPTION, EQUATION, NORMLAB_PLUGIN_TORCH_VERSION, PARAMS);             \
  [[gnu::section(NORMLAB_METADATA_SECTION),                                                    \
    gnu::used]] constexpr normlab::metadata::Record<metadata_ranges, metadata_strings>         \
      metadata = normlab::metadata::make_record<metadata_ranges, metadata_strings>(            \
          NORMLAB_ABI_VERSION, _GLIBCXX_USE_CXX11_ABI, NAME, VERSION, DESCRIPTION, EQUATION,   \
          NORMLAB_PLUGIN_TORCH_VERSION, PARAMS);                                               \
  normlab::Scheme* create(const normlab::ParamView& params, const normlab::ModelGeometry& g) { \
    return new SchemeClass(params, g);                                                         \
  }                                                                                            \
  }                                                                                            \
  BOOST_DLL_ALIAS(normlab_plugin_entry::create, normlab_create_scheme)

#define NORMLAB_EXPORT_SCHEME(SchemeClass, NAME, VERSION, DESCRIPTION, EQUATION, PARAM_ARRAY) \
  NORMLAB_EXPORT_SCHEME_IMPL(SchemeClass, NAME, VERSION, DESCRIPTION, EQUATION,               \
                             NORMLAB_PARAMS(PARAM_ARRAY))

#define NORMLAB_EXPORT_SCHEME_NO_PARAMS(SchemeClass, NAME, VERSION, DESCRIPTION, EQUATION) \
  NORMLAB_EXPORT_SCHEME_IMPL(SchemeClass, NAME, VERSION, DESCRIPTION, EQUATION, NORMLAB_NO_PARAMS)
