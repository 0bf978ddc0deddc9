// CUDA kernels of the tree ops: the per-row logic of core/tree.h. build_tree: one block per row,
// a thread per node; greedy and typical walks: one thread per row; sampling: one block per row.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "core/tree.h"
#include "cuda/block_exec.cuh"
#include "cuda/launch.cuh"
#include "op_args.h"

namespace specdec::cuda {
namespace {

constexpr int kTreeBlock = 256;
// build_tree keeps one leaf flag per node in shared memory.
constexpr int64_t kMaxTreeNodes = 32768;

template <class I>
__global__ void __launch_bounds__(kTreeBlock)
    build_tree_kernel(const I* parents, int64_t T, int64_t L, int64_t P, bool* mask, I* depth,
                      I* paths) {
  using Scan = cub::BlockScan<int, kTreeBlock>;
  __shared__ typename Scan::TempStorage scan;
  SPECDEC_DYNAMIC_SHARED(bool, is_leaf);
  const int64_t b = blockIdx.x;
  const I* row = parents + b * T;
  for (int64_t i = threadIdx.x; i < T; i += kTreeBlock)
    core::tree_node_info(row, i, T, mask + (b * T + i) * T, depth + b * T + i, &is_leaf[i]);
  __syncthreads();
  // Leaves in node order: a scan of the leaf flags, kTreeBlock nodes at a time, ranks them.
  I* pb = paths + b * L * P;
  int64_t before = 0;  // leaves among the nodes of the earlier steps
  for (int64_t base = 0; base < T; base += kTreeBlock) {
    const int64_t i = base + threadIdx.x;
    const int leaf = i < T && is_leaf[i];
    int inclusive, count;
    Scan(scan).InclusiveSum(leaf, inclusive, count);
    const int64_t rank = before + inclusive - 1;
    if (leaf && rank < L)
      core::write_path(row, i, static_cast<int64_t>(depth[b * T + i]), pb + rank * P, P);
    before += count;
    __syncthreads();  // the scan's storage is reused
  }
  for (int64_t k = before * P + threadIdx.x; k < L * P; k += kTreeBlock) pb[k] = static_cast<I>(-1);
}

template <class I>
__global__ void tree_greedy_kernel(const I* tokens, const I* parents, const I* target, int64_t B,
                                   int64_t T, int64_t P, I* path, I* len, I* next) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const I* t = target + b * T;
  core::tree_greedy_row(tokens + b * T, parents + b * T,
                        [=](int64_t n) { return static_cast<int64_t>(t[n]); }, T, path + b * P,
                        P, len + b, next + b);
}

template <class P, class I>
__global__ void __launch_bounds__(kRowBlock)
    tree_sampling_kernel(const I* tokens, const I* parents, const P* p, const float* u,
                         const P* q, int64_t T, int64_t V, float* resid, int64_t W, I* path,
                         I* len, I* next) {
  __shared__ typename BlockExec<kRowBlock>::Storage storage;
  BlockExec<kRowBlock> ex{storage};
  const int64_t b = blockIdx.x;
  core::tree_sampling_row(ex, tokens + b * T, parents + b * T, p + b * T * V, u + b * T,
                          q ? q + b * T * V : nullptr, T, V, resid + b * V, path + b * W, W,
                          len + b, next + b);
}

template <class P, class I>
__global__ void tree_typical_walk_kernel(const I* tokens, const I* parents, const P* p,
                                         const float* entropy, float threshold, float alpha,
                                         int64_t B, int64_t T, int64_t V, int64_t W, I* path,
                                         I* len, I* next, int64_t* sample_node) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  sample_node[b] = core::tree_typical_walk(tokens + b * T, parents + b * T, p + b * T * V,
                                           entropy + b * T, threshold, alpha, T, V, path + b * W,
                                           W, len + b, next + b);
}

// -p ln p, 0 where p <= 0 (or NaN).
__device__ inline float entropy_term(float p) { return p > 0.f ? -p * logf(p) : 0.f; }

// Entropy (nats) of every node's target distribution, for typical acceptance: a block per
// (row, node), summing -p ln p over the vocabulary (no [B, T, V] temporaries).
template <class P>
__global__ void __launch_bounds__(kRowBlock)
    node_entropy_kernel(const P* p, int64_t V, float* entropy) {
  __shared__ typename BlockExec<kRowBlock>::Storage storage;
  BlockExec<kRowBlock> ex{storage};
  const P* row = p + static_cast<int64_t>(blockIdx.x) * V;
  const float h = ex.sum(V, [=](int64_t j) { return entropy_term(core::to_float(row[j])); });
  if (ex.leader()) entropy[blockIdx.x] = h;
}

// Draws the next token of each row whose typical walk asked for one.
template <class P, class I>
__global__ void __launch_bounds__(kRowBlock)
    sample_at_node_kernel(const P* p, const float* u, const int64_t* sample_node, int64_t T,
                          int64_t V, I* next) {
  __shared__ typename BlockExec<kRowBlock>::Storage storage;
  BlockExec<kRowBlock> ex{storage};
  const int64_t b = blockIdx.x, node = sample_node[b];
  if (node < 0) return;
  const int64_t token = core::sample_probs(ex, p + (b * T + node) * V, V, u[b * T]);
  if (ex.leader()) next[b] = static_cast<I>(token);
}

