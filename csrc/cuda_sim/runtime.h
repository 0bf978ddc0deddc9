// The CUDA runtime as the CUDA simulation sees it (the counterpart of cuda/runtime.cuh): no
// device guard nor stream, a settable SM count, launches run by the block scheduler, and the
// kernels registered for CPU tensors in the specdec_cuda_sim library (cuda_sim/registration.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "cuda_sim/block_scheduler.h"
#include "cuda_sim/compat.h"

#define SPECDEC_CUDA_LIBRARY specdec_cuda_sim
#define SPECDEC_CUDA_KEY CPU
#define SPECDEC_DYNAMIC_SHARED(T, name) T* const name = ::specdec::sim::dynamic_shared<T>()

namespace specdec::cuda {

class DeviceScope {
 public:
  explicit DeviceScope(const at::Tensor&) {}
  cudaStream_t stream() const { return nullptr; }
  int sm_count() const { return sim::sm_count(); }
};

template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), int64_t gx, int64_t gy, int64_t gz, int threads,
                   size_t smem, const DeviceScope&, A... args) {
  sim::run_grid({static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(gz)},
                {static_cast<unsigned>(threads)}, smem, [&] { kernel(args...); });
}

}  // namespace specdec::cuda
