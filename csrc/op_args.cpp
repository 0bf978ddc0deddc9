#include "op_args.h"

#include <ATen/Dispatch.h>
#include <ATen/core/TensorBody.h>
#include <ATen/ops/argmax.h>
#include <c10/util/Exception.h>

#include <sstream>
#include <string>

namespace specdec {
namespace {

// The floating dtypes the kernels dispatch on (not the float8 types, which isFloatingType
// includes).
bool is_compute_float(at::ScalarType s) {
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble;
}

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s << ", ";
    if (shape[i] < 0) s << '*'; else s << shape[i];
  }
  s << ']';
  return s.str();
}

}  // namespace

void check_index(const at::Tensor& t, const char* op, const char* name, int64_t dim) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, "specdec.", op,
                   ": ", name, " must be int64 or int32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, "specdec.", op, ": ", name, " must have ", dim,
                    " dimensions, got shape ", t.sizes());
}

void check_probs(const at::Tensor& t, const char* op, const char* name, int64_t dim) {
  TORCH_CHECK_TYPE(is_compute_float(t.scalar_type()), "specdec.", op, ": ", name,
                   " must be float32, float16, bfloat16 or float64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, "specdec.", op, ": ", name, " must have ", dim,
                    " dimensions, got shape ", t.sizes());
}

void check_uniform(const at::Tensor& t, const char* op, at::IntArrayRef shape) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, "specdec.", op,
                   ": uniform must be float32, got ", t.scalar_type());
  check_shape(t, op, "uniform", shape);
}

void check_cache(const at::Tensor& t, const char* op, const char* name, int64_t dim) {
  TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), "specdec.", op, ": ", name,
                   " must be a floating tensor, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, "specdec.", op, ": ", name, " must have ", dim,
                    " dimensions, got shape ", t.sizes());
}

void check_shape(const at::Tensor& t, const char* op, const char* name, at::IntArrayRef shape) {
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  for (int64_t i = 0; ok && i < t.dim(); ++i) ok = shape[i] < 0 || t.size(i) == shape[i];
  TORCH_CHECK_VALUE(ok, "specdec.", op, ": ", name, " must have shape ", shape_str(shape),
                    ", got ", t.sizes());
}

void check_same_dtype(const at::Tensor& t, const at::Tensor& ref, const char* op,
                      const char* name, const char* ref_name) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), "specdec.", op, ": ", name,
                   " must have the dtype of ", ref_name, " (", ref.scalar_type(), "), got ",
                   t.scalar_type());
}

void check_device(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), "specdec.", op, ": ", name, " is on ",
                    t.device(), " but the other arguments are on ", ref.device());
}

void check_out(const at::Tensor& out, const at::Tensor& ref, const char* op, const char* name,
               at::IntArrayRef shape, at::ScalarType dtype) {
  check_device(out, ref, op, name);
  TORCH_CHECK_TYPE(out.scalar_type() == dtype, "specdec.", op, ": output ", name,
                   " must be ", dtype, ", got ", out.scalar_type());
  bool ok = out.dim() == static_cast<int64_t>(shape.size());
  for (int64_t i = 0; ok && i < out.dim(); ++i)
    ok = shape[i] < 0 ? out.size(i) >= 1 : out.size(i) == shape[i];
  TORCH_CHECK_VALUE(ok, "specdec.", op, ": output ", name, " must have shape ", shape_str(shape),
                    ", got ", out.sizes());
  TORCH_CHECK_VALUE(out.is_contiguous(), "specdec.", op, ": output ", name,
                    " must be contiguous");
}

void check_ids_in_range(const at::Tensor& ids, int64_t vocab, const char* op, const char* name,
                        bool allow_padding) {
  const at::Tensor flat = ids.contiguous();
  AT_DISPATCH_INDEX_TYPES(flat.scalar_type(), "check_ids_in_range", [&] {
    const index_t* data = flat.const_data_ptr<index_t>();
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const int64_t id = data[i];
      const bool in_vocab = id >= 0 && (vocab == kAnyVocab || id < vocab);
      TORCH_CHECK_VALUE(in_vocab || (allow_padding && id == -1), "specdec.", op, ": ", name,
                        " holds the token id ", id, ", ",
                        vocab == kAnyVocab ? std::string("not a token id (>= 0)")
                                           : "outside the vocabulary [0, " + std::to_string(vocab) + ")",
                        allow_padding ? " and not -1 (padding)" : "");
    }
  });
}

