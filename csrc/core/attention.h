// Per-element logic of tree attention and of the KV-cache commit, written once for the CPU and
// CUDA kernels.
//
// Attention is computed with an online softmax: a query keeps the running maximum m of its
// scores, the running sum l of exp(score - m) and an accumulator acc = sum exp(score - m) * v.
// A block of new scores raises m, which rescales l and acc by exp(m_old - m_new). Partial
// states over disjoint key ranges (CUDA splits the prefix across thread blocks) merge the same
// way. A query that sees no key at all (m = -inf) outputs zeros.
#pragma once

#include <bit>

#include "core/common.h"

namespace specdec::core {

// exp(x) for x <= 0 (softmax weights), 0 for x = -inf. On the host a polynomial that compilers
// vectorise (glibc's expf does not vectorise without -ffast-math), accurate to about 2e-7
// relative; on the device the hardware exponential.
SPECDEC_HD inline float softmax_exp(float x) {
#if defined(__CUDA_ARCH__)
  return __expf(x);
#else
  // Branch-free (selects only) so that the loops calling it vectorise.
  const float xc = x > -87.f ? x : -87.f;
  // x = n ln2 + r, |r| <= ln2 / 2; the magic constant rounds to nearest without a call.
  const float n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = xc - n * 0.693145751953125f - n * 1.42860682030941723e-06f;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const float scale = std::bit_cast<float>((static_cast<int>(n) + 127) << 23);
  return x > -87.f ? p * scale : 0.f;
#endif
}

// The running state of one query's online softmax.
struct SoftmaxState {
  float m = -INFINITY;  // largest score so far
  float l = 0.f;        // sum of exp(score - m)
};

// Raises the state's maximum to cover a block whose largest score is block_max; returns the
// factor by which the accumulator (and nothing else) must now be scaled. The caller then adds
// softmax_weight(s, st.m) of every score of the block to st.l and to the accumulator.
SPECDEC_HD inline float softmax_rescale(SoftmaxState& st, float block_max) {
  const float m_new = block_max > st.m ? block_max : st.m;
  const float alpha = st.m == -INFINITY ? 0.f : softmax_exp(st.m - m_new);
  st.l *= alpha;
  st.m = m_new;
  return alpha;
}

// Weight of a score under a state's maximum; a masked score (-inf) weighs 0.
SPECDEC_HD inline float softmax_weight(float score, float m) {
  const float w = softmax_exp(score - m);  // computed either way: a select, not a branch
  return score == -INFINITY ? 0.f : w;
}

// 1 / l, or 0 for a query that saw no key (its accumulator is 0 too).
SPECDEC_HD inline float softmax_inv_sum(float l) { return l > 0.f ? 1.f / l : 0.f; }

// Merging partial states over disjoint key ranges: the common maximum, then each partial's
// weight exp(m_s - m); out = sum_s w_s acc_s / sum_s w_s l_s.
SPECDEC_HD inline float merge_max(float m, float m_s) { return m_s > m ? m_s : m; }
SPECDEC_HD inline float merge_weight(float m_s, float m) {
  return m_s == -INFINITY ? 0.f : softmax_exp(m_s - m);
}

// Whether tree query i (of T) sees the key at absolute position j of its row, whose prefix
// (committed) length is P and whose T tree tokens sit at P..P+T-1. mask_row is the query's row
// of the [T, T] tree mask, or nullptr for a causal (chain) block.
SPECDEC_HD inline bool key_visible(const bool* mask_row, int64_t i, int64_t j, int64_t P,
                                   int64_t T) {
  if (j < P) return true;
  const int64_t t = j - P;
  if (t >= T) return false;
  return mask_row ? mask_row[t] : t <= i;
}

// Number of keys that queries [.., i_end) of a row may see: with a causal mask a query sees
// nothing after itself, with an explicit mask any of the T tree keys.
SPECDEC_HD inline int64_t keys_needed(bool causal, int64_t i_end, int64_t P, int64_t T) {
  return P + (causal ? i_end : T);
}

// The prefix length a CUDA kernel uses for a row: clamped into [0, S - T] so that no read goes
// out of bounds (the CPU kernel rejects such values instead).
SPECDEC_HD inline int64_t clamp_prefix(int64_t P, int64_t T, int64_t S) {
  return P < 0 ? 0 : (P > S - T ? S - T : P);
}

// kv_commit of one row: how many entries are copied, given the row's current length len, its
// accept_len n, the number of src_pos columns A and the cache capacity S (CUDA clamps what the
// CPU kernel rejects).
SPECDEC_HD inline int64_t commit_count(int64_t len, int64_t n, int64_t A, int64_t S) {
  if (len < 0 || len > S || n < 0) return 0;
  if (n > A) n = A;
  return n < S - len ? n : S - len;
}

}  // namespace specdec::core
