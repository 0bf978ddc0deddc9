// Argument checks shared by the CPU and CUDA launchers. Every failure raises a Python
// ValueError or TypeError that names the op and the argument; nothing is written before all
// checks pass.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace specdec {

// Shapes and dtypes (no data access; valid for tensors on any device).
void check_index(const at::Tensor& t, const char* op, const char* name, int64_t dim);
// Probabilities, logits, queries: float32, float16, bfloat16 or float64 (what the kernels compute
// with), `dim` dimensions.
void check_probs(const at::Tensor& t, const char* op, const char* name, int64_t dim);
// A KV cache, whose entries are only copied: any floating dtype (float8 too).
void check_cache(const at::Tensor& t, const char* op, const char* name, int64_t dim);
void check_uniform(const at::Tensor& t, const char* op, at::IntArrayRef shape);
void check_shape(const at::Tensor& t, const char* op, const char* name, at::IntArrayRef shape);
void check_same_dtype(const at::Tensor& t, const at::Tensor& ref, const char* op,
                      const char* name, const char* ref_name);
void check_device(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* name);
// An output: contiguous, `shape` (a negative entry: any size >= 1), `dtype`, `ref`'s device.
void check_out(const at::Tensor& out, const at::Tensor& ref, const char* op, const char* name,
               at::IntArrayRef shape, at::ScalarType dtype);

// Values (read the data). Only the CPU kernels check them: CUDA kernels cannot raise without a
// host synchronisation, so they treat bad values safely instead (docs/ops.md). The CUDA
// simulation (docs/cuda_simulation.md) runs the CUDA kernels on CPU tensors, without the checks.
inline bool checks_values(const at::Tensor& t) {
#if defined(SPECDEC_CUDA_SIM)
  (void)t;
  return false;
#else
  return t.is_cpu();
#endif
}
// Values (read the data: tensors for which checks_values holds).
// Ids in [0, vocab), or >= 0 when the vocabulary is unknown (kAnyVocab: a greedy op's target
// given as token ids); with allow_padding, -1 (an unused slot) too.
constexpr int64_t kAnyVocab = -1;
void check_ids_in_range(const at::Tensor& ids, int64_t vocab, const char* op, const char* name,
                        bool allow_padding = false);
void check_parents(const at::Tensor& parents, const char* op);

// Greedy ops take the target as token ids [B, N] or as logits [B, N, V]. check_target checks
// its shape, dtype and device and returns V (kAnyVocab for ids); target_ids returns the ids
// (the argmax of logits, computed on the tensor's device).
int64_t check_target(const at::Tensor& target, const at::Tensor& ids_like, const char* op,
                     int64_t B, int64_t N);
at::Tensor target_ids(const at::Tensor& target, const at::Tensor& ids_like);

// Whole-op checks, shared by the CPU and CUDA launchers; return the sizes.
struct ChainDims { int64_t B, K, V; };
ChainDims check_chain_sampling(const std::optional<at::Tensor>& draft_probs,
                               const at::Tensor& draft_ids, const at::Tensor& target_probs,
                               const at::Tensor& uniform, const at::Tensor& out_ids,
                               const at::Tensor& accept_len);
// V: the logits' vocabulary, kAnyVocab when the target is token ids.
ChainDims check_chain_greedy(const at::Tensor& draft_ids, const at::Tensor& target,
                             const at::Tensor& out_ids, const at::Tensor& accept_len);

struct TreeDims { int64_t B, T, V, width; };
TreeDims check_build_tree(const at::Tensor& parents, const at::Tensor& tree_mask,
                          const at::Tensor& depth, const at::Tensor& paths);
// V: the logits' vocabulary, kAnyVocab when the target is token ids.
TreeDims check_tree_greedy(const at::Tensor& tree_tokens, const at::Tensor& parents,
                           const at::Tensor& target, const at::Tensor& accept_path,
                           const at::Tensor& accept_len, const at::Tensor& next_token);
TreeDims check_tree_sampling(const at::Tensor& tree_tokens, const at::Tensor& parents,
                             const at::Tensor& target_probs, const at::Tensor& uniform,
                             const std::optional<at::Tensor>& draft_probs,
                             std::optional<double> posterior_threshold, double posterior_alpha,
                             const at::Tensor& accept_path, const at::Tensor& accept_len,
                             const at::Tensor& next_token);

// ---- n-gram ops (prompt lookup, lookahead n-gram pool) ----------------------------------------
struct NGramMatchDims { int64_t B, S, K; };
NGramMatchDims check_ngram_match(const at::Tensor& context, const at::Tensor& context_len,
                                 int64_t min_n, int64_t max_n, const at::Tensor& draft,
                                 const at::Tensor& draft_len);

// The pool of every row: head [B, V], entries [B, C, N + 1] (see core/ngram.h); G: lookup width.
struct PoolDims { int64_t B, V, C, N, G; };
PoolDims check_ngram_pool_insert(const at::Tensor& head, const at::Tensor& entries,
                                 const at::Tensor& cursor, const at::Tensor& ngrams, int64_t g);
PoolDims check_ngram_pool_lookup(const at::Tensor& head, const at::Tensor& entries,
                                 const at::Tensor& last_ids, const at::Tensor& candidates,
                                 const at::Tensor& count);

// ---- tree attention and KV commit ------------------------------------------------------------
struct AttentionDims { int64_t B, H, Hkv, T, D, S; };
// q [B, H, T, D]; k_cache, v_cache [B, Hkv, S, D] (last dim contiguous); prefix_len [B];
// tree_mask [B, T, T] bool or none (causal); out [B, H, T, D]. On CPU also checks the values:
// 0 <= prefix_len[b] <= S - T.
AttentionDims check_tree_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                   const at::Tensor& v_cache, const at::Tensor& prefix_len,
                                   const std::optional<at::Tensor>& tree_mask,
                                   const at::Tensor& out);

struct CommitDims { int64_t L, B, S, A, Hk, Dk, Hv, Dv; };
// k_caches, v_caches: L contiguous caches each ([B, Hkv, S, D]: all keys one shape, all values
// one shape, one dtype and device); lengths [B] (contiguous), src_pos [B, A], accept_len [B], one
// index dtype. On CPU also checks the values (see docs/ops.md).
CommitDims check_kv_commit(at::TensorList k_caches, at::TensorList v_caches,
                           const at::Tensor& lengths, const at::Tensor& src_pos,
                           const at::Tensor& accept_len);

}  // namespace specdec
