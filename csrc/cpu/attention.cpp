// CPU launchers of tree_attention and kv_commit.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>

#include "core/attention.h"
#include "cpu/attention_args.h"
#include "cpu/isa.h"
#include "op_args.h"

namespace specdec::cpu {
namespace {

// Whether mask[b, i, j] == (j <= i) everywhere ([B, T, T] bool, contiguous).
bool is_causal(const at::Tensor& mask) {
  const int64_t B = mask.size(0), T = mask.size(1);
  const bool* m = mask.const_data_ptr<bool>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j)
        if (m[(b * T + i) * T + j] != (j <= i)) return false;
  return true;
}

void tree_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                    const at::Tensor& prefix_len, const std::optional<at::Tensor>& tree_mask,
                    std::optional<double> scale, const at::Tensor& out) {
  const auto d = check_tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, out);
  const at::Tensor qc = q.contiguous(), plen = prefix_len.to(at::kLong).contiguous();
  // A mask that is causal in every row is a chain: run as one (its queries' keys are already
  // in path order, no gathering).
  at::Tensor mask = tree_mask ? tree_mask->contiguous() : at::Tensor();
  if (mask.defined() && is_causal(mask)) mask = at::Tensor();
  const float sc = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d.D)));
  AttentionArgs a{};
  a.q = qc.const_data_ptr();
  a.k = k_cache.const_data_ptr();
  a.v = v_cache.const_data_ptr();
  a.out = out.mutable_data_ptr();
  a.prefix_len = plen.const_data_ptr<int64_t>();
  a.mask = mask.defined() ? mask.const_data_ptr<bool>() : nullptr;
  a.B = d.B, a.H = d.H, a.Hkv = d.Hkv, a.T = d.T, a.D = d.D, a.S = d.S;
  a.k_sb = k_cache.stride(0), a.k_sh = k_cache.stride(1), a.k_ss = k_cache.stride(2);
  a.v_sb = v_cache.stride(0), a.v_sh = v_cache.stride(1), a.v_ss = v_cache.stride(2);
  a.scale = sc;
  a.dtype = q.scalar_type();
  if (cpu_has_avx2())
    avx2::tree_attention(a);
  else
    base::tree_attention(a);
}

// Copies `count` positions of one cache row: dst position start + i <- src position src[i], in
// order of i, so a source is read before a later copy can overwrite it (see docs/ops.md).
template <class E, class I>
void commit_row(E* cache, int64_t H, int64_t S, int64_t D, int64_t start, const I* src,
                int64_t count) {
  for (int64_t h = 0; h < H; ++h) {
    E* head = cache + h * S * D;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t from = src[i], to = start + i;
      if (from != to) std::memmove(head + to * D, head + from * D, D * sizeof(E));
    }
  }
}

void kv_commit(at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& lengths,
               const at::Tensor& src_pos, const at::Tensor& accept_len) {
  const auto d = check_kv_commit(k_caches, v_caches, lengths, src_pos, accept_len);
  const at::Tensor src = src_pos.contiguous(), n = accept_len.contiguous();
  const int64_t elem = k_caches[0].element_size();
  AT_DISPATCH_INDEX_TYPES(lengths.scalar_type(), "kv_commit", [&] {
    index_t* len = lengths.mutable_data_ptr<index_t>();
    const index_t* sp = src.const_data_ptr<index_t>();
    const index_t* np = n.const_data_ptr<index_t>();
    // One task per (cache tensor, row); the element type only matters for its size.
    at::parallel_for(0, 2 * d.L * d.B, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task % d.B, t = task / d.B, layer = t / 2;
        const bool is_k = t % 2 == 0;
        const at::Tensor& c = is_k ? k_caches[layer] : v_caches[layer];
        const int64_t H = is_k ? d.Hk : d.Hv, D = is_k ? d.Dk : d.Dv;
        auto* base = static_cast<char*>(c.mutable_data_ptr()) + b * H * d.S * D * elem;
        commit_row(base, H, d.S, D * elem, len[b], sp + b * d.A,
                   core::commit_count(len[b], np[b], d.A, d.S));
      }
    });
    for (int64_t b = 0; b < d.B; ++b) len[b] += np[b];
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("tree_attention", &tree_attention);
  m.impl("kv_commit", &kv_commit);
}

}  // namespace specdec::cpu
