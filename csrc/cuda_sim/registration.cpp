// The CUDA simulation's op library, torch.ops.specdec_cuda_sim: the schemas of torch.ops.specdec,
// with the CUDA kernels (csrc/cuda, compiled by the host compiler) registered for CPU tensors,
// and the simulated device's SM count as an op of its own (set_sm_count, which returns the
// previous count). A separate library rather than another dispatch key of specdec, so that it
// loads next to the real CPU kernels without replacing them (docs/cuda_simulation.md).
#include <torch/library.h>

#include "cuda_sim/block_scheduler.h"
#include "op_schemas.h"

TORCH_LIBRARY(specdec_cuda_sim, m) {
  specdec::define_ops(m);
  m.def("set_sm_count(int n) -> int", &specdec::sim::set_sm_count);
}
