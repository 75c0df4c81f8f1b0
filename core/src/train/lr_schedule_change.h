// Issue 66.2: what a resume may change of the lr schedule. The lr of update u depends on seven
// [optim] keys (learning_rate, update_step.h); any of them may change between a run's start and a
// resume as long as every update the run has done keeps its lr. No LibTorch here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "normlab/manifest/experiment.h"
#include "run/lr_schedule_record.h"

namespace normlab {

// The schedule a run's manifest.resolved.toml held; keys it lacks (a manifest older than them)
// keep `base`'s values. nullopt when `text` is empty or not TOML.
std::optional<OptimSection> schedule_from_resolved_manifest(const std::string& text,
                                                            OptimSection base);

// The first of the updates 1..`done` whose lr differs between the two schedules (0: none). Every
// update is compared up to 2^22 of them; beyond, a grid and each schedule's turning points.
int64_t first_lr_change(const OptimSection& was, const OptimSection& now, int64_t done);

// Throws ManifestError when `now` gives one of the `done` updates a run made under `was` another
// lr: names each key that changed (old → new), the first such update and its two lrs, and how to
// keep them. `source`: the manifest; `run`: the run, as "the run it resumes at update 90".
void check_lr_schedule_change(const std::string& source, const OptimSection& was,
                              const OptimSection& now, int64_t done, const std::string& run);

}  // namespace normlab
