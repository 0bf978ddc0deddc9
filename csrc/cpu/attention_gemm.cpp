// tree_attention on CPU for many tree tokens: per row, torch's own scaled_dot_product_attention
// with the row's explicit mask (prefix visible, then the tree), which is blocked for the cache
// and parallel the way GEMMs are; from a few tokens on it beats the streaming kernel of
// cpu/attention_kernel.h. Grouped query heads are folded into the query length so K/V are read
// once per KV head.
#include <ATen/ops/cat.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include "cpu/attention_args.h"

namespace specdec::cpu {

void tree_attention_gemm(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& prefix_len, const at::Tensor& mask, float scale,
                         const at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k_cache.size(1), G = H / Hkv;
  const int64_t* plen = prefix_len.const_data_ptr<int64_t>();
  const at::TensorOptions flags = q.options().dtype(at::kBool);
  const at::Tensor causal = mask.defined() ? at::Tensor() : at::ones({T, T}, flags).tril();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t P = plen[b];
    const at::Tensor tree = mask.defined() ? mask[b] : causal;
    // [T, P + T] for one query head, repeated for the G heads that share a KV head.
    const at::Tensor visible =
        at::cat({at::ones({T, P}, flags), tree}, 1).repeat({G, 1});
    const at::Tensor qb = q[b].reshape({1, Hkv, G * T, D});
    const at::Tensor kb = k_cache[b].narrow(1, 0, P + T).unsqueeze(0);
    const at::Tensor vb = v_cache[b].narrow(1, 0, P + T).unsqueeze(0);
    const at::Tensor ob = at::scaled_dot_product_attention(qb, kb, vb, visible, 0.0, false, scale);
    // A query that sees no key at all outputs zeros, as in the streaming kernel.
    out[b].copy_(ob.view({H, T, D}).nan_to_num(0.0));
  }
}

}  // namespace specdec::cpu
