// The CPU kernel of specdec::linear: y[M, N] = x[M, K] W[N, K]^T (+ bias), float32 or
// bfloat16 (summed in float32, rounded once). This header is compiled four times
// (linear_base.cpp for any CPU; on x86-64 linear_avx2.cpp with AVX2/FMA, linear_avx512.cpp with
// AVX-512 and linear_avx512bf16.cpp with AVX512-BF16 too), each time inside its own namespace
// SPECDEC_CPU_ISA; the launcher (linear.cpp) picks the widest the CPU runs.
//
// Row invariance (what keeps a target's logits the same whatever the number of tokens in its
// pass, docs/verification.md): every output y[m, n] is one dot product computed the same way
// for any M, any position of its row and any thread count: L lane sums (L = 8, 16 with
// AVX-512) over k = 0, L, 2L, ... (the last block zero-padded), each a chain of fused
// multiply-adds in order of k (bfloat16 widened to float32 exactly; with AVX512-BF16, blocks of
// 2L, lane i taking elements 2i and 2i + 1 in one vdpbf16ps), then halved pairwise (lane i +
// lane i + L/2, ...) down to one sum, then the bias. Register tiles of several rows and
// columns only share the loads, never a sum. (The sums differ between instruction sets: a
// machine always runs the same one.)
//
// Speed: a decoding step multiplies one row (or a few) by every weight, so it streams the
// weights from memory once: the tasks split the output columns, each reads its block of weight
// rows once for all of x's rows (x stays in cache), and the tiles keep 12 (24 with AVX-512)
// independent sums in flight. Passes over 1 to 3 rows take tiles of all the rows and as many
// columns as the registers hold (16, 12, 8 with AVX-512), so that each tile streams that many
// weight rows at once (docs/verification.md). With 4 rows or more, the first row tile of a group
// of columns reads its weights and the others reuse them from L1. Either way the memory keeps
// streaming while the tiles compute: every tile asks for (its share of) the weights of the next
// tile or group (`Ahead`) into L2, not L1, where they would compete with the weights that later
// tiles still read (docs/benchmarks.md: the `specdec.ops.linear` entry of "Tried and not kept").
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "cpu/linear_args.h"

#ifndef SPECDEC_CPU_ISA
#error "define SPECDEC_CPU_ISA before including cpu/linear_kernel.h"
#endif

