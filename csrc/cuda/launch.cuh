// What every CUDA launcher of specdec shares: the device guard and the current stream.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

namespace specdec::cuda {

// Threads per block of the per-row kernels that pass over a vocabulary.
constexpr int kRowBlock = 512;
// Threads per block of the kernels that run one thread per row.
constexpr int kThreadsPerRowBlock = 128;

inline unsigned int blocks_for(int64_t n, int64_t per_block) {
  return static_cast<unsigned int>((n + per_block - 1) / per_block);
}

}  // namespace specdec::cuda
