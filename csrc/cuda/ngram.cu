// CUDA kernels of the n-gram ops, the per-row logic of core/ngram.h: ngram_match runs a block
// per row (threads scan strided candidate positions, a CUB reduction keeps the best hit); the
// pool ops run a thread per row (a row's n-grams are inserted one after the other, in order).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "core/ngram.h"
#include "cuda/cub.cuh"
#include "cuda/launch.cuh"
#include "op_args.h"

namespace specdec::cuda {
namespace {

constexpr int kMatchBlock = 256;

struct BetterHit {
  bool earliest;
  __device__ core::NGramHit operator()(const core::NGramHit& a, const core::NGramHit& b) const {
    return core::better_hit(a, b, earliest);
  }
};

template <class I>
__global__ void __launch_bounds__(kMatchBlock)
    ngram_match_kernel(const I* context, const I* context_len, int64_t S, int64_t min_n,
                       int64_t max_n, bool earliest, int64_t K, I* draft, I* draft_len) {
  using Reduce = cub::BlockReduce<core::NGramHit, kMatchBlock>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ core::NGramHit best;
  const int64_t b = blockIdx.x;
  const I* row = context + b * S;
  const int64_t L = core::clamp_len(context_len[b], S);
  const core::NGramHit mine =
      core::best_hit_strided(row, L, min_n, max_n, earliest, threadIdx.x, kMatchBlock);
  const core::NGramHit hit = Reduce(temp).Reduce(mine, BetterHit{earliest});
  if (threadIdx.x == 0) best = hit;
  __syncthreads();
  const int64_t n = core::hit_draft_len(best, L, K);
  for (int64_t j = threadIdx.x; j < K; j += kMatchBlock)
    draft[b * K + j] = core::hit_draft_token(row, best, n, j);
  if (threadIdx.x == 0) draft_len[b] = static_cast<I>(n);
}

template <class I>
__global__ void ngram_pool_insert_kernel(I* head, I* entries, I* cursor, const I* ngrams,
                                         int64_t B, int64_t V, int64_t C, int64_t N, int64_t M,
                                         int64_t g) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const core::PoolRow<I> pool{head + b * V, entries + b * C * (N + 1), V, C, N};
  for (int64_t m = 0; m < M; ++m) pool.insert(ngrams + (b * M + m) * N, g, cursor + b);
}

template <class I>
__global__ void ngram_pool_lookup_kernel(const I* head, const I* entries, const I* last_ids,
                                         int64_t B, int64_t V, int64_t C, int64_t N, int64_t G,
                                         I* candidates, I* count) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  count[b] = static_cast<I>(core::pool_lookup_row(head + b * V, entries + b * C * (N + 1), V, C,
                                                  N, last_ids[b], G,
                                                  candidates + b * G * (N - 1)));
}

void ngram_match(const at::Tensor& context, const at::Tensor& context_len, int64_t min_n,
                 int64_t max_n, bool earliest, const at::Tensor& draft,
                 const at::Tensor& draft_len) {
  const auto [B, S, K] = check_ngram_match(context, context_len, min_n, max_n, draft, draft_len);
  if (B == 0) return;
  const DeviceScope device(context);
  const at::Tensor ctx = context.contiguous(), lens = context_len.contiguous();
  AT_DISPATCH_INDEX_TYPES(ctx.scalar_type(), "ngram_match", [&] {
    launch("ngram_match", ngram_match_kernel<index_t>, {B}, kMatchBlock, 0, device,
           ctx.const_data_ptr<index_t>(), lens.const_data_ptr<index_t>(), S, min_n, max_n,
           earliest, K, draft.mutable_data_ptr<index_t>(), draft_len.mutable_data_ptr<index_t>());
  });
}

void ngram_pool_insert(const at::Tensor& head, const at::Tensor& entries, const at::Tensor& cursor,
                       const at::Tensor& ngrams, int64_t g) {
  const auto d = check_ngram_pool_insert(head, entries, cursor, ngrams, g);
  const int64_t M = ngrams.size(1);
  if (d.B == 0 || M == 0) return;
  const DeviceScope device(head);
  const at::Tensor grams = ngrams.contiguous();
  AT_DISPATCH_INDEX_TYPES(head.scalar_type(), "ngram_pool_insert", [&] {
    launch("ngram_pool_insert", ngram_pool_insert_kernel<index_t>,
           {blocks_for(d.B, kThreadsPerRowBlock)}, kThreadsPerRowBlock, 0, device,
           head.mutable_data_ptr<index_t>(), entries.mutable_data_ptr<index_t>(),
           cursor.mutable_data_ptr<index_t>(), grams.const_data_ptr<index_t>(), d.B, d.V, d.C,
           d.N, M, g);
  });
}

void ngram_pool_lookup(const at::Tensor& head, const at::Tensor& entries, const at::Tensor& last_ids,
                       const at::Tensor& candidates, const at::Tensor& count) {
  const auto d = check_ngram_pool_lookup(head, entries, last_ids, candidates, count);
  if (d.B == 0) return;
  const DeviceScope device(head);
  const at::Tensor ids = last_ids.contiguous();
  AT_DISPATCH_INDEX_TYPES(head.scalar_type(), "ngram_pool_lookup", [&] {
    launch("ngram_pool_lookup", ngram_pool_lookup_kernel<index_t>,
           {blocks_for(d.B, kThreadsPerRowBlock)}, kThreadsPerRowBlock, 0, device,
           head.const_data_ptr<index_t>(), entries.const_data_ptr<index_t>(),
           ids.const_data_ptr<index_t>(), d.B, d.V, d.C, d.N, d.G,
           candidates.mutable_data_ptr<index_t>(), count.mutable_data_ptr<index_t>());
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(SPECDEC_CUDA_LIBRARY, SPECDEC_CUDA_KEY, m) {
  m.impl("ngram_match", &ngram_match);
  m.impl("ngram_pool_insert", &ngram_pool_insert);
  m.impl("ngram_pool_lookup", &ngram_pool_lookup);
}

}  // namespace specdec::cuda