void check_parents(const at::Tensor& parents, const char* op) {
  const at::Tensor p = parents.contiguous();
  const int64_t T = p.size(1);
  AT_DISPATCH_INDEX_TYPES(p.scalar_type(), "check_parents", [&] {
    const index_t* data = p.const_data_ptr<index_t>();
    for (int64_t b = 0; b < p.size(0); ++b) {
      const index_t* row = data + b * T;
      TORCH_CHECK_VALUE(row[0] == -1, "specdec.", op, ": parents[", b,
                        ", 0] must be -1 (node 0 is the root), got ", static_cast<int64_t>(row[0]));
      for (int64_t i = 1; i < T; ++i) {
        const int64_t parent = row[i];
        TORCH_CHECK_VALUE(parent != -1, "specdec.", op, ": parents is not a tree: row ", b,
                          " has a second root at node ", i);
        TORCH_CHECK_VALUE(parent >= 0 && parent < i, "specdec.", op,
                          ": parents is not a tree: parents[", b, ", ", i, "] = ", parent,
                          " (a parent must precede its child: 0 <= parent < ", i, ")");
      }
    }
  });
}

int64_t check_target(const at::Tensor& target, const at::Tensor& ids_like, const char* op,
                     int64_t B, int64_t N) {
  check_device(target, ids_like, op, "target");
  if (at::isFloatingType(target.scalar_type())) {
    TORCH_CHECK_TYPE(is_compute_float(target.scalar_type()), "specdec.", op,
                     ": target logits must be float32, float16, bfloat16 or float64, got ",
                     target.scalar_type());
    check_shape(target, op, "target", {B, N, -1});
    TORCH_CHECK_VALUE(target.size(2) >= 1, "specdec.", op, ": target logits have an empty vocabulary");
    return target.size(2);
  }
  check_index(target, op, "target", 2);
  check_same_dtype(target, ids_like, op, "target", "the draft token ids");
  check_shape(target, op, "target", {B, N});
  return kAnyVocab;
}

at::Tensor target_ids(const at::Tensor& target, const at::Tensor& ids_like) {
  if (at::isFloatingType(target.scalar_type()))
    return at::argmax(target, -1).to(ids_like.scalar_type());
  return target.contiguous();
}

ChainDims check_chain_sampling(const std::optional<at::Tensor>& draft_probs,
                               const at::Tensor& draft_ids, const at::Tensor& target_probs,
                               const at::Tensor& uniform, const at::Tensor& out_ids,
                               const at::Tensor& accept_len) {
  const char* op = "chain_speculative_sampling";
  check_index(draft_ids, op, "draft_ids", 2);
  const int64_t B = draft_ids.size(0), K = draft_ids.size(1);
  check_probs(target_probs, op, "target_probs", 3);
  check_shape(target_probs, op, "target_probs", {B, K + 1, -1});
  const int64_t V = target_probs.size(2);
  TORCH_CHECK_VALUE(V >= 1, "specdec.", op, ": target_probs has an empty vocabulary");
  check_device(target_probs, draft_ids, op, "target_probs");
  if (draft_probs) {
    check_probs(*draft_probs, op, "draft_probs", 3);
    check_shape(*draft_probs, op, "draft_probs", {B, K, V});
    check_same_dtype(*draft_probs, target_probs, op, "draft_probs", "target_probs");
    check_device(*draft_probs, draft_ids, op, "draft_probs");
  }
  check_uniform(uniform, op, {B, K + 1});
  check_device(uniform, draft_ids, op, "uniform");
  check_out(out_ids, draft_ids, op, "out_ids", {B, K + 1}, draft_ids.scalar_type());
  check_out(accept_len, draft_ids, op, "accept_len", {B}, draft_ids.scalar_type());
  if (checks_values(draft_ids)) check_ids_in_range(draft_ids, V, op, "draft_ids");
  return {B, K, V};
}

