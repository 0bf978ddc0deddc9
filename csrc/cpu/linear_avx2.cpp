// The linear kernel compiled for AVX2 + FMA (x86-64 only; CMakeLists.txt adds the flags and
// defines SPECDEC_CPU_AVX2). cpu/linear.cpp calls it only when the CPU has both.
#if defined(SPECDEC_CPU_AVX2)
#define SPECDEC_CPU_ISA avx2
#include "cpu/linear_kernel.h"
#endif
