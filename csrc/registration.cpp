// The specdec op library (torch.ops.specdec): its schemas are in op_schemas.cpp, its kernels
// register under the CPU and CUDA dispatch keys in cpu/ and cuda/.
#include <torch/library.h>

#include "op_schemas.h"

TORCH_LIBRARY(specdec, m) { specdec::define_ops(m); }
