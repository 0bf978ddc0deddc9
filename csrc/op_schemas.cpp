// Every schema of the specdec op library, in one place. Kernels register under the CPU and CUDA
// dispatch keys in cpu/ and cuda/; fake (meta) kernels are in python/specdec/ops/. The
// contracts are in docs/ops.md.
//
// Outputs are `Tensor(a!)` out-arguments so that engines can preallocate them and capture CUDA
// graphs; python/specdec/ops/ has functional wrappers that allocate them.
#include "op_schemas.h"

namespace specdec {

void define_ops(torch::Library& m) {
  // Chain verification.
  m.def(
      "chain_speculative_sampling(Tensor? draft_probs, Tensor draft_ids, Tensor target_probs, "
      "Tensor uniform, *, Tensor(a!) out_ids, Tensor(b!) accept_len) -> ()");
  m.def(
      "chain_greedy_verify(Tensor draft_ids, Tensor target, *, Tensor(a!) out_ids, "
      "Tensor(b!) accept_len) -> ()");

  // Token trees: structure and verification.
  m.def(
      "build_tree(Tensor parents, *, Tensor(a!) tree_mask, Tensor(b!) depth, "
      "Tensor(c!) paths) -> ()");
  m.def(
      "tree_verify_greedy(Tensor tree_tokens, Tensor parents, Tensor target, *, "
      "Tensor(a!) accept_path, Tensor(b!) accept_len, Tensor(c!) next_token) -> ()");
  m.def(
      "tree_speculative_sampling(Tensor tree_tokens, Tensor parents, Tensor target_probs, "
      "Tensor uniform, Tensor? draft_probs=None, float? posterior_threshold=None, "
      "float posterior_alpha=0.3, *, Tensor(a!) accept_path, Tensor(b!) accept_len, "
      "Tensor(c!) next_token) -> ()");

  // N-gram drafting: prompt lookup and the lookahead n-gram pool, whose state (head, entries,
  // cursor) inserts update in place.
  m.def(
      "ngram_match(Tensor context, Tensor context_len, int min_n, int max_n, "
      "bool earliest=False, *, Tensor(a!) draft, Tensor(b!) draft_len) -> ()");
  m.def(
      "ngram_pool_insert(Tensor(a!) head, Tensor(b!) entries, Tensor(c!) cursor, Tensor ngrams, "
      "int g) -> ()");
  m.def(
      "ngram_pool_lookup(Tensor head, Tensor entries, Tensor last_ids, *, "
      "Tensor(a!) candidates, Tensor(b!) count) -> ()");

  // Attention over a cached prefix plus a token tree, and committing the accepted entries of
  // every layer's KV cache (in place).
  m.def(
      "tree_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor prefix_len, "
      "Tensor? tree_mask=None, float? scale=None, *, Tensor(a!) out) -> ()");
  m.def(
      "kv_commit(Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, Tensor(c!) lengths, "
      "Tensor src_pos, Tensor accept_len) -> ()");

  // A target's linear layers on CPU (float32, bfloat16): each output row's bits are the same
  // whatever the number of rows in the product, so verification passes are exact (CPU only).
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None, *, Tensor(a!) out) -> ()");
}

}  // namespace specdec
