// CPU kernels of the chain ops: one row per task, the per-row logic of core/sampling.h.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "core/sampling.h"
#include "cpu/serial_exec.h"
#include "op_args.h"

namespace specdec::cpu {
namespace {

void chain_speculative_sampling(const std::optional<at::Tensor>& draft_probs,
                                const at::Tensor& draft_ids, const at::Tensor& target_probs,
                                const at::Tensor& uniform, const at::Tensor& out_ids,
                                const at::Tensor& accept_len) {
  const auto [B, K, V] =
      check_chain_sampling(draft_probs, draft_ids, target_probs, uniform, out_ids, accept_len);
  const at::Tensor ids = draft_ids.contiguous(), target = target_probs.contiguous(),
                   u = uniform.contiguous();
  const at::Tensor draft = draft_probs ? draft_probs->contiguous() : at::Tensor();
  AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), "chain_speculative_sampling", [&] {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, target.scalar_type(), "chain_speculative_sampling", [&] {
          const scalar_t* q = draft.defined() ? draft.const_data_ptr<scalar_t>() : nullptr;
          const scalar_t* p = target.const_data_ptr<scalar_t>();
          const index_t* x = ids.const_data_ptr<index_t>();
          const float* uu = u.const_data_ptr<float>();
          index_t* out = out_ids.mutable_data_ptr<index_t>();
          index_t* len = accept_len.mutable_data_ptr<index_t>();
          at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
            SerialExec ex;
            for (int64_t b = begin; b < end; ++b) {
              core::chain_sampling_row(ex, q ? q + b * K * V : nullptr, x + b * K,
                                       p + b * (K + 1) * V, uu + b * (K + 1), K, V,
                                       out + b * (K + 1), len + b);
            }
          });
        });
  });
}

void chain_greedy_verify(const at::Tensor& draft_ids, const at::Tensor& target,
                         const at::Tensor& out_ids, const at::Tensor& accept_len) {
  const auto [B, K, V] = check_chain_greedy(draft_ids, target, out_ids, accept_len);
  const at::Tensor t = target_ids(target, draft_ids);
  const at::Tensor ids = draft_ids.contiguous();
  AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), "chain_greedy_verify", [&] {
    const index_t* x = ids.const_data_ptr<index_t>();
    const index_t* y = t.const_data_ptr<index_t>();
    index_t* out = out_ids.mutable_data_ptr<index_t>();
    index_t* len = accept_len.mutable_data_ptr<index_t>();
    at::parallel_for(0, B, 256, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const index_t* yb = y + b * (K + 1);
        core::chain_greedy_row(x + b * K, [=](int64_t i) { return static_cast<int64_t>(yb[i]); },
                               K, out + b * (K + 1), len + b);
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("chain_speculative_sampling", &chain_speculative_sampling);
  m.impl("chain_greedy_verify", &chain_greedy_verify);
}

}  // namespace specdec::cpu
