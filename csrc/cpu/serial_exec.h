// The executor of csrc/core for the CPU: one thread runs a row.
//
// Passes over the vocabulary are memory-bound when written well, latency-bound when written as
// one running sum: sums here accumulate in float64 over 16 independent lanes (which the compiler
// vectorises), and a draw first skips whole blocks by their sums, then scans one block.
#pragma once

#include <cstdint>

namespace specdec::cpu {

struct SerialExec {
  static constexpr int kLanes = 16;
  static constexpr int64_t kBlock = 512;

  bool leader() const { return true; }
  void sync() {}

  // Sum of f(j) for begin <= j < end (at most kBlock), f(skip) taken as 0, in float64. The
  // weights are first written to a buffer by a plain loop (which the compiler vectorises once f
  // is inlined: flatten makes sure it is; skip is zeroed after it, as a compare per element
  // would keep the loop from vectorising), then added over kLanes independent float64 lanes.
  template <class F>
  __attribute__((flatten)) static double block_sum(int64_t begin, int64_t end, F& f,
                                                   int64_t skip) {
    float buf[kBlock];
    const int64_t m = end - begin;
    for (int64_t k = 0; k < m; ++k) buf[k] = f(begin + k);
    if (skip >= begin && skip < end) buf[skip - begin] = 0.f;
    double lanes[kLanes] = {};
    int64_t k = 0;
    for (; k + kLanes <= m; k += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] += buf[k + l];
    double total = 0.0;
    for (; k < m; ++k) total += buf[k];
    for (int l = 0; l < kLanes; ++l) total += lanes[l];
    return total;
  }

  template <class F>
  float sum(int64_t n, F f, int64_t skip = -1) {
    double total = 0.0;
    for (int64_t b = 0; b < n; b += kBlock)
      total += block_sum(b, b + kBlock < n ? b + kBlock : n, f, skip);
    return static_cast<float>(total);
  }

  template <class W>
  int64_t draw(int64_t n, W w, float u, int64_t skip = -1) {
    const float total = sum(n, w, skip);
    return total > 0.f ? sample(n, w, total, u, skip) : -1;
  }

 private:
  template <class W>
  int64_t sample(int64_t n, W w, float total, float u, int64_t skip) {
    const double threshold = static_cast<double>(u) * total;
    double cumulative = 0.0;
    int64_t last_block = -1;  // the last block with positive weight, for the rounding fallback
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t end = b + kBlock < n ? b + kBlock : n;
      const double s = block_sum(b, end, w, skip);
      if (s > 0.0) last_block = b;
      if (cumulative + s <= threshold) {
        cumulative += s;
        continue;
      }
      for (int64_t j = b; j < end; ++j) {
        const float x = j == skip ? 0.f : w(j);
        if (x > 0.f && (cumulative += x) > threshold) return j;
      }
    }
    if (last_block < 0) return -1;
    const int64_t end = last_block + kBlock < n ? last_block + kBlock : n;
    for (int64_t j = end - 1; j >= last_block; --j)
      if (j != skip && w(j) > 0.f) return j;
    return -1;
  }
};

}  // namespace specdec::cpu