ChainDims check_chain_greedy(const at::Tensor& draft_ids, const at::Tensor& target,
                             const at::Tensor& out_ids, const at::Tensor& accept_len) {
  const char* op = "chain_greedy_verify";
  check_index(draft_ids, op, "draft_ids", 2);
  const int64_t B = draft_ids.size(0), K = draft_ids.size(1);
  check_out(out_ids, draft_ids, op, "out_ids", {B, K + 1}, draft_ids.scalar_type());
  check_out(accept_len, draft_ids, op, "accept_len", {B}, draft_ids.scalar_type());
  const int64_t V = check_target(target, draft_ids, op, B, K + 1);
  if (checks_values(draft_ids)) {
    check_ids_in_range(draft_ids, V, op, "draft_ids");
    // The target's tokens are emitted: they must be token ids too.
    if (V == kAnyVocab) check_ids_in_range(target, V, op, "target");
  }
  return {B, K, V};
}

TreeDims check_build_tree(const at::Tensor& parents, const at::Tensor& tree_mask,
                          const at::Tensor& depth, const at::Tensor& paths) {
  const char* op = "build_tree";
  check_index(parents, op, "parents", 2);
  const int64_t B = parents.size(0), T = parents.size(1);
  TORCH_CHECK_VALUE(T >= 1, "specdec.", op, ": parents needs at least the root node");
  check_out(tree_mask, parents, op, "tree_mask", {B, T, T}, at::kBool);
  check_out(depth, parents, op, "depth", {B, T}, parents.scalar_type());
  check_out(paths, parents, op, "paths", {B, -1, -1}, parents.scalar_type());
  if (checks_values(parents)) check_parents(parents, op);
  return {B, T, 0, paths.size(2)};
}

namespace {

// What the tree verification ops share: the tree and the outputs.
TreeDims check_tree_outputs(const char* op, const at::Tensor& tree_tokens,
                            const at::Tensor& parents, const at::Tensor& accept_path,
                            const at::Tensor& accept_len, const at::Tensor& next_token) {
  check_index(tree_tokens, op, "tree_tokens", 2);
  const int64_t B = tree_tokens.size(0), T = tree_tokens.size(1);
  TORCH_CHECK_VALUE(T >= 1, "specdec.", op, ": tree_tokens needs at least the root node");
  check_index(parents, op, "parents", 2);
  check_shape(parents, op, "parents", {B, T});
  check_same_dtype(parents, tree_tokens, op, "parents", "tree_tokens");
  check_device(parents, tree_tokens, op, "parents");
  const at::ScalarType dtype = tree_tokens.scalar_type();
  check_out(accept_path, tree_tokens, op, "accept_path", {B, -1}, dtype);
  check_out(accept_len, tree_tokens, op, "accept_len", {B}, dtype);
  check_out(next_token, tree_tokens, op, "next_token", {B}, dtype);
  if (checks_values(parents)) check_parents(parents, op);
  return {B, T, 0, accept_path.size(1)};
}

// The root's token is the last committed one and is never read; -1 marks padding nodes (rows
// with fewer candidates than T), which are never accepted.
void check_tree_tokens(const at::Tensor& tree_tokens, int64_t vocab, const char* op) {
  check_ids_in_range(tree_tokens.slice(1, 1), vocab, op, "tree_tokens", /*allow_padding=*/true);
}

}  // namespace

TreeDims check_tree_greedy(const at::Tensor& tree_tokens, const at::Tensor& parents,
                           const at::Tensor& target, const at::Tensor& accept_path,
                           const at::Tensor& accept_len, const at::Tensor& next_token) {
  const char* op = "tree_verify_greedy";
  TreeDims d = check_tree_outputs(op, tree_tokens, parents, accept_path, accept_len, next_token);
  d.V = check_target(target, tree_tokens, op, d.B, d.T);
  if (checks_values(tree_tokens)) {
    check_tree_tokens(tree_tokens, d.V, op);
    // The target's tokens are emitted: they must be token ids too.
    if (d.V == kAnyVocab) check_ids_in_range(target, d.V, op, "target");
  }
  return d;
}

