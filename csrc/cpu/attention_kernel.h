// The CPU tree-attention kernel. This header is compiled twice (attention_base.cpp for any CPU,
// attention_avx2.cpp with AVX2/FMA on x86-64), each time inside its own namespace
// SPECDEC_CPU_ISA; the launcher (attention.cpp) picks one at run time.
//
// Work is split over (row b, KV head, block of query positions). A task stacks the G query
// heads that share its KV head and its query positions into M = positions * G rows, so every
// K/V entry is read once for the whole GQA group, and runs a blocked flash-attention loop over
// the keys: scores = Q K^T and acc += P V as register-tiled matrix products, with the online
// softmax of core/attention.h in between. Everything accumulates in float32.
//
// Row invariance (what makes speculative decoding exact in any dtype): a query's output has
// the same bits whatever the number of queries sharing the pass. Each row's products run in
// the same order for any row count (one Q K^T path, K transposed), keys are blocked by their
// index in the query's own key sequence, and a tree node's keys are gathered in that order
// (prefix, then its ancestors by depth), as a one-token pass on its path would read them.
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

// Scratch of one task, reused across the tasks a thread runs.
struct Scratch {
  std::vector<float> q, scores, acc, kt, v;
  std::vector<core::SoftmaxState> state;
};

// The keys a task reads, as a range [begin, end) of each query's key sequence. By default the
// sequence is the prefix then the T tree slots (masked per query; end -1: as far as the task's
// queries need). With `path`, it is the prefix then the tree slots path[0..n_path), all visible:
// one query's keys in the order of a one-token pass on its path.
struct Keys {
  const int64_t* path = nullptr;
  int64_t n_path = 0;
  int64_t begin = 0, end = -1;
};

// Queries [i0, i1) of row b against the KV head kvh. `resume`: continue the softmax states and
// accumulators left in w (same queries); `finish`: normalise and write the output.
template <class scalar_t>
void run_task(const AttentionArgs& a, int64_t b, int64_t kvh, int64_t i0, int64_t i1,
              Scratch& w, const Keys& keys = {}, bool resume = false, bool finish = true) {
  const int64_t G = a.H / a.Hkv, D = a.D, T = a.T;
  const int64_t Dp = round_up(D, kNR), M = (i1 - i0) * G;
  const int64_t P = a.prefix_len[b];
  const bool causal = a.mask == nullptr;
  const int64_t n_keys = keys.end >= 0 ? keys.end
                         : keys.path ? P + keys.n_path
                                     : core::keys_needed(causal, i1, P, T);
  // Cache slot of the j-th key of the sequence.
  auto slot = [&](int64_t j) { return keys.path && j >= P ? P + keys.path[j - P] : j; };
  const auto* q = static_cast<const scalar_t*>(a.q);
  const auto* kc = static_cast<const scalar_t*>(a.k) + b * a.k_sb + kvh * a.k_sh;
  const auto* vc = static_cast<const scalar_t*>(a.v) + b * a.v_sb + kvh * a.v_sh;
  // fp32 values whose rows are a whole number of register tiles are read in place.
  const bool v_in_place = std::is_same_v<scalar_t, float> && D == Dp && !keys.path;

  w.q.resize(M * D);
  w.scores.resize(M * kKeyBlock);
  w.kt.resize(D * kKeyBlock);  // K^T of a block
  w.v.resize(v_in_place ? 0 : kKeyBlock * Dp);
  if (!resume) {
    w.acc.assign(M * Dp, 0.f);
    w.state.assign(M, core::SoftmaxState{});
  }
  // Row r is query position i0 + r / G of head kvh * G + r % G, pre-scaled.
  for (int64_t r = 0; r < M; ++r) {
    const int64_t i = i0 + r / G, h = kvh * G + r % G;
    const scalar_t* src = q + ((b * a.H + h) * T + i) * D;
    for (int64_t d = 0; d < D; ++d) w.q[r * D + d] = static_cast<float>(src[d]) * a.scale;
  }

  for (int64_t k0 = keys.begin; k0 < n_keys; k0 += kKeyBlock) {
    const int64_t kb = std::min(kKeyBlock, n_keys - k0), kbp = round_up(kb, kNR);
    float* s = w.scores.data();
    // K^T of the block (zero-padded to kbp columns) for the register-tiled product, transposed
    // 8 keys at a time so that writes stay contiguous.
    float* kt = w.kt.data();
    for (int64_t c0 = 0; c0 < kbp; c0 += 8) {
      const scalar_t* krow[8];
      for (int j = 0; j < 8; ++j) krow[j] = c0 + j < kb ? kc + slot(k0 + c0 + j) * a.k_ss : nullptr;
      for (int64_t d = 0; d < D; ++d)
        for (int j = 0; j < 8; ++j)
          kt[d * kbp + c0 + j] = krow[j] ? static_cast<float>(krow[j][d]) : 0.f;
    }
    matmul(M, kbp, D, w.q.data(), D, kt, kbp, s, kbp, false);

    // Tree keys of the block are masked per query (a path's keys are all visible); padding
    // columns never count.
    const int64_t c_tree = keys.path ? kb : std::max<int64_t>(P - k0, 0);
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
        const scalar_t* vrow = vc + slot(k0 + c) * a.v_ss;
        for (int64_t d = 0; d < D; ++d) vp[c * Dp + d] = static_cast<float>(vrow[d]);
        for (int64_t d = D; d < Dp; ++d) vp[c * Dp + d] = 0.f;
      }
      v = vp;
    }
    matmul(M, Dp, kb, s, kbp, v, ldv, w.acc.data(), Dp, true);
  }

  if (!finish) return;
  auto* out = static_cast<scalar_t*>(a.out);
  for (int64_t r = 0; r < M; ++r) {
    const int64_t i = i0 + r / G, h = kvh * G + r % G;
    const float inv = core::softmax_inv_sum(w.state[r].l);
    const float* acc = w.acc.data() + r * Dp;
    scalar_t* dst = out + ((b * a.H + h) * T + i) * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<scalar_t>(acc[d] * inv);
  }
}

