// Bad input (manifest, data, plugin) as one "normlab: error: …" line and exit code 2.
#pragma once

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <ostream>

#include "normlab/data/dataset.h"
#include "normlab/manifest/experiment.h"
#include "normlab/plugins/registry.h"
#include "normlab/train/trainer.h"
#include "train/run_directory.h"

namespace normlab {

template <class F>
int reporting_input_errors(std::ostream& err, F&& body) {
  try {
    return body();
  } catch (const ManifestError& e) {
    fmt::print(err, "normlab: error: {}\n", e.what());
  } catch (const data::DataError& e) {
    fmt::print(err, "normlab: error: {}\n", e.what());
  } catch (const PluginError& e) {
    fmt::print(err, "normlab: error: {}\n", e.what());
  } catch (const CheckpointError& e) {  // unverified, unreadable or of another model
    fmt::print(err, "normlab: error: {}\n", e.what());
  } catch (const util::DirectoryClaimError& e) {  // a folder normlab does not own, or cannot make
    fmt::print(err, "normlab: error: {}\n", e.what());
  }
  return kExitBadInput;
}

}  // namespace normlab
