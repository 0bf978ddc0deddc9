// A sum across the 32 lanes of a warp (every lane gets the result).
#pragma once

namespace specdec::cuda {

__device__ inline float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace specdec::cuda
