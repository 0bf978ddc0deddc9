// The executor of csrc/core for CUDA: a thread block runs a row. Every thread runs the row's
// control flow; sums over the vocabulary are strided over the block and reduced with CUB, draws
// sum chunks a warp each and scan the chunk sums (draw), and every result is broadcast, so all
// threads take the same decisions.
#pragma once

#include <cstdint>

#include "cuda/cub.cuh"
#include "cuda/warp.cuh"

namespace specdec::cuda {

template <int BLOCK>
struct BlockExec {
  static_assert(BLOCK % 32 == 0, "whole warps");
  static constexpr int kWarps = BLOCK / 32;
  // A draw splits the vocabulary into at most this many chunks (of a multiple of BLOCK).
  static constexpr int64_t kMaxChunks = 1024;
  static constexpr int64_t kNone = INT64_MAX;

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
  using ScanWide = cub::BlockScan<double, BLOCK>;
  using ReduceFL = cub::BlockReduce<FirstLast, BLOCK>;
  struct Storage {
    union {
      typename Reduce::TempStorage reduce;
      typename Scan::TempStorage scan;
      typename ScanWide::TempStorage scan_wide;
      typename ReduceFL::TempStorage reduce_fl;
    } temp;
    float chunk_sum[kMaxChunks];
    double chunk_before[kMaxChunks];  // the weight of the chunks before each
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

  // One pass over the vocabulary sums its chunks (a warp per chunk, no block barrier); a scan
  // of the chunk sums in float64 finds the chunk where the cumulative weight crosses u * total;
  // a scan of that chunk alone finds the token. So a draw costs one pass and a few barriers
  // whatever the vocabulary size, and the rounding error of the cumulative weight is that of
  // one chunk's float32 sum, not of a running sum over the whole vocabulary.
  template <class W>
  __device__ int64_t draw(int64_t n, W w, float u, int64_t skip = -1) {
    const int64_t chunk = BLOCK * ((n + BLOCK * kMaxChunks - 1) / (BLOCK * kMaxChunks));
    const int64_t chunks = (n + chunk - 1) / chunk;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int64_t c = warp; c < chunks; c += kWarps) {
      const int64_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
      float acc = 0.f;
      for (int64_t j = c * chunk + lane; j < end; j += 32)
        if (j != skip) acc += w(j);
      acc = warp_sum(acc);
      if (lane == 0) s.chunk_sum[c] = acc;
    }
    __syncthreads();
    // Thread t takes `per` consecutive chunks.
    const int64_t per = (chunks + BLOCK - 1) / BLOCK;
    const int64_t c0 = threadIdx.x * per, c1 = c0 + per < chunks ? c0 + per : chunks;
    double mine = 0.0;
    for (int64_t c = c0; c < c1; ++c) mine += s.chunk_sum[c];
    double inclusive, total;
    ScanWide(s.temp.scan_wide).InclusiveSum(mine, inclusive, total);
    if (!(total > 0.0)) return -1;  // the same total in every thread
    const double threshold = static_cast<double>(u) * total;
    double before = inclusive - mine;
    FirstLast found{kNone, -1};
    for (int64_t c = c0; c < c1; ++c) {
      const float x = s.chunk_sum[c];
      s.chunk_before[c] = before;
      if (x > 0.f) {
        found.last = c;
        if (found.first == kNone && before + x > threshold) found.first = c;
      }
      before += x;
    }
    __syncthreads();  // the scan's storage is reused
    found = block_first_last(found);
    // Rounding may leave no crossing: then the last positive weight of the last chunk that has
    // one (no threshold is crossed there, so the chunk's scan returns it).
    const bool crossed = found.first != kNone;
    const int64_t c = crossed ? found.first : found.last;
    const int64_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
    return draw_in_chunk(w, skip, c * chunk, end, s.chunk_before[c],
                         crossed ? threshold : static_cast<double>(INFINITY));
  }

 private:
  // The first and last of the block's (first, last) pairs, in every thread.
  __device__ FirstLast block_first_last(FirstLast mine) {
    const FirstLast r = ReduceFL(s.temp.reduce_fl).Reduce(mine, FirstLastOp{});
    if (threadIdx.x == 0) s.fl = r;
    __syncthreads();
    const FirstLast result = s.fl;
    __syncthreads();  // s is reused by the next pass
    return result;
  }

  // The smallest j in [begin, end) with before + w(begin) + ... + w(j) > threshold and
  // w(j) > 0; else the largest j there with w(j) > 0.
  template <class W>
  __device__ int64_t draw_in_chunk(W& w, int64_t skip, int64_t begin, int64_t end, double before,
                                   double threshold) {
    float running = 0.f;  // weight of this chunk's elements before the current step
    int64_t last = -1;
    for (int64_t base = begin; base < end; base += BLOCK) {
      const int64_t j = base + threadIdx.x;
      const float x = j < end && j != skip ? w(j) : 0.f;
      float inclusive, step;
      Scan(s.temp.scan).InclusiveSum(x, inclusive, step);
      __syncthreads();
      const bool hit = x > 0.f && before + static_cast<double>(running + inclusive) > threshold;
      const FirstLast found = block_first_last({hit ? j : kNone, x > 0.f ? j : -1});
      if (found.last > last) last = found.last;
      if (found.first != kNone) return found.first;
      running += step;
    }
    return last;
  }
};

}  // namespace specdec::cuda