TreeDims check_tree_sampling(const at::Tensor& tree_tokens, const at::Tensor& parents,
                             const at::Tensor& target_probs, const at::Tensor& uniform,
                             const std::optional<at::Tensor>& draft_probs,
                             std::optional<double> posterior_threshold, double posterior_alpha,
                             const at::Tensor& accept_path, const at::Tensor& accept_len,
                             const at::Tensor& next_token) {
  const char* op = "tree_speculative_sampling";
  TreeDims d = check_tree_outputs(op, tree_tokens, parents, accept_path, accept_len, next_token);
  check_probs(target_probs, op, "target_probs", 3);
  check_shape(target_probs, op, "target_probs", {d.B, d.T, -1});
  d.V = target_probs.size(2);
  TORCH_CHECK_VALUE(d.V >= 1, "specdec.", op, ": target_probs has an empty vocabulary");
  check_device(target_probs, tree_tokens, op, "target_probs");
  check_uniform(uniform, op, {d.B, d.T});
  check_device(uniform, tree_tokens, op, "uniform");
  if (draft_probs) {
    TORCH_CHECK_VALUE(!posterior_threshold, "specdec.", op,
                      ": typical acceptance (posterior_threshold) takes no draft_probs");
    check_probs(*draft_probs, op, "draft_probs", 3);
    check_shape(*draft_probs, op, "draft_probs", {d.B, d.T, d.V});
    check_same_dtype(*draft_probs, target_probs, op, "draft_probs", "target_probs");
    check_device(*draft_probs, tree_tokens, op, "draft_probs");
  }
  if (posterior_threshold) {
    TORCH_CHECK_VALUE(*posterior_threshold >= 0.0 && *posterior_threshold <= 1.0, "specdec.", op,
                      ": posterior_threshold must be in [0, 1], got ", *posterior_threshold);
    TORCH_CHECK_VALUE(posterior_alpha >= 0.0, "specdec.", op,
                      ": posterior_alpha must be >= 0, got ", posterior_alpha);
  }
  if (checks_values(tree_tokens)) check_tree_tokens(tree_tokens, d.V, op);
  return d;
}

// ---- n-gram ops (prompt lookup, lookahead n-gram pool) ----------------------------------------
NGramMatchDims check_ngram_match(const at::Tensor& context, const at::Tensor& context_len,
                                 int64_t min_n, int64_t max_n, const at::Tensor& draft,
                                 const at::Tensor& draft_len) {
  const char* op = "ngram_match";
  check_index(context, op, "context", 2);
  const int64_t B = context.size(0), S = context.size(1);
  check_index(context_len, op, "context_len", 1);
  check_shape(context_len, op, "context_len", {B});
  check_same_dtype(context_len, context, op, "context_len", "context");
  check_device(context_len, context, op, "context_len");
  TORCH_CHECK_VALUE(min_n >= 1, "specdec.", op, ": min_n must be >= 1, got ", min_n);
  TORCH_CHECK_VALUE(max_n >= min_n, "specdec.", op, ": max_n (", max_n,
                    ") must be >= min_n (", min_n, ")");
  check_out(draft, context, op, "draft", {B, -1}, context.scalar_type());
  check_out(draft_len, context, op, "draft_len", {B}, context.scalar_type());
  if (checks_values(context_len)) {
    const at::Tensor lens = context_len.contiguous();
    AT_DISPATCH_INDEX_TYPES(lens.scalar_type(), "check_ngram_match", [&] {
      const index_t* len = lens.const_data_ptr<index_t>();
      for (int64_t b = 0; b < B; ++b)
        TORCH_CHECK_VALUE(len[b] >= 0 && len[b] <= S, "specdec.", op, ": context_len[", b,
                          "] = ", static_cast<int64_t>(len[b]), " is outside [0, ", S,
                          "] (S = context.size(1))");
    });
  }
  return {B, S, draft.size(1)};
}

namespace {

// head [B, V] and entries [B, C, N + 1] of a pool; both are updated in place by inserts.
PoolDims check_pool_tables(const char* op, const at::Tensor& head, const at::Tensor& entries) {
  check_index(head, op, "head", 2);
  const int64_t B = head.size(0), V = head.size(1);
  TORCH_CHECK_VALUE(V >= 1, "specdec.", op, ": head must have one entry per token (V >= 1)");
  check_index(entries, op, "entries", 3);
  check_shape(entries, op, "entries", {B, -1, -1});
  check_same_dtype(entries, head, op, "entries", "head");
  check_device(entries, head, op, "entries");
  const int64_t C = entries.size(1), N = entries.size(2) - 1;
  TORCH_CHECK_VALUE(C >= 1 && N >= 2, "specdec.", op,
                    ": entries must have shape [B, C, N + 1] with C >= 1 slots and n-grams of "
                    "N >= 2 tokens, got ", entries.sizes());
  TORCH_CHECK_VALUE(head.is_contiguous() && entries.is_contiguous(), "specdec.", op,
                    ": head and entries must be contiguous");
  return {B, V, C, N, 0};
}

}  // namespace