namespace specdec::cpu::SPECDEC_CPU_ISA {
namespace {

// L floats, and the register tiles: kRows x kCols sums for several rows; for one, two or three
// rows (the few_rows path) as many columns as the registers hold.
// GCC/Clang lower a vector to one AVX/AVX-512 register where enabled, to SSE/NEON ones elsewhere.
#if defined(__AVX512F__)
constexpr int L = 16, kRows = 4, kCols = 6, kOneRowCols = 16, kTwoRowCols = 12, kThreeRowCols = 8;
#else
constexpr int L = 8, kRows = 3, kCols = 4, kOneRowCols = 12, kTwoRowCols = 6, kThreeRowCols = 4;
#endif
// How far ahead of its loads a tile asks for a weight row (floats: 4 cache lines): the hardware
// prefetcher alone fell behind when a tile reads only a few rows.
constexpr int64_t kPrefetch = 64;
constexpr int64_t kLineBytes = 64;

// The weights of the next tile or group of columns (nullptr: none), whose cache lines this tile
// asks for into L2: lines part, part + parts, part + 2 parts, ... of each of its rows.
struct Ahead {
  const void* next = nullptr;
  int part = 0, parts = 1;
};
typedef float vec __attribute__((vector_size(L * sizeof(float))));

typedef uint16_t half_bits __attribute__((vector_size(L * sizeof(uint16_t))));
typedef uint32_t word_bits __attribute__((vector_size(L * sizeof(uint32_t))));

// acc + a * b, rounded once with FMA, twice in the base kernel (these files are compiled
// without FMA contraction, so every tile shape rounds the same way).
inline vec fma(vec a, vec b, vec acc) {
#if defined(__AVX512F__)
  return (vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#elif defined(__AVX2__) && defined(__FMA__)
  return (vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#else
  return acc + a * b;
#endif
}

// How a tile reads elements of type T and adds their products into L float32 sums: `step`
// elements of k a load (`in`), `mac` adds their products to acc.
template <class T>
struct Lanes;

template <>
struct Lanes<float> {
  using in = vec;
  static constexpr int step = L;
  static in load(const float* p) {
    vec x;
    std::memcpy(&x, p, sizeof x);
    return x;
  }
  static vec mac(in x, in w, vec acc) { return fma(x, w, acc); }
};

#if defined(__AVX512BF16__)
// AVX512-BF16: 32 elements a load; lane i adds the products of elements 2i and 2i + 1
// (vdpbf16ps: exact bf16 products, float32 sums rounded to nearest even, denormals flushed).
template <>
struct Lanes<c10::BFloat16> {
  using in = __m512bh;
  static constexpr int step = 2 * L;
  static in load(const c10::BFloat16* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static vec mac(in x, in w, vec acc) { return (vec)_mm512_dpbf16_ps((__m512)acc, x, w); }
};
#else
// bfloat16 is the upper half of a float32: widened exactly, then multiplied as float32.
template <>
struct Lanes<c10::BFloat16> {
  using in = vec;
  static constexpr int step = L;
  static in load(const c10::BFloat16* p) {
    half_bits h;
    std::memcpy(&h, p, sizeof h);
    const word_bits w = __builtin_convertvector(h, word_bits) << 16;
    vec x;
    std::memcpy(&x, &w, sizeof x);
    return x;
  }
  static vec mac(in x, in w, vec acc) { return fma(x, w, acc); }
};
#endif

// The first n < step elements of p, then zeros.
template <class T>
inline typename Lanes<T>::in load_tail(const T* p, int64_t n) {
  T t[Lanes<T>::step] = {};
  std::memcpy(t, p, n * sizeof(T));
  return Lanes<T>::load(t);
}
// Lane i + lane i + h for h = L/2, L/4, ..., 1 (lanes from h on are left over): in registers,
// each step one shuffle and one add of the whole vector.
typedef int32_t lane_ids __attribute__((vector_size(L * sizeof(int32_t))));
template <int H>
constexpr lane_ids shifted() {
  lane_ids ids{};
  for (int i = 0; i < L; ++i) ids[i] = (i + H) % L;
  return ids;
}
inline float hsum(vec x) {
  if constexpr (L == 16) x = x + __builtin_shuffle(x, shifted<8>());
  x = x + __builtin_shuffle(x, shifted<4>());
  x = x + __builtin_shuffle(x, shifted<2>());
  x = x + __builtin_shuffle(x, shifted<1>());
  return x[0];
}

// y[r, c] = x[r, :] . w[c, :] (+ bias[c]) for r < MR, c < NR.
template <int MR, int NR, class T>
inline void tile(const LinearArgs& a, const T* x, const T* w, const T* bias, T* y, Ahead ahead = {}) {
  using E = Lanes<T>;
  // A line holds a whole number of loads (16 or 32 elements; a load takes 8 to 32).
  constexpr int64_t kLine = kLineBytes / sizeof(T);
  static_assert(kLine % E::step == 0);
  vec acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = vec{};
  const int64_t K = a.K, KS = K / E::step * E::step;
  const T* next = static_cast<const T*>(ahead.next);
  int64_t next_line = next ? ahead.part * kLine : -1;  // the k of the next line asked for
  for (int64_t k = 0; k < KS; k += E::step) {
    if (k == next_line) {
      for (int c = 0; c < NR; ++c) __builtin_prefetch(next + c * K + k, 0, 2);
      next_line += ahead.parts * kLine;
    }
    typename E::in xv[MR];
    for (int r = 0; r < MR; ++r) xv[r] = E::load(x + r * a.ldx + k);
    for (int c = 0; c < NR; ++c) {
      __builtin_prefetch(w + c * K + k + kPrefetch);
      const typename E::in wv = E::load(w + c * K + k);
      for (int r = 0; r < MR; ++r) acc[r][c] = E::mac(xv[r], wv, acc[r][c]);
    }
  }
  if (KS < K) {
    typename E::in xv[MR];
    for (int r = 0; r < MR; ++r) xv[r] = load_tail(x + r * a.ldx + KS, K - KS);
    for (int c = 0; c < NR; ++c) {
      const typename E::in wv = load_tail(w + c * K + KS, K - KS);
      for (int r = 0; r < MR; ++r) acc[r][c] = E::mac(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) {
      const float s = hsum(acc[r][c]);
      y[r * a.ldy + c] = static_cast<T>(bias ? s + static_cast<float>(bias[c]) : s);
    }
}

// Rows [m0, m1) of the output columns [n0, n0 + NR): tiles of kRows rows, then one tile of
// the 1 .. kRows - 1 rows left; the tiles share out the next group's lines (`Ahead`), which
// `ahead.next` points to (nullptr for the last group).
template <int NR, class T, int MR = kRows>
void columns(const LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, Ahead ahead) {
  const T *x = static_cast<const T*>(a.x), *w = static_cast<const T*>(a.w) + n0 * a.K;
  const T* bias = a.bias ? static_cast<const T*>(a.bias) + n0 : nullptr;
  T* y = static_cast<T*>(a.y);
  int64_t m = m0;
  for (; m + MR <= m1; m += MR, ++ahead.part) tile<MR, NR>(a, x + m * a.ldx, w, bias, y + m * a.ldy + n0, ahead);
  if constexpr (MR > 1) {
    if (m < m1) columns<NR, T, MR - 1>(a, m, m1, n0, ahead);
  }
}

// A few rows (MR, all of x's), columns [n0, n1): NR columns a tile, as many as the registers
// hold, so that a tile streams that many weight rows from memory at once (a pass over a few
// tokens reads every weight once, as a one-token pass does); each tile asks for the next one's.
template <int MR, int NR, class T>
void few_rows(const LinearArgs& a, int64_t n0, int64_t n1) {
  const T *x = static_cast<const T*>(a.x), *w = static_cast<const T*>(a.w);
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) {
    const Ahead ahead{n + 2 * NR <= n1 ? w + (n + NR) * a.K : nullptr, 0, 1};
    tile<MR, NR>(a, x, w + n * a.K, bias ? bias + n : nullptr, y + n, ahead);
  }
  for (; n < n1; ++n) tile<MR, 1>(a, x, w + n * a.K, bias ? bias + n : nullptr, y + n);
}

// All of x's MR rows: blocks of 4 tiles of NR columns, enough tasks for every thread.
template <int MR, int NR, class T>
void few_rows_parallel(const LinearArgs& a) {
  constexpr int64_t kBlock = 4 * NR;
  at::parallel_for(0, (a.N + kBlock - 1) / kBlock, 1, [&](int64_t b0, int64_t b1) {
    few_rows<MR, NR, T>(a, b0 * kBlock, std::min(b1 * kBlock, a.N));
  });
}

template <class T>
void linear(const LinearArgs& a) {
  switch (a.M) {
    case 1: return few_rows_parallel<1, kOneRowCols, T>(a);
    case 2: return few_rows_parallel<2, kTwoRowCols, T>(a);
    case 3: return few_rows_parallel<3, kThreeRowCols, T>(a);
    default: break;
  }
  // Rows in chunks that stay in cache while a block of weight rows is read for all of them.
  constexpr int64_t kRowChunk = 96, kColBlock = 4 * kCols;
  at::parallel_for(0, (a.N + kColBlock - 1) / kColBlock, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t m0 = 0; m0 < a.M; m0 += kRowChunk) {
      const int64_t m1 = std::min(m0 + kRowChunk, a.M);
      const int tiles = static_cast<int>((m1 - m0 + kRows - 1) / kRows);
      for (int64_t n = b0 * kColBlock; n < std::min(b1 * kColBlock, a.N); n += kCols) {
        if (n + kCols <= a.N) {
          const bool last = n + 2 * kCols > a.N;
          const Ahead ahead{last ? nullptr : static_cast<const T*>(a.w) + (n + kCols) * a.K, 0, tiles};
          columns<kCols, T>(a, m0, m1, n, ahead);
        } else {
          for (int64_t c = n; c < a.N; ++c) columns<1, T>(a, m0, m1, c, Ahead{});
        }
      }
    }
  });
}

}  // namespace

void linear(const LinearArgs& a) {
  if (a.dtype == c10::kBFloat16)
    linear<c10::BFloat16>(a);
  else
    linear<float>(a);
}

}  // namespace specdec::cpu::SPECDEC_CPU_ISA
