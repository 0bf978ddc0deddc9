// Per-row logic of the n-gram ops (prompt lookup and the lookahead n-gram pool), written once for
// the CPU and CUDA kernels. Everything here is bounds-checked against the sizes passed in, so
// values that the CPU kernels reject (and the CUDA kernels cannot) never read or write outside
// the tensors nor loop forever.
#pragma once

#include "core/common.h"

namespace specdec::core {

// ---------------------------------------------------------------------------------------------
// ngram_match (prompt lookup)
//
// Row context ctx[0..L-1]. An occurrence of the suffix n-gram ctx[L-n..L-1] is found by its last
// position e: ctx[e-n+1..e] == ctx[L-n..L-1] with e < L - 1 (it starts before the suffix does,
// and may overlap it). Its continuation is ctx[e+1..], at most k tokens, never past L.
// The answer: the longest n in [min_n, max_n] that has an occurrence, at its latest e (or, with
// `earliest`, its earliest e).

struct NGramHit {
  int64_t n;    // matched length, 0 when there is no hit
  int64_t end;  // e, the occurrence's last position; -1 when there is no hit
};

SPECDEC_HD inline NGramHit no_hit() { return {0, -1}; }

// Longer matches win, then later ones (earlier ones with `earliest`).
SPECDEC_HD inline NGramHit better_hit(NGramHit a, NGramHit b, bool earliest) {
  if (a.n != b.n) return a.n > b.n ? a : b;
  return (earliest ? a.end <= b.end : a.end >= b.end) ? a : b;
}

// The longest n an occurrence can have: it needs n <= max_n and an earlier start (n <= L - 1).
SPECDEC_HD inline int64_t max_match_len(int64_t L, int64_t max_n) {
  return max_n < L - 1 ? max_n : L - 1;
}

// The hit ending at e: the common suffix of ctx[0..e] and ctx[0..L-1], at most `cap` long, when
// it is at least min_n long.
SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD NGramHit hit_at(const I* ctx, int64_t L, int64_t e, int64_t min_n, int64_t cap) {
  int64_t n = 0;
  while (n < cap && n <= e && ctx[e - n] == ctx[L - 1 - n]) ++n;
  return n >= min_n && n > 0 ? NGramHit{n, e} : no_hit();
}

// The best hit among the i-th candidates, i = first, first + stride, ... (a thread's share; the
// CPU kernel takes them all with first 0, stride 1), where candidate i is e = L - 2 - i (latest
// first) or, with `earliest`, e = i (earliest first). In that order the first hit of the
// longest possible length is final.
SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD NGramHit best_hit_strided(const I* ctx, int64_t L, int64_t min_n, int64_t max_n,
                                     bool earliest, int64_t first, int64_t stride) {
  const int64_t cap = max_match_len(L, max_n);
  NGramHit best = no_hit();
  if (cap < min_n || cap < 1) return best;
  for (int64_t i = first; i <= L - 2; i += stride) {
    best = better_hit(best, hit_at(ctx, L, earliest ? i : L - 2 - i, min_n, cap), earliest);
    if (best.n == cap) break;
  }
  return best;
}

// Number of draft tokens the hit gives (its continuation, at most k, never past L).
SPECDEC_HD inline int64_t hit_draft_len(NGramHit hit, int64_t L, int64_t k) {
  if (hit.n == 0) return 0;
  const int64_t left = L - 1 - hit.end;
  return left < k ? left : k;
}

// Draft slot j of the hit: the continuation's j-th token, -1 past draft_len.
SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD I hit_draft_token(const I* ctx, NGramHit hit, int64_t draft_len, int64_t j) {
  return j < draft_len ? ctx[hit.end + 1 + j] : static_cast<I>(-1);
}

// context_len as a usable length: the CPU kernel rejects values outside [0, S], CUDA clamps.
SPECDEC_HD inline int64_t clamp_len(int64_t len, int64_t S) {
  return len < 0 ? 0 : len > S ? S : len;
}

// ---------------------------------------------------------------------------------------------
// The n-gram pool of one row (lookahead decoding).
//
//   head[V]            slot of key v's most recent entry, -1 when v has none
//   entries[C][N + 1]  a slot: the n-gram (column 0 is its key, -1 when the slot is free), then
//                      the slot of the key's next older entry (-1 at the end of the list)
//   cursor             the slot the next write goes to; writes go round the C slots in turn
//
// Inserting an n-gram (key, continuation) writes it to the cursor's slot at the front of the
// key's list. The entry that slot held (written C writes ago) leaves the pool first; then the
// key's list loses the same continuation (a refresh: it is now the newest) and keeps at most
// g - 1 older entries. So each key keeps its g most recently written distinct continuations
// among the row's last C writes. The walks check every slot index and stop at an entry of
// another key and after C steps, so a corrupted pool cannot cause out-of-bounds access or an
// endless loop.

template <class I>
struct PoolRow {
  I* head;
  I* entries;
  int64_t V, C, N;