PoolDims check_ngram_pool_insert(const at::Tensor& head, const at::Tensor& entries,
                                 const at::Tensor& cursor, const at::Tensor& ngrams, int64_t g) {
  const char* op = "ngram_pool_insert";
  PoolDims d = check_pool_tables(op, head, entries);
  check_index(cursor, op, "cursor", 1);
  check_shape(cursor, op, "cursor", {d.B});
  check_same_dtype(cursor, head, op, "cursor", "head");
  check_device(cursor, head, op, "cursor");
  TORCH_CHECK_VALUE(cursor.is_contiguous(), "specdec.", op, ": cursor must be contiguous");
  check_index(ngrams, op, "ngrams", 3);
  check_shape(ngrams, op, "ngrams", {d.B, -1, d.N});
  check_same_dtype(ngrams, head, op, "ngrams", "head");
  check_device(ngrams, head, op, "ngrams");
  TORCH_CHECK_VALUE(g >= 1, "specdec.", op, ": g must be >= 1, got ", g);
  if (checks_values(head)) {
    check_ids_in_range(ngrams, d.V, op, "ngrams", /*allow_padding=*/true);
    AT_DISPATCH_INDEX_TYPES(cursor.scalar_type(), "check_ngram_pool_insert", [&] {
      const index_t* c = cursor.const_data_ptr<index_t>();
      for (int64_t b = 0; b < d.B; ++b)
        TORCH_CHECK_VALUE(c[b] >= 0 && c[b] < d.C, "specdec.", op, ": cursor[", b, "] = ",
                          static_cast<int64_t>(c[b]), " is outside [0, ", d.C, ")");
    });
  }
  d.G = g;
  return d;
}

PoolDims check_ngram_pool_lookup(const at::Tensor& head, const at::Tensor& entries,
                                 const at::Tensor& last_ids, const at::Tensor& candidates,
                                 const at::Tensor& count) {
  const char* op = "ngram_pool_lookup";
  PoolDims d = check_pool_tables(op, head, entries);
  check_index(last_ids, op, "last_ids", 1);
  check_shape(last_ids, op, "last_ids", {d.B});
  check_same_dtype(last_ids, head, op, "last_ids", "head");
  check_device(last_ids, head, op, "last_ids");
  check_out(candidates, head, op, "candidates", {d.B, -1, d.N - 1}, head.scalar_type());
  check_out(count, head, op, "count", {d.B}, head.scalar_type());
  if (checks_values(last_ids)) check_ids_in_range(last_ids, d.V, op, "last_ids", /*allow_padding=*/true);
  d.G = candidates.size(1);
  return d;
}

// ---- tree attention and KV commit ------------------------------------------------------------
AttentionDims check_tree_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                   const at::Tensor& v_cache, const at::Tensor& prefix_len,
                                   const std::optional<at::Tensor>& tree_mask,
                                   const at::Tensor& out) {
  const char* op = "tree_attention";
  check_probs(q, op, "q", 4);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  TORCH_CHECK_VALUE(H >= 1 && T >= 1 && D >= 1, "specdec.", op,
                    ": q must have H, T and D >= 1, got shape ", q.sizes());
  for (const auto& [t, name] : {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}}) {
    check_probs(*t, op, name, 4);
    check_same_dtype(*t, q, op, name, "q");
    check_device(*t, q, op, name);
    TORCH_CHECK_VALUE(t->stride(3) == 1, "specdec.", op, ": ", name,
                      " must be contiguous in its last (head) dimension");
  }
  check_shape(k_cache, op, "k_cache", {B, -1, -1, D});
  const int64_t Hkv = k_cache.size(1), S = k_cache.size(2);
  TORCH_CHECK_VALUE(Hkv >= 1 && H % Hkv == 0, "specdec.", op, ": the ", H,
                    " query heads of q must be a multiple of the ", Hkv, " heads of k_cache");
  TORCH_CHECK_VALUE(S >= T, "specdec.", op, ": k_cache holds ", S, " positions, fewer than the ",
                    T, " tokens of q");
  check_shape(v_cache, op, "v_cache", {B, Hkv, S, D});
  check_index(prefix_len, op, "prefix_len", 1);
  check_shape(prefix_len, op, "prefix_len", {B});
  check_device(prefix_len, q, op, "prefix_len");
  if (tree_mask) {
    TORCH_CHECK_TYPE(tree_mask->scalar_type() == at::kBool, "specdec.", op,
                     ": tree_mask must be bool, got ", tree_mask->scalar_type());
    check_shape(*tree_mask, op, "tree_mask", {B, T, T});
    check_device(*tree_mask, q, op, "tree_mask");
  }
  check_out(out, q, op, "out", {B, H, T, D}, q.scalar_type());
  if (checks_values(prefix_len)) {
    const at::Tensor p = prefix_len.to(at::kLong).contiguous();
    const int64_t* data = p.const_data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK_VALUE(data[b] >= 0 && data[b] + T <= S, "specdec.", op, ": prefix_len[", b,
                        "] = ", data[b], " leaves no room for the ", T,
                        " tokens of q in the cache (need 0 <= prefix_len <= ", S - T, ")");
    }
  }
  return {B, H, Hkv, T, D, S};
}

