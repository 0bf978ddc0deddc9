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

// a * b rounded to float before any later add. nvcc would fuse `c - a * b` into one FMA (one
// rounding instead of two), so the CUDA kernels' weights would differ in the last bit from the
// CPU kernels' and reference.py's, which round the product first (the CPU kernels are built
// without FMA contraction: x86-64's baseline has no FMA). One bit is enough to move
// max(0, r - m * q) between zero and a few ulps, i.e. to make a token drawable on one device
// only. __fmul_rn is never contracted.
SPECDEC_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

}  // namespace specdec::core
