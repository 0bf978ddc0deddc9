// The CUDA runtime as the kernels' launchers use it (cuda/launch.cuh): the device guard, the
// current stream, the SM count, a kernel launch. The CUDA simulation replaces this file with
// cuda_sim/runtime.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#define SPECDEC_CUDA_LIBRARY specdec
#define SPECDEC_CUDA_KEY CUDA
#define SPECDEC_DYNAMIC_SHARED(T, name) extern __shared__ T name[]

namespace specdec::cuda {

// The device of an op's tensors, made current for its launches, and its current stream.
class DeviceScope {
 public:
  explicit DeviceScope(const at::Tensor& t)
      : guard_(t.device()), stream_(c10::cuda::getCurrentCUDAStream()) {}
  cudaStream_t stream() const { return stream_; }

  int sm_count() const {
    // Atomic: host threads may launch on one device at once (each stores the same value).
    static std::array<std::atomic<int>, 64> cached{};
    const int device = guard_.current_device().index();
    if (device < 0 || device >= 64) return 108;
    int n = cached[device].load(std::memory_order_relaxed);
    if (n == 0) {
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
      n = std::max(n, 1);
      cached[device].store(n, std::memory_order_relaxed);
    }
    return n;
  }

 private:
  c10::cuda::CUDAGuard guard_;
  cudaStream_t stream_;
};

template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), int64_t gx, int64_t gy, int64_t gz, int threads,
                   size_t smem, const DeviceScope& device, A... args) {
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(gz));
  kernel<<<grid, threads, smem, device.stream()>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace specdec::cuda