  SPECDEC_HD I* entry(int64_t s) const { return entries + s * (N + 1); }
  // The slot of the entry after slot s in its key's list.
  SPECDEC_HD int64_t next(int64_t s) const { return entry(s)[N]; }
  // Whether slot s exists and holds an entry of `key` (a list continues only through those).
  SPECDEC_HD bool holds(int64_t s, int64_t key) const {
    return s >= 0 && s < C && static_cast<int64_t>(entry(s)[0]) == key;
  }
  SPECDEC_HD void set_next(int64_t prev, int64_t key, int64_t s) const {
    if (prev < 0) head[key] = static_cast<I>(s);
    else entry(prev)[N] = static_cast<I>(s);
  }

  // Removes the entry in slot s from its key's list and frees the slot.
  SPECDEC_HD void evict(int64_t s) const {
    const int64_t key = entry(s)[0];
    entry(s)[0] = static_cast<I>(-1);
    if (!valid_id(key, V)) return;
    int64_t prev = -1, cur = head[key];
    for (int64_t steps = 0; cur >= 0 && cur < C && steps < C; ++steps) {
      if (cur == s) {
        set_next(prev, key, next(cur));
        return;
      }
      if (!holds(cur, key)) return;
      prev = cur;
      cur = next(cur);
    }
  }

  // Inserts one n-gram (ngram[0..N-1]); one with an id outside [0, V) (-1: padding) is skipped.
  SPECDEC_HD void insert(const I* ngram, int64_t g, I* cursor) const {
    for (int64_t j = 0; j < N; ++j)
      if (!valid_id(ngram[j], V)) return;
    const int64_t key = ngram[0];
    const int64_t s = *cursor >= 0 && *cursor < C ? static_cast<int64_t>(*cursor) : 0;
    evict(s);
    // The key's list keeps g - 1 older entries, without this continuation.
    int64_t prev = -1, cur = head[key], kept = 0;
    for (int64_t steps = 0; holds(cur, key) && steps < C; ++steps) {
      const int64_t after = next(cur);
      bool same = true;
      for (int64_t j = 1; j < N && same; ++j)
        same = static_cast<int64_t>(entry(cur)[j]) == static_cast<int64_t>(ngram[j]);
      if (same || kept >= g - 1) {
        set_next(prev, key, after);
        entry(cur)[0] = static_cast<I>(-1);
      } else {
        prev = cur;
        ++kept;
      }
      cur = after;
    }
    I* e = entry(s);
    for (int64_t j = 0; j < N; ++j) e[j] = static_cast<I>(ngram[j]);
    // head[key] is not a valid slot only when the pool is corrupted: end the list there.
    const int64_t first = head[key];
    e[N] = static_cast<I>(holds(first, key) ? first : -1);
    head[key] = static_cast<I>(s);
    *cursor = static_cast<I>((s + 1) % C);
  }
};

// Lookup of one row: the continuations of `key`, most recent first, into out[G][N - 1]
// (-1 padding); returns how many. A key outside [0, V) (-1: no lookup) has none.
SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD int64_t pool_lookup_row(const I* head, const I* entries, int64_t V, int64_t C,
                                   int64_t N, int64_t key, int64_t G, I* out) {
  int64_t count = 0;
  if (valid_id(key, V)) {
    for (int64_t s = head[key]; count < G && s >= 0 && s < C; ++count) {
      const I* e = entries + s * (N + 1);
      if (static_cast<int64_t>(e[0]) != key) break;
      for (int64_t j = 1; j < N; ++j) out[count * (N - 1) + j - 1] = e[j];
      s = e[N];
    }
  }
  for (int64_t i = count * (N - 1); i < G * (N - 1); ++i) out[i] = static_cast<I>(-1);
  return count;
}

}  // namespace specdec::core
