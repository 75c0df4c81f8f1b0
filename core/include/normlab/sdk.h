// The normlab scheme SDK: everything a plugin author includes besides LibTorch.
#pragma once

#include "normlab/sdk/abi.h"
#include "normlab/sdk/geometry.h"
#include "normlab/sdk/init.h"
#include "normlab/sdk/params.h"
#include "normlab/sdk/plugin.h"
#include "normlab/sdk/scheme.h"
