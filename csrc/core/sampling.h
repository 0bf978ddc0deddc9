// Per-row logic of the chain verification ops, written once for the CPU and CUDA kernels.
//
// The functions take an executor `ex` that runs the passes over the vocabulary (a pass may be
// given an index `skip` whose weight counts as 0; -1: none):
//   bool leader()                         the one thread that writes per-row outputs
//   void sync()                           makes every thread's earlier writes visible to all
//   float sum(n, f, skip)                 sum of f(j) for j < n; f is called once per j, and
//                                         may write element j of a scratch row
//   int64_t draw(n, w, u, skip)           -1 when every w(j) is zero; else, with total the sum
//                                         of the w(j), the smallest j with w(0) + ... + w(j) >
//                                         u * total and w(j) > 0, or the largest j with
//                                         w(j) > 0 when rounding leaves none
// Every thread of an executor runs the same control flow and gets the same results; the CPU
// executor is a single thread, the CUDA one a thread block.
#pragma once

#include "core/common.h"

namespace specdec::core {

// Draws from the unnormalised weights w(j) >= 0 with the uniform u; -1 when they are all zero.
SPECDEC_HD_TEMPLATE
template <class Exec, class W>
SPECDEC_HD int64_t sample_weights(Exec& ex, int64_t n, W w, float u) {
  return ex.draw(n, w, u);
}

// Draws from the weights w(j) >= 0 without index x (x outside [0, n): nothing excluded), with
// the uniform u; -1 when no weight is left. The draw takes w(x) as 0, so x is never drawn,
// nor is the fallback ever x. Taking w(x) off the full sum instead would subtract two numbers
// close to 1 when the target is peaked on x: the total's rounding error, large next to what is
// left, lets u * total pass every running sum.
SPECDEC_HD_TEMPLATE
template <class Exec, class W>
SPECDEC_HD int64_t sample_weights_without(Exec& ex, int64_t n, W w, int64_t x, float u) {
  return ex.draw(n, w, u, x);
}

SPECDEC_HD_TEMPLATE
template <class Exec, class P>
SPECDEC_HD int64_t sample_probs(Exec& ex, const P* probs, int64_t n, float u) {
  return sample_weights(ex, n, [=](int64_t j) { return clamp_weight(to_float(probs[j])); }, u);
}

// Writes `accepted` drafts, then `token`, then -1 up to `width` slots.
SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD void write_chain(const I* draft_ids, int64_t accepted, int64_t token, int64_t width,
                            I* out_ids, I* accept_len) {
  for (int64_t j = 0; j < width; ++j) {
    out_ids[j] = static_cast<I>(j < accepted ? static_cast<int64_t>(draft_ids[j])
                                : j == accepted ? token : -1);
  }
  *accept_len = static_cast<I>(accepted);
}

// Chain speculative sampling of one row (Leviathan et al., Chen et al.).
//   draft_probs [K, V] or nullptr (deterministic drafts, q = 1), draft_ids [K],
//   target [K + 1, V], u [K + 1]: u[i] tests draft i, u[K] draws the one token sampled.
// Draft i is accepted while u[i] * q_i(x_i) < p_i(x_i); at the first rejection the token is
// drawn from max(0, p_i - q_i) (p_i without x_i when q = 1); after K acceptances from p_K.
SPECDEC_HD_TEMPLATE
template <class Exec, class P, class I>
SPECDEC_HD void chain_sampling_row(Exec& ex, const P* draft_probs, const I* draft_ids,
                                   const P* target, const float* u, int64_t K, int64_t V,
                                   I* out_ids, I* accept_len) {
  int64_t i = 0;
  for (; i < K; ++i) {
    const int64_t x = draft_ids[i];
    if (!valid_id(x, V)) break;
    const float p = to_float(target[i * V + x]);
    const float q = draft_probs ? to_float(draft_probs[i * V + x]) : 1.f;
    if (!(u[i] * q < p)) break;
  }
  const P* p_row = target + i * V;
  int64_t token = -1;
  if (i < K && draft_probs) {
    const P* q_row = draft_probs + i * V;
    token = sample_weights(
        ex, V, [=](int64_t j) { return clamp_weight(to_float(p_row[j]) - to_float(q_row[j])); },
        u[K]);
  } else if (i < K) {
    token = sample_weights_without(
        ex, V, [=](int64_t j) { return clamp_weight(to_float(p_row[j])); }, draft_ids[i], u[K]);
  }
  // An empty residual means p_i and q_i agree (up to rounding): p_i itself is then the answer.
  if (token < 0) token = sample_probs(ex, p_row, V, u[K]);
  if (ex.leader()) write_chain(draft_ids, i, token, K + 1, out_ids, accept_len);
}

// Greedy chain verification of one row: drafts are accepted while they equal the target's
// token at their position; then the target's token follows. target_id(i) is the target's token
// at position i (0..K). A negative draft is never accepted (whatever the target holds: CUDA
// kernels get no value checks).
SPECDEC_HD_TEMPLATE
template <class I, class G>
SPECDEC_HD void chain_greedy_row(const I* draft_ids, G target_id, int64_t K, I* out_ids,
                                 I* accept_len) {
  int64_t i = 0;
  while (i < K && draft_ids[i] >= 0 && static_cast<int64_t>(draft_ids[i]) == target_id(i)) ++i;
  write_chain(draft_ids, i, target_id(i), K + 1, out_ids, accept_len);
}

}  // namespace specdec::core
