// What the CPU kernel of specdec::linear needs, gathered by its launcher (cpu/linear.cpp) after
// the argument checks.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace specdec::cpu {

// Every tensor has the element type `dtype` (float32 or bfloat16).
struct LinearArgs {
  const void* x;     // [M, K], row stride ldx, last dim contiguous
  const void* w;     // [N, K], contiguous
  const void* bias;  // [N], or nullptr
  void* y;           // [M, N], row stride ldy, last dim contiguous
  int64_t M, N, K, ldx, ldy;
  c10::ScalarType dtype;
};

// One instantiation per instruction set (see cpu/linear_kernel.h).
namespace base {
void linear(const LinearArgs& a);
}
namespace avx2 {
void linear(const LinearArgs& a);
}
namespace avx512 {
void linear(const LinearArgs& a);
}
namespace avx512bf16 {
void linear(const LinearArgs& a);
}

}  // namespace specdec::cpu
