// Tensor-core matrix products through nvcuda::wmma, or the simulation's (cuda_sim/wmma.h).
// SPECDEC_WMMA says whether the code being compiled may use them: device code for sm_80 and
// later (which has half and bfloat16 wmma; CMakeLists.txt builds sm_80 and sm_90 by default),
// and the simulation. WmmaType maps c10's 2-byte types onto CUDA's, which they match bit for bit.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(SPECDEC_CUDA_SIM)
#include "cuda_sim/wmma.h"
#define SPECDEC_WMMA 1
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SPECDEC_WMMA 1
#else
#define SPECDEC_WMMA 0
#endif
#endif

namespace specdec::cuda {

template <class T>
struct WmmaType;
template <>
struct WmmaType<c10::Half> {
  using type = __half;
};
template <>
struct WmmaType<c10::BFloat16> {
  using type = __nv_bfloat16;
};

}  // namespace specdec::cuda
