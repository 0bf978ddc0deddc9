// The schemas of the specdec ops, defined once for every library that registers them: specdec
// (registration.cpp) and the CUDA simulation's specdec_cuda_sim (cuda_sim/registration.cpp).
#pragma once

#include <torch/library.h>

namespace specdec {

void define_ops(torch::Library& m);

}  // namespace specdec
