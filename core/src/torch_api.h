// The part of LibTorch's C++ API that normlab's own code uses, included instead of <torch/torch.h>
// (and precompiled in its place). Why a subset: GCC's precompiled header keeps no template
// instantiations, so each translation unit instantiates again every template its LibTorch headers'
// inline code uses: ~9 s of CPU per unit for <torch/torch.h> (all of torch::nn's modules,
// torch::data, torch::jit), ~5 s for this list (measured on the 2-vCPU AVX2 EPYC, docs/testing.md).
#pragma once

#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>
#include <torch/types.h>
#include <torch/utils.h>
