// The executor of csrc/core for the CPU: one thread runs a row; sums accumulate in double.
#pragma once

#include <cstdint>

namespace specdec::cpu {

struct SerialExec {
  bool leader() const { return true; }
  void sync() {}

  template <class F>
  float sum(int64_t n, F f) {
    double total = 0.0;
    for (int64_t j = 0; j < n; ++j) total += f(j);
    return static_cast<float>(total);
  }

  template <class W>
  int64_t sample(int64_t n, W w, float total, float u) {
    const double threshold = static_cast<double>(u) * total;
    double cumulative = 0.0;
    int64_t last = -1;
    for (int64_t j = 0; j < n; ++j) {
      const float x = w(j);
      if (x > 0.f) {
        cumulative += x;
        last = j;
        if (cumulative > threshold) return j;
      }
    }
    return last;
  }
};

}  // namespace specdec::cpu
