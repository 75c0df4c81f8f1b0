// The options of the verbs that reopen a run's model from its directory (docs/evaluate.md):
// eval, ablate, translate, forward.
#pragma once

#include <CLI/CLI.hpp>

#include "normlab/eval/eval_commands.h"

namespace normlab::verbs {

// RUN, --checkpoint, --device, --allow-unverified.
void add_model_options(CLI::App* cmd, normlab::RunModelOptions& m);

// --beam, --lenpen, --max-len-a, --max-len-b, --batch-tokens.
void add_decode_options(CLI::App* cmd, normlab::DecodeOptions& d);

}  // namespace normlab::verbs
