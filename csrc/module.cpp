// The Python extension module. Importing it loads this library, whose static initialisers
// register the ops (registration.cpp, cpu/, cuda/); it only adds build facts on top.
#include <pybind11/pybind11.h>

#ifndef SPECDEC_WITH_CUDA
#define SPECDEC_WITH_CUDA 0
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "specdec compiled ops (registered as torch.ops.specdec.*)";
  m.attr("with_cuda") = static_cast<bool>(SPECDEC_WITH_CUDA);
  m.attr("cuda_archs") = SPECDEC_CUDA_ARCHS;
  m.attr("torch_version") = SPECDEC_TORCH_VERSION;
}
