// The model a manifest describes for a dataset (vocabulary sizes from the data): shared by the
// trainer and the commands that rebuild a run's model (eval, translate, forward).
#pragma once

#include "normlab/data/dataset.h"
#include "normlab/manifest/experiment.h"
#include "normlab/model/config.h"

namespace normlab {

ModelConfig model_config(const ExperimentSpec& spec, const data::Dataset& ds);

}  // namespace normlab
