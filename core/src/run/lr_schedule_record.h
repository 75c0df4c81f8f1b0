// Issue 66.2: the lr schedule a checkpoint records (__metadata__.lr_schedule), in the run layer
// because checkpoints read and write it; what a resume may change of it is the train layer's
// (train/lr_schedule_change.h). No LibTorch here.
#pragma once

#include <string>

#include "normlab/manifest/experiment.h"

namespace normlab {

// The keys the lr follows, as the JSON object a checkpoint records (__metadata__.lr_schedule).
std::string lr_schedule_record(const OptimSection& o);

// The schedule of such a record, over `base` for everything else. Throws std::invalid_argument
// naming a missing or malformed key.
OptimSection schedule_from_record(const std::string& record, OptimSection base);

}  // namespace normlab
