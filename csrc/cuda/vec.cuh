// 16-byte vector loads: one instruction moves 16 bytes (8 half, 4 float, 2 double). The address
// must be 16-byte aligned (the simulation checks it; a GPU faults).
#pragma once

#include <cstdint>

namespace specdec::cuda {

template <class T>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

template <class T>
__device__ inline Vec16<T> load16(const T* p) {
#if defined(SPECDEC_CUDA_SIM)
  sim::check_aligned(p, 16, "a 16-byte vector load");
#endif
  return *reinterpret_cast<const Vec16<T>*>(p);
}

}  // namespace specdec::cuda