CommitDims check_kv_commit(at::TensorList k_caches, at::TensorList v_caches,
                           const at::Tensor& lengths, const at::Tensor& src_pos,
                           const at::Tensor& accept_len) {
  const char* op = "kv_commit";
  const int64_t L = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK_VALUE(L >= 1, "specdec.", op, ": k_caches is empty");
  TORCH_CHECK_VALUE(static_cast<int64_t>(v_caches.size()) == L, "specdec.", op, ": k_caches has ",
                    L, " layers but v_caches has ", v_caches.size());
  const at::Tensor& k0 = k_caches[0];
  check_cache(k0, op, "k_caches", 4);
  const int64_t B = k0.size(0), S = k0.size(2);
  const at::Tensor& v0 = v_caches[0];
  check_cache(v0, op, "v_caches", 4);
  check_shape(v0, op, "v_caches", {B, -1, S, -1});
  for (const auto& [list, ref, name] :
       {std::tuple{k_caches, &k0, "k_caches"}, std::tuple{v_caches, &v0, "v_caches"}}) {
    for (const at::Tensor& c : list) {
      check_same_dtype(c, k0, op, name, "k_caches[0]");
      check_device(c, k0, op, name);
      check_shape(c, op, name, ref->sizes());
      TORCH_CHECK_VALUE(c.is_contiguous(), "specdec.", op, ": every tensor of ", name,
                        " must be contiguous");
    }
  }
  check_index(lengths, op, "lengths", 1);
  check_shape(lengths, op, "lengths", {B});
  check_device(lengths, k0, op, "lengths");
  TORCH_CHECK_VALUE(lengths.is_contiguous(), "specdec.", op, ": lengths must be contiguous");
  check_index(src_pos, op, "src_pos", 2);
  check_shape(src_pos, op, "src_pos", {B, -1});
  check_same_dtype(src_pos, lengths, op, "src_pos", "lengths");
  check_device(src_pos, k0, op, "src_pos");
  check_index(accept_len, op, "accept_len", 1);
  check_shape(accept_len, op, "accept_len", {B});
  check_same_dtype(accept_len, lengths, op, "accept_len", "lengths");
  check_device(accept_len, k0, op, "accept_len");
  const int64_t A = src_pos.size(1);
  if (checks_values(lengths)) {
    const at::Tensor len = lengths.to(at::kLong), n = accept_len.to(at::kLong),
                     src = src_pos.to(at::kLong).contiguous();
    const int64_t *pl = len.const_data_ptr<int64_t>(), *pn = n.const_data_ptr<int64_t>(),
                  *ps = src.const_data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK_VALUE(pn[b] >= 0 && pn[b] <= A, "specdec.", op, ": accept_len[", b, "] = ",
                        pn[b], " is outside [0, ", A, "] (src_pos has ", A, " columns)");
      TORCH_CHECK_VALUE(pl[b] >= 0 && pl[b] + pn[b] <= S, "specdec.", op, ": lengths[", b,
                        "] = ", pl[b], " plus accept_len ", pn[b],
                        " does not fit the cache's ", S, " positions");
      for (int64_t i = 0; i < pn[b]; ++i) {
        const int64_t s = ps[b * A + i];
        TORCH_CHECK_VALUE(s >= 0 && s < S, "specdec.", op, ": src_pos[", b, ", ", i, "] = ", s,
                          " is outside the cache [0, ", S, ")");
      }
    }
  }
  return {L, B, S, A, k0.size(1), k0.size(3), v0.size(1), v0.size(3)};
}

}  // namespace specdec