// A tree (explicit mask) block of positions [i0, i1): the prefix's whole key blocks stacked
// for all of them (every query sees the prefix), then per position the rest of the prefix and
// the tree keys it sees, gathered in slot order (a parent precedes its children).
template <class scalar_t>
void run_tree_block(const AttentionArgs& a, int64_t b, int64_t kvh, int64_t i0, int64_t i1,
                    Scratch& w, Scratch& one, std::vector<int64_t>& path) {
  const int64_t G = a.H / a.Hkv, Dp = round_up(a.D, kNR), P = a.prefix_len[b];
  const int64_t whole = P / kKeyBlock * kKeyBlock;
  run_task<scalar_t>(a, b, kvh, i0, i1, w, Keys{nullptr, 0, 0, whole}, false, false);
  for (int64_t i = i0; i < i1; ++i) {
    const bool* row = a.mask + (b * a.T + i) * a.T;
    int64_t n = 0;
    for (int64_t t = 0; t < a.T; ++t)
      if (row[t]) path[n++] = t;
    const int64_t r = (i - i0) * G;
    one.acc.assign(w.acc.begin() + r * Dp, w.acc.begin() + (r + G) * Dp);
    one.state.assign(w.state.begin() + r, w.state.begin() + r + G);
    run_task<scalar_t>(a, b, kvh, i, i + 1, one, Keys{path.data(), n, whole, P + n}, true, true);
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
    Scratch w, one;
    std::vector<int64_t> path(a.mask ? a.T : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t blk = task % n_blocks, bh = task / n_blocks;
      const int64_t i0 = blk * per_block, i1 = std::min(a.T, i0 + per_block);
      if (i0 >= i1) continue;
      if (a.mask)
        run_tree_block<scalar_t>(a, bh / a.Hkv, bh % a.Hkv, i0, i1, w, one, path);
      else
        run_task<scalar_t>(a, bh / a.Hkv, bh % a.Hkv, i0, i1, w);
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
