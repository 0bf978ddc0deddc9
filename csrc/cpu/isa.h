// Which instruction set the CPU kernels compiled more than once (base, AVX2/FMA, AVX-512,
// AVX512-BF16) run with.
#pragma once

namespace specdec::cpu {

// Whether this build has the AVX2/FMA kernels (x86-64) and this CPU runs them.
inline bool cpu_has_avx2() {
#if defined(SPECDEC_CPU_AVX2)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

// Whether this build has the AVX-512 kernels (x86-64) and this CPU runs them.
inline bool cpu_has_avx512() {
#if defined(SPECDEC_CPU_AVX512)
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;
#endif
}

// Whether this build has the AVX-512 kernels and this CPU multiplies bfloat16 with them
// (AVX512-BF16).
inline bool cpu_has_avx512bf16() {
#if defined(SPECDEC_CPU_AVX512)
  static const bool has = cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

}  // namespace specdec::cpu
