// The CPU tree-attention kernel. This header is compiled twice (attention_base.cpp for any CPU,
// attention_avx2.cpp with AVX2/FMA on x86-64), each time inside its own namespace
// SPECDEC_CPU_ISA; the launcher (attention.cpp) picks one at run time.
//
// Work is split over (row b, KV head, block of query positions). A task stacks the G query
// heads that share its KV head and its query positions into M = positions * G rows, so every
// K/V entry is read once for the whole GQA group, and runs a blocked flash-attention loop over
// the keys: scores = Q K^T and acc += P V as register-tiled matrix products, with the online
// softmax of core/attention.h in between. Everything accumulates in float32.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/attention.h"
#include "cpu/attention_args.h"

#ifndef SPECDEC_CPU_ISA
#error "define SPECDEC_CPU_ISA before including cpu/attention_kernel.h"
#endif

namespace specdec::cpu::SPECDEC_CPU_ISA {
namespace {

// 8 floats; GCC/Clang lower it to AVX registers where enabled, to pairs of SSE/NEON ones
// elsewhere.
typedef float v8 __attribute__((vector_size(32)));
constexpr int64_t kNR = 16;          // columns of a register tile (two v8)
constexpr int64_t kMR = 6;           // rows of a register tile
constexpr int64_t kKeyBlock = 128;   // keys per block
constexpr int64_t kMaxRows = 512;    // query rows per task
constexpr int64_t kSmallRows = 24;   // up to this many rows, Q K^T without transposing K

inline v8 load8(const float* p) {
  v8 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
inline void store8(float* p, v8 x) { std::memcpy(p, &x, sizeof x); }
inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// C[MR, 16] (+)= A[MR, K] B[K, 16]; A, B, C row-major with leading dimensions lda, ldb, ldc.
template <int MR>
inline void tile(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                 int64_t K, bool accumulate) {
  v8 c0[MR], c1[MR];
  for (int r = 0; r < MR; ++r) {
    c0[r] = accumulate ? load8(C + r * ldc) : v8{};
    c1[r] = accumulate ? load8(C + r * ldc + 8) : v8{};
  }
  for (int64_t k = 0; k < K; ++k) {
    const v8 b0 = load8(B + k * ldb), b1 = load8(B + k * ldb + 8);
    for (int r = 0; r < MR; ++r) {
      const float a = A[r * lda + k];
      c0[r] += a * b0;
      c1[r] += a * b1;
    }
  }
  for (int r = 0; r < MR; ++r) {
    store8(C + r * ldc, c0[r]);
    store8(C + r * ldc + 8, c1[r]);
  }
}

// C[M, N] (+)= A[M, K] B[K, N], N a multiple of 16.
void matmul(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
            int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  for (int64_t n = 0; n < N; n += kNR) {
    int64_t m = 0;
    for (; m + kMR <= M; m += kMR)
      tile<kMR>(A + m * lda, lda, B + n, ldb, C + m * ldc + n, ldc, K, accumulate);
    const float* a = A + m * lda;
    float* c = C + m * ldc + n;
    switch (M - m) {
      case 5: tile<5>(a, lda, B + n, ldb, c, ldc, K, accumulate); break;
      case 4: tile<4>(a, lda, B + n, ldb, c, ldc, K, accumulate); break;
      case 3: tile<3>(a, lda, B + n, ldb, c, ldc, K, accumulate); break;
      case 2: tile<2>(a, lda, B + n, ldb, c, ldc, K, accumulate); break;
      case 1: tile<1>(a, lda, B + n, ldb, c, ldc, K, accumulate); break;
      default: break;
    }
  }
}

inline float hsum(v8 x) {
  float t = 0.f;
  for (int j = 0; j < 8; ++j) t += x[j];
  return t;
}

// C[MR, NR] = A[MR, K] B[NR, K]^T: dot products of rows, K a multiple of 8 or not.
template <int MR, int NR>
inline void tile_nt(const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                    int64_t ldc, int64_t K) {
  v8 c[MR][NR] = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    v8 b[NR];
    for (int n = 0; n < NR; ++n) b[n] = load8(B + n * ldb + k);
    for (int r = 0; r < MR; ++r) {
      const v8 x = load8(A + r * lda + k);
      for (int n = 0; n < NR; ++n) c[r][n] += x * b[n];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int n = 0; n < NR; ++n) {
      float t = hsum(c[r][n]);
      for (int64_t j = k; j < K; ++j) t += A[r * lda + j] * B[n * ldb + j];
      C[r * ldc + n] = t;
    }
}

// One tile of NR columns and `rows` (1..4) rows: the row count picked at run time.
template <int NR>
inline void tile_rows_nt(int64_t rows, const float* A, int64_t lda, const float* B, int64_t ldb,
                         float* C, int64_t ldc, int64_t K) {
  switch (rows) {
    case 4: tile_nt<4, NR>(A, lda, B, ldb, C, ldc, K); break;
    case 3: tile_nt<3, NR>(A, lda, B, ldb, C, ldc, K); break;
    case 2: tile_nt<2, NR>(A, lda, B, ldb, C, ldc, K); break;
    default: tile_nt<1, NR>(A, lda, B, ldb, C, ldc, K); break;
  }
}

// C[M, N] = A[M, K] B[N, K]^T.
void matmul_nt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
               int64_t ldb, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; m += 4) {
    const int64_t rows = std::min<int64_t>(M - m, 4);
    const float* a = A + m * lda;
    int64_t n = 0;
    for (; n + 2 <= N; n += 2) tile_rows_nt<2>(rows, a, lda, B + n * ldb, ldb, C + m * ldc + n, ldc, K);
    if (n < N) tile_rows_nt<1>(rows, a, lda, B + n * ldb, ldb, C + m * ldc + n, ldc, K);
  }
}

// Scratch of one task, reused across the tasks a thread runs.
struct Scratch {
  std::vector<float> q, scores, acc, kt, v;
  std::vector<core::SoftmaxState> state;
};

template <class scalar_t>
void run_task(const AttentionArgs& a, int64_t b, int64_t kvh, int64_t i0, int64_t i1,
              Scratch& w) {
  const int64_t G = a.H / a.Hkv, D = a.D, T = a.T;
  const int64_t Dp = round_up(D, kNR), M = (i1 - i0) * G;
  const int64_t P = a.prefix_len[b];
  const bool causal = a.mask == nullptr;
  const int64_t n_keys = core::keys_needed(causal, i1, P, T);
  const auto* q = static_cast<const scalar_t*>(a.q);
  const auto* kc = static_cast<const scalar_t*>(a.k) + b * a.k_sb + kvh * a.k_sh;
  const auto* vc = static_cast<const scalar_t*>(a.v) + b * a.v_sb + kvh * a.v_sh;
  // fp32 values whose rows are a whole number of register tiles are read in place.
  const bool v_in_place = std::is_same_v<scalar_t, float> && D == Dp;

  w.q.resize(M * D);
  w.scores.resize(M * kKeyBlock);
  w.acc.assign(M * Dp, 0.f);
  w.kt.resize(D * kKeyBlock);  // K^T, or K rows converted to fp32
  w.v.resize(v_in_place ? 0 : kKeyBlock * Dp);
  w.state.assign(M, core::SoftmaxState{});
  // Row r is query position i0 + r / G of head kvh * G + r % G, pre-scaled.
  for (int64_t r = 0; r < M; ++r) {
    const int64_t i = i0 + r / G, h = kvh * G + r % G;
    const scalar_t* src = q + ((b * a.H + h) * T + i) * D;
    for (int64_t d = 0; d < D; ++d) w.q[r * D + d] = static_cast<float>(src[d]) * a.scale;
  }

  for (int64_t k0 = 0; k0 < n_keys; k0 += kKeyBlock) {
    const int64_t kb = std::min(kKeyBlock, n_keys - k0), kbp = round_up(kb, kNR);
    float* s = w.scores.data();
    if (M <= kSmallRows) {
      // Few rows: dot products against the key rows as they are (fp32) or converted.
      const float* k = nullptr;
      int64_t ldk = D;
      if constexpr (std::is_same_v<scalar_t, float>) {
        k = kc + k0 * a.k_ss;
        ldk = a.k_ss;
      } else {
        float* kp = w.kt.data();
        for (int64_t c = 0; c < kb; ++c) {
          const scalar_t* krow = kc + (k0 + c) * a.k_ss;
          for (int64_t d = 0; d < D; ++d) kp[c * D + d] = static_cast<float>(krow[d]);
        }
        k = kp;
      }
      matmul_nt(M, kb, D, w.q.data(), D, k, ldk, s, kbp);
    } else {
      // Many rows: K^T of the block (zero-padded to kbp columns) for the register-tiled
      // product, transposed 8 keys at a time so that writes stay contiguous.
      float* kt = w.kt.data();
      for (int64_t c0 = 0; c0 < kbp; c0 += 8) {
        const scalar_t* krow[8];
        for (int j = 0; j < 8; ++j) krow[j] = c0 + j < kb ? kc + (k0 + c0 + j) * a.k_ss : nullptr;
        for (int64_t d = 0; d < D; ++d)
          for (int j = 0; j < 8; ++j)
            kt[d * kbp + c0 + j] = krow[j] ? static_cast<float>(krow[j][d]) : 0.f;
      }
      matmul(M, kbp, D, w.q.data(), D, kt, kbp, s, kbp, false);
    }

    // Tree keys of the block are masked per query; padding columns never count.
    const int64_t c_tree = std::max<int64_t>(P - k0, 0);
    for (int64_t r = 0; r < M; ++r) {
      const int64_t i = i0 + r / G;
      const bool* mask_row = causal ? nullptr : a.mask + (b * T + i) * T;
      float* sr = s + r * kbp;
      for (int64_t c = c_tree; c < kb; ++c)
        if (!core::key_visible(mask_row, i, k0 + c, P, T)) sr[c] = -INFINITY;
      for (int64_t c = kb; c < kbp; ++c) sr[c] = -INFINITY;
      v8 vmax = load8(sr);
      for (int64_t c = 8; c < kbp; c += 8) {
        const v8 x = load8(sr + c);
        vmax = vmax > x ? vmax : x;
      }
      float block_max = vmax[0];
      for (int j = 1; j < 8; ++j) block_max = std::max(block_max, vmax[j]);
      core::SoftmaxState& st = w.state[r];
      const float alpha = core::softmax_rescale(st, block_max);
      const float m = st.m;
      for (int64_t c = 0; c < kbp; ++c) sr[c] = core::softmax_weight(sr[c], m);
      v8 vsum{};
      for (int64_t c = 0; c < kbp; c += 8) vsum += load8(sr + c);
      st.l += hsum(vsum);
      if (alpha != 1.f) {
        float* acc = w.acc.data() + r * Dp;
        for (int64_t d = 0; d < Dp; ++d) acc[d] *= alpha;
      }
    }

    const float* v = nullptr;
    int64_t ldv = Dp;
    if (v_in_place) {
      v = reinterpret_cast<const float*>(vc + k0 * a.v_ss);
      ldv = a.v_ss;
    } else {
      float* vp = w.v.data();
      for (int64_t c = 0; c < kb; ++c) {
        const scalar_t* vrow = vc + (k0 + c) * a.v_ss;
        for (int64_t d = 0; d < D; ++d) vp[c * Dp + d] = static_cast<float>(vrow[d]);
        for (int64_t d = D; d < Dp; ++d) vp[c * Dp + d] = 0.f;
      }
      v = vp;
    }
    matmul(M, Dp, kb, s, kbp, v, ldv, w.acc.data(), Dp, true);
  }

  auto* out = static_cast<scalar_t*>(a.out);
  for (int64_t r = 0; r < M; ++r) {
    const int64_t i = i0 + r / G, h = kvh * G + r % G;
    const float inv = core::softmax_inv_sum(w.state[r].l);
    const float* acc = w.acc.data() + r * Dp;
    scalar_t* dst = out + ((b * a.H + h) * T + i) * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<scalar_t>(acc[d] * inv);
  }
}

template <class scalar_t>
void run(const AttentionArgs& a) {
  const int64_t G = a.H / a.Hkv;
  // Query positions per task: as many as fit kMaxRows rows, in equal blocks.
  const int64_t max_pos = std::max<int64_t>(1, kMaxRows / G);
  const int64_t n_blocks = (a.T + max_pos - 1) / max_pos;
  const int64_t per_block = (a.T + n_blocks - 1) / n_blocks;
  const int64_t tasks = a.B * a.Hkv * n_blocks;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    Scratch w;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t blk = task % n_blocks, bh = task / n_blocks;
      const int64_t i0 = blk * per_block, i1 = std::min(a.T, i0 + per_block);
      if (i0 < i1) run_task<scalar_t>(a, bh / a.Hkv, bh % a.Hkv, i0, i1, w);
    }
  });
}

}  // namespace

void tree_attention(const AttentionArgs& a) {
  switch (a.dtype) {
    case at::kFloat: run<float>(a); break;
    case at::kDouble: run<double>(a); break;
    case at::kHalf: run<c10::Half>(a); break;
    case at::kBFloat16: run<c10::BFloat16>(a); break;
    default: TORCH_CHECK(false, "specdec.tree_attention: unsupported dtype ", a.dtype);
  }
}

}  // namespace specdec::cpu::SPECDEC_CPU_ISA
