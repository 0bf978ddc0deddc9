// The linear kernel compiled for AVX-512 with AVX512-BF16 (x86-64 only; CMakeLists.txt adds the
// flags and defines SPECDEC_CPU_AVX512): its bfloat16 products use vdpbf16ps. cpu/linear.cpp
// calls it only when the CPU has AVX512-BF16; its float32 products are the AVX-512 build's.
#if defined(SPECDEC_CPU_AVX512)
#define SPECDEC_CPU_ISA avx512bf16
#include "cpu/linear_kernel.h"
#endif
