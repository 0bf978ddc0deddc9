// cub::BlockReduce and cub::BlockScan for the CUDA simulation, with CUB's contracts: every
// thread of the block (exactly BLOCK of them) calls the collective; a reduction's result is
// defined in thread 0 only (the others get a poison value: NaN, or 0xa5 bytes); a scan gives
// every thread its prefix and the block's total; the temporary storage may be reused only after
// a __syncthreads. Values are combined in thread order.
#pragma once

#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "cuda_sim/compat.h"

namespace specdec::sim {

template <class T>
T poison() {
  if constexpr (std::is_floating_point_v<T>) {
    return std::numeric_limits<T>::quiet_NaN();
  } else {
    static_assert(std::is_trivially_copyable_v<T>);
    T x;
    std::memset(static_cast<void*>(&x), 0xa5, sizeof(T));
    return x;
  }
}

// The calling thread's index in a block of `block` threads (failing for any other block size).
inline unsigned collective_rank(int block, const char* what) {
  const Dim3& dim = block_dim();
  if (dim.count() != static_cast<unsigned>(block))
    fail(std::string(what) + " of " + std::to_string(block) + " threads called in a block of " +
         std::to_string(dim.count()));
  const Dim3& t = thread_idx();
  return t.x + dim.x * (t.y + dim.y * t.z);
}

template <class T, int BLOCK>
class BlockReduce {
 public:
  struct TempStorage {
    T items[BLOCK];
  };
  explicit BlockReduce(TempStorage& storage) : s_(storage) {}

  T Sum(T x) {
    return Reduce(x, [](const T& a, const T& b) { return a + b; });
  }
  template <class Op>
  T Reduce(T x, Op op) {
    const unsigned rank = collective_rank(BLOCK, "cub::BlockReduce");
    s_.items[rank] = x;
    __syncthreads();
    if (rank != 0) return poison<T>();
    T total = s_.items[0];
    for (int i = 1; i < BLOCK; ++i) total = op(total, s_.items[i]);
    return total;
  }

 private:
  TempStorage& s_;
};

template <class T, int BLOCK>
class BlockScan {
 public:
  struct TempStorage {
    T items[BLOCK];
  };
  explicit BlockScan(TempStorage& storage) : s_(storage) {}

  void InclusiveSum(T x, T& inclusive, T& total) {
    const unsigned rank = collective_rank(BLOCK, "cub::BlockScan");
    s_.items[rank] = x;
    __syncthreads();
    if (rank == 0)
      for (int i = 1; i < BLOCK; ++i) s_.items[i] = s_.items[i - 1] + s_.items[i];
    __syncthreads();
    inclusive = s_.items[rank];
    total = s_.items[BLOCK - 1];
  }

 private:
  TempStorage& s_;
};

}  // namespace specdec::sim

namespace cub {
using specdec::sim::BlockReduce;
using specdec::sim::BlockScan;
}  // namespace cub