void build_tree(const at::Tensor& parents, const at::Tensor& tree_mask, const at::Tensor& depth,
                const at::Tensor& paths) {
  const auto d = check_build_tree(parents, tree_mask, depth, paths);
  TORCH_CHECK_VALUE(d.T <= kMaxTreeNodes, "specdec.build_tree: trees of at most ", kMaxTreeNodes,
                    " nodes on CUDA, got ", d.T);
  if (d.B == 0) return;
  const DeviceScope device(parents);
  const at::Tensor par = parents.contiguous();
  AT_DISPATCH_INDEX_TYPES(par.scalar_type(), "build_tree", [&] {
    launch("build_tree", build_tree_kernel<index_t>, {d.B}, kTreeBlock, d.T, device,
           par.const_data_ptr<index_t>(), d.T, paths.size(1), paths.size(2),
           tree_mask.mutable_data_ptr<bool>(), depth.mutable_data_ptr<index_t>(),
           paths.mutable_data_ptr<index_t>());
  });
}

void tree_verify_greedy(const at::Tensor& tree_tokens, const at::Tensor& parents,
                        const at::Tensor& target, const at::Tensor& accept_path,
                        const at::Tensor& accept_len, const at::Tensor& next_token) {
  constexpr const char* op = "tree_verify_greedy";
  const auto d =
      check_tree_greedy(tree_tokens, parents, target, accept_path, accept_len, next_token);
  const at::Tensor t = target_ids(target, tree_tokens);
  if (d.B == 0) return;
  const DeviceScope device(tree_tokens);
  const at::Tensor tok = tree_tokens.contiguous(), par = parents.contiguous();
  AT_DISPATCH_INDEX_TYPES(tok.scalar_type(), op, [&] {
    launch(op, tree_greedy_kernel<index_t>, {blocks_for(d.B, kThreadsPerRowBlock)},
           kThreadsPerRowBlock, 0, device, tok.const_data_ptr<index_t>(),
           par.const_data_ptr<index_t>(), t.const_data_ptr<index_t>(), d.B, d.T, d.width,
           accept_path.mutable_data_ptr<index_t>(), accept_len.mutable_data_ptr<index_t>(),
           next_token.mutable_data_ptr<index_t>());
  });
}

void tree_speculative_sampling(const at::Tensor& tree_tokens, const at::Tensor& parents,
                               const at::Tensor& target_probs, const at::Tensor& uniform,
                               const std::optional<at::Tensor>& draft_probs,
                               std::optional<double> posterior_threshold, double posterior_alpha,
                               const at::Tensor& accept_path, const at::Tensor& accept_len,
                               const at::Tensor& next_token) {
  const auto d = check_tree_sampling(tree_tokens, parents, target_probs, uniform, draft_probs,
                                     posterior_threshold, posterior_alpha, accept_path,
                                     accept_len, next_token);
  constexpr const char* op = "tree_speculative_sampling";
  if (d.B == 0) return;
  const DeviceScope device(tree_tokens);
  const at::Tensor tok = tree_tokens.contiguous(), par = parents.contiguous(),
                   target = target_probs.contiguous(), u = uniform.contiguous();
  const at::Tensor draft = draft_probs ? draft_probs->contiguous() : at::Tensor();
  AT_DISPATCH_INDEX_TYPES(tok.scalar_type(), op, [&] {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, target.scalar_type(), op, [&] {
          const index_t* x = tok.const_data_ptr<index_t>();
          const index_t* pa = par.const_data_ptr<index_t>();
          const scalar_t* p = target.const_data_ptr<scalar_t>();
          index_t* path = accept_path.mutable_data_ptr<index_t>();
          index_t* len = accept_len.mutable_data_ptr<index_t>();
          index_t* next = next_token.mutable_data_ptr<index_t>();
          if (posterior_threshold) {
            const at::Tensor entropy = at::empty({d.B, d.T}, target.options().dtype(at::kFloat));
            launch(op, node_entropy_kernel<scalar_t>, {d.B * d.T}, kRowBlock, 0, device, p, d.V,
                   entropy.mutable_data_ptr<float>());
            const at::Tensor node = at::empty({d.B}, tok.options().dtype(at::kLong));
            launch(op, tree_typical_walk_kernel<scalar_t, index_t>,
                   {blocks_for(d.B, kThreadsPerRowBlock)}, kThreadsPerRowBlock, 0, device, x, pa,
                   p, entropy.const_data_ptr<float>(), static_cast<float>(*posterior_threshold),
                   static_cast<float>(posterior_alpha), d.B, d.T, d.V, d.width, path, len, next,
                   node.mutable_data_ptr<int64_t>());
            launch(op, sample_at_node_kernel<scalar_t, index_t>, {d.B}, kRowBlock, 0, device, p,
                   u.const_data_ptr<float>(), node.const_data_ptr<int64_t>(), d.T, d.V, next);
            return;
          }
          const at::Tensor resid = at::empty({d.B, d.V}, target.options().dtype(at::kFloat));
          launch(op, tree_sampling_kernel<scalar_t, index_t>, {d.B}, kRowBlock, 0, device, x, pa,
                 p, u.const_data_ptr<float>(),
                 draft.defined() ? draft.const_data_ptr<scalar_t>() : nullptr, d.T, d.V,
                 resid.mutable_data_ptr<float>(), d.width, path, len, next);
        });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(SPECDEC_CUDA_LIBRARY, SPECDEC_CUDA_KEY, m) {
  m.impl("build_tree", &build_tree);
  m.impl("tree_verify_greedy", &tree_verify_greedy);
  m.impl("tree_speculative_sampling", &tree_speculative_sampling);
}

}  // namespace specdec::cuda
