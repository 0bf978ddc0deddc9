// Shared helpers for the per-row logic that the CPU and CUDA kernels both run.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SPECDEC_HD __host__ __device__
// Templates below are instantiated with host-only (CPU) and device-only (CUDA) executors; this
// tells nvcc not to warn about the half that each instantiation never runs.
#define SPECDEC_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define SPECDEC_HD
#define SPECDEC_HD_TEMPLATE
#endif

namespace specdec::core {

template <class T>
SPECDEC_HD inline float to_float(T x) {
  return static_cast<float>(x);
}

SPECDEC_HD inline bool valid_id(int64_t x, int64_t vocab) { return x >= 0 && x < vocab; }

// A sampling weight: negative values and NaN count as zero, so they are never drawn.
SPECDEC_HD inline float clamp_weight(float w) { return w > 0.f ? w : 0.f; }

}  // namespace specdec::core
