// CUDA kernels of the chain ops: the per-row logic of core/sampling.h, one block per row for
// sampling (passes over the vocabulary), one thread per row for greedy verification.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "core/sampling.h"
#include "cuda/block_exec.cuh"
#include "cuda/launch.cuh"
#include "op_args.h"

namespace specdec::cuda {
namespace {

template <class P, class I>
__global__ void __launch_bounds__(kRowBlock)
    chain_sampling_kernel(const P* q, const I* ids, const P* p, const float* u, int64_t K,
                          int64_t V, I* out, I* len) {
  __shared__ typename BlockExec<kRowBlock>::Storage storage;
  BlockExec<kRowBlock> ex{storage};
  const int64_t b = blockIdx.x;
  core::chain_sampling_row(ex, q ? q + b * K * V : nullptr, ids + b * K, p + b * (K + 1) * V,
                           u + b * (K + 1), K, V, out + b * (K + 1), len + b);
}

template <class I>
__global__ void chain_greedy_kernel(const I* ids, const I* target, int64_t B, int64_t K, I* out,
                                    I* len) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const I* t = target + b * (K + 1);
  core::chain_greedy_row(ids + b * K, [=](int64_t i) { return static_cast<int64_t>(t[i]); }, K,
                         out + b * (K + 1), len + b);
}

void chain_speculative_sampling(const std::optional<at::Tensor>& draft_probs,
                                const at::Tensor& draft_ids, const at::Tensor& target_probs,
                                const at::Tensor& uniform, const at::Tensor& out_ids,
                                const at::Tensor& accept_len) {
  const auto [B, K, V] =
      check_chain_sampling(draft_probs, draft_ids, target_probs, uniform, out_ids, accept_len);
  if (B == 0) return;
  const DeviceScope device(draft_ids);
  const at::Tensor ids = draft_ids.contiguous(), target = target_probs.contiguous(),
                   u = uniform.contiguous();
  const at::Tensor draft = draft_probs ? draft_probs->contiguous() : at::Tensor();
  AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), "chain_speculative_sampling", [&] {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, target.scalar_type(), "chain_speculative_sampling", [&] {
          launch("chain_speculative_sampling", chain_sampling_kernel<scalar_t, index_t>, {B},
                 kRowBlock, 0, device,
                 draft.defined() ? draft.const_data_ptr<scalar_t>() : nullptr,
                 ids.const_data_ptr<index_t>(), target.const_data_ptr<scalar_t>(),
                 u.const_data_ptr<float>(), K, V, out_ids.mutable_data_ptr<index_t>(),
                 accept_len.mutable_data_ptr<index_t>());
        });
  });
}

void chain_greedy_verify(const at::Tensor& draft_ids, const at::Tensor& target,
                         const at::Tensor& out_ids, const at::Tensor& accept_len) {
  const auto [B, K, V] = check_chain_greedy(draft_ids, target, out_ids, accept_len);
  const at::Tensor t = target_ids(target, draft_ids);
  if (B == 0) return;
  const DeviceScope device(draft_ids);
  const at::Tensor ids = draft_ids.contiguous();
  AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), "chain_greedy_verify", [&] {
    launch("chain_greedy_verify", chain_greedy_kernel<index_t>,
           {blocks_for(B, kThreadsPerRowBlock)}, kThreadsPerRowBlock, 0, device,
           ids.const_data_ptr<index_t>(), t.const_data_ptr<index_t>(), B, K,
           out_ids.mutable_data_ptr<index_t>(), accept_len.mutable_data_ptr<index_t>());
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(SPECDEC_CUDA_LIBRARY, SPECDEC_CUDA_KEY, m) {
  m.impl("chain_speculative_sampling", &chain_speculative_sampling);
  m.impl("chain_greedy_verify", &chain_greedy_verify);
}

}  // namespace specdec::cuda
