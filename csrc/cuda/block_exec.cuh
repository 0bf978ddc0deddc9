// The executor of csrc/core for CUDA: a thread block runs a row. Every thread runs the row's
// control flow; passes over the vocabulary are strided over the block and reduced with CUB, and
// their results are broadcast, so all threads take the same decisions.
#pragma once

#include <cstdint>

#include "cuda/cub.cuh"

namespace specdec::cuda {

template <int BLOCK>
struct BlockExec {
  struct FirstLast {
    int64_t first, last;  // first crossing index, last index with positive weight
  };
  struct FirstLastOp {
    __device__ FirstLast operator()(const FirstLast& a, const FirstLast& b) const {
      return {a.first < b.first ? a.first : b.first, a.last > b.last ? a.last : b.last};
    }
  };
  using Reduce = cub::BlockReduce<float, BLOCK>;
  using Scan = cub::BlockScan<float, BLOCK>;
  using ReduceFL = cub::BlockReduce<FirstLast, BLOCK>;
  struct Storage {
    union {
      typename Reduce::TempStorage reduce;
      typename Scan::TempStorage scan;
      typename ReduceFL::TempStorage reduce_fl;
    } temp;
    float f;
    FirstLast fl;
  };

  Storage& s;

  __device__ bool leader() const { return threadIdx.x == 0; }
  __device__ void sync() { __syncthreads(); }

  template <class F>
  __device__ float sum(int64_t n, F f, int64_t skip = -1) {
    // f may write element j of a scratch row that every thread read just before (tree
    // sampling reads resid[x], then updates resid): all reads must be done first.
    __syncthreads();
    float acc = 0.f;
    for (int64_t j = threadIdx.x; j < n; j += BLOCK) {
      const float x = f(j);
      if (j != skip) acc += x;
    }
    const float total = Reduce(s.temp.reduce).Sum(acc);
    if (threadIdx.x == 0) s.f = total;
    __syncthreads();
    const float result = s.f;
    __syncthreads();  // s is reused by the next pass
    return result;
  }

  template <class W>
  __device__ int64_t sample(int64_t n, W w, float total, float u, int64_t skip = -1) {
    constexpr int64_t kNone = INT64_MAX;
    const float threshold = u * total;
    float running = 0.f;  // cumulative weight of the chunks before this one
    int64_t last = -1;
    for (int64_t base = 0; base < n; base += BLOCK) {
      const int64_t j = base + threadIdx.x;
      const float x = j < n && j != skip ? w(j) : 0.f;
      float inclusive, chunk;
      Scan(s.temp.scan).InclusiveSum(x, inclusive, chunk);
      __syncthreads();
      const bool hit = x > 0.f && running + inclusive > threshold;
      const FirstLast mine{hit ? j : kNone, x > 0.f ? j : -1};
      const FirstLast r = ReduceFL(s.temp.reduce_fl).Reduce(mine, FirstLastOp{});
      if (threadIdx.x == 0) s.fl = r;
      __syncthreads();
      const FirstLast found = s.fl;
      __syncthreads();
      if (found.last > last) last = found.last;
      if (found.first != kNone) return found.first;
      running += chunk;
    }
    return last;
  }
};

}  // namespace specdec::cuda
