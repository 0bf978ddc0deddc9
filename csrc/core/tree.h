// Per-row logic of the tree ops, written once for the CPU and CUDA kernels.
//
// A tree of T nodes is given by parents[T]: node 0 is the root (the last committed token),
// parents[0] == -1, and every other node's parent precedes it (0 <= parents[i] < i). The CPU
// kernels reject anything else; the CUDA kernels (which cannot raise without a host sync) treat a
// node whose parent breaks the rule as detached: depth 0, its own ancestor only, never accepted.
#pragma once

#include "core/sampling.h"

namespace specdec::core {

SPECDEC_HD inline bool parent_ok(int64_t parent, int64_t node) {
  return parent >= 0 && parent < node;
}

// Depth of `node` (root 0), or -1 when its chain to the root is broken.
SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD int64_t node_depth(const I* parents, int64_t node) {
  int64_t depth = 0;
  while (node > 0) {
    const int64_t parent = parents[node];
    if (!parent_ok(parent, node)) return -1;
    node = parent;
    ++depth;
  }
  return depth;
}

// The ancestor of `node` at depth `target` (node has depth `depth` >= target).
SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD int64_t ancestor_at(const I* parents, int64_t node, int64_t depth, int64_t target) {
  for (; depth > target; --depth) node = parents[node];
  return node;
}

SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD bool has_child(const I* parents, int64_t node, int64_t T) {
  for (int64_t j = node + 1; j < T; ++j)
    if (parents[j] == node) return true;
  return false;
}

// build_tree, one node: its depth, its mask row (ancestors and itself), whether it is a leaf.
SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD void tree_node_info(const I* parents, int64_t node, int64_t T, bool* mask_row,
                               I* depth_out, bool* is_leaf) {
  for (int64_t j = 0; j < T; ++j) mask_row[j] = false;
  const int64_t depth = node_depth(parents, node);
  mask_row[node] = true;
  if (depth > 0)
    for (int64_t a = node; a > 0;) mask_row[a = parents[a]] = true;
  *depth_out = static_cast<I>(depth < 0 ? 0 : depth);
  *is_leaf = !has_child(parents, node, T);
}

// Writes the root-to-node path of `node` (depth `depth`) into path[0..P-1]: the first P nodes
// when it is longer, -1 after its end.
SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD void write_path(const I* parents, int64_t node, int64_t depth, I* path, int64_t P) {
  for (int64_t k = depth + 1; k < P; ++k) path[k] = static_cast<I>(-1);
  for (int64_t k = depth; k >= 0; --k) {
    if (k < P) path[k] = static_cast<I>(node);
    if (k > 0) node = parents[node];
  }
}

// The deepest node whose every edge (parent -> child) on the root path satisfies
// edge_ok(parent, child); ties go to the lowest index. O(T * depth), no scratch.
SPECDEC_HD_TEMPLATE
template <class I, class E>
SPECDEC_HD void deepest_accepted(const I* parents, int64_t T, E edge_ok, int64_t* best,
                                 int64_t* best_depth) {
  *best = 0;
  *best_depth = 0;
  for (int64_t c = 1; c < T; ++c) {
    int64_t depth = 0;
    bool ok = true;
    for (int64_t i = c; i > 0 && ok; ++depth) {
      const int64_t parent = parents[i];
      ok = parent_ok(parent, i) && edge_ok(parent, i);
      i = parent;
    }
    if (ok && depth > *best_depth) {
      *best = c;
      *best_depth = depth;
    }
  }
}

// Emits the accepted path of `best` (depth `depth`) into accept_path[0..P-1] and accept_len.
// A path longer than P - 1 accepted nodes is cut; the return value is then the first node cut
// off (its token is a correct next token), else -1.
SPECDEC_HD_TEMPLATE
template <class I>
SPECDEC_HD int64_t emit_accepted(const I* parents, int64_t best, int64_t depth, I* accept_path,
                                 int64_t P, I* accept_len) {
  const int64_t kept = depth < P - 1 ? depth : P - 1;
  write_path(parents, best, depth, accept_path, P);
  *accept_len = static_cast<I>(kept);
  return kept < depth ? ancestor_at(parents, best, depth, kept + 1) : -1;
}

// Greedy tree verification of one row: the deepest node whose every token equals the target's
// token at its parent; next token: the target's token at that node. target_id(n) is the
// target's token after node n. A negative token (-1: a padding node) is never accepted.
SPECDEC_HD_TEMPLATE
template <class I, class G>
SPECDEC_HD void tree_greedy_row(const I* tokens, const I* parents, G target_id, int64_t T,
                                I* accept_path, int64_t P, I* accept_len, I* next_token) {
  int64_t best, depth;
  deepest_accepted(
      parents, T,
      [&](int64_t parent, int64_t child) {
        const int64_t x = tokens[child];
        return x >= 0 && x == target_id(parent);
      },
      &best, &depth);
  const int64_t cut = emit_accepted(parents, best, depth, accept_path, P, accept_len);
  *next_token = static_cast<I>(cut >= 0 ? static_cast<int64_t>(tokens[cut]) : target_id(best));
}

// Medusa's typical acceptance (lossy), the walk: a child is accepted when the target gives its
// token more than min(threshold, alpha * exp(-entropy)) at the parent. Returns the node whose
// distribution the next token must be drawn from, or -1 when the path was cut and next_token is
// already written.
SPECDEC_HD_TEMPLATE
template <class I, class P>
SPECDEC_HD int64_t tree_typical_walk(const I* tokens, const I* parents, const P* target,
                                     const float* entropy, float threshold, float alpha,
                                     int64_t T, int64_t V, I* accept_path, int64_t width,
                                     I* accept_len, I* next_token) {
  int64_t best, depth;
  deepest_accepted(
      parents, T,
      [&](int64_t parent, int64_t child) {
        const int64_t x = tokens[child];
        if (!valid_id(x, V)) return false;
        const float floor = fminf(threshold, alpha * expf(-entropy[parent]));
        return to_float(target[parent * V + x]) > floor;
      },
      &best, &depth);
  const int64_t cut = emit_accepted(parents, best, depth, accept_path, width, accept_len);
  if (cut < 0) return best;
  *next_token = tokens[cut];
  return -1;
}

// Lossless tree speculative sampling of one row.
//   tokens [T], parents [T], target [T, V]: the target's distribution after each node,
//   u [T]: u[c] tests node c, u[0] draws the one token sampled,
//   draft [T, V] or nullptr: draft[c] is the distribution node c was drawn from, given its
//   earlier siblings (nullptr: deterministic drafts, q = one-hot),
//   resid [V]: scratch.
// At a node, children are tried in index order: child c (token x) is accepted with probability
// min(1, p(x) / q_c(x)); on rejection p <- norm(max(0, p - q_c)) (with q = one-hot: p(x) = 0,
// renormalised). When no child is accepted the token is drawn from what is left of p. The target
// rows are taken as normalised (sum 1), the residuals are renormalised exactly.
SPECDEC_HD_TEMPLATE
template <class Exec, class P, class I>
SPECDEC_HD void tree_sampling_row(Exec& ex, const I* tokens, const I* parents, const P* target,
                                  const float* u, const P* draft, int64_t T, int64_t V,
                                  float* resid, I* accept_path, int64_t width, I* accept_len,
                                  I* next_token) {
  int64_t node = 0, accepted = 0, token = -1;
  bool done = false;
  while (!done) {
    const P* p_row = target + node * V;
    float mass = 1.f;       // what is left of p's mass after the rejections so far
    double rejected = 0.0;  // deterministic drafts: p's mass on the rejected tokens
    bool live = false;      // resid holds the residual (stochastic drafts)
    int64_t chosen = -1;
    for (int64_t c = node + 1; c < T && chosen < 0; ++c) {
      if (parents[c] != node) continue;
      const int64_t x = tokens[c];
      if (!valid_id(x, V)) continue;
      if (draft) {
        const P* q_row = draft + c * V;
        const float p = live ? resid[x] : to_float(p_row[x]);
        if (u[c] * to_float(q_row[x]) * mass < p) {
          chosen = c;
          break;
        }
        const float m = mass;
        mass = ex.sum(V, [=](int64_t j) {
          const float r = clamp_weight((live ? resid[j] : to_float(p_row[j])) -
                                       mul_rn(m, to_float(q_row[j])));
          resid[j] = r;
          return r;
        });
        live = true;
      } else {
        // A token that an earlier sibling already had has no probability left.
        bool seen = false;
        for (int64_t s = node + 1; s < c && !seen; ++s)
          seen = parents[s] == node && static_cast<int64_t>(tokens[s]) == x;
        const float p = seen ? 0.f : clamp_weight(to_float(p_row[x]));
        if (u[c] * mass < p) {
          chosen = c;
          break;
        }
        // 1 - rejected in float64: a float running difference would carry each step's rounding
        // error into the next, large next to what is left after a peaked token is rejected.
        rejected += p;
        mass = static_cast<float>(1.0 - rejected);
      }
    }
    if (chosen >= 0 && accepted + 1 < width) {
      accepted += 1;
      if (ex.leader()) accept_path[accepted] = static_cast<I>(chosen);
      node = chosen;
      continue;
    }
    done = true;
    if (chosen >= 0) {
      token = tokens[chosen];  // the path is full: the accepted child is the sampled token
    } else if (live) {
      token = sample_weights(ex, V, [=](int64_t j) { return resid[j]; }, u[0]);
    } else if (draft || !has_child(parents, node, T)) {
      token = sample_probs(ex, p_row, V, u[0]);
    } else {
      // p without the rejected children's tokens: copy, zero them, draw.
      ex.sum(V, [=](int64_t j) { return resid[j] = clamp_weight(to_float(p_row[j])); });
      if (ex.leader())
        for (int64_t c = node + 1; c < T; ++c)
          if (parents[c] == node && valid_id(tokens[c], V)) resid[tokens[c]] = 0.f;
      ex.sync();
      token = sample_weights(ex, V, [=](int64_t j) { return resid[j]; }, u[0]);
    }
    if (token < 0) token = sample_probs(ex, p_row, V, u[0]);
  }
  if (ex.leader()) {
    accept_path[0] = 0;
    for (int64_t k = accepted + 1; k < width; ++k) accept_path[k] = static_cast<I>(-1);
    *accept_len = static_cast<I>(accepted);
    *next_token = static_cast<I>(token);
  }
}

}  // namespace specdec::core
