// The linear kernel compiled for AVX-512 (x86-64 only; CMakeLists.txt adds the flags and
// defines SPECDEC_CPU_AVX512). cpu/linear.cpp calls it only when the CPU has AVX-512F.
#if defined(SPECDEC_CPU_AVX512)
#define SPECDEC_CPU_ISA avx512
#include "cpu/linear_kernel.h"
#endif
