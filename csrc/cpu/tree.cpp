// CPU kernels of the tree ops: one row per task, the per-row logic of core/tree.h.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/special_entr.h>
#include <torch/library.h>

#include <vector>

#include "core/tree.h"
#include "cpu/serial_exec.h"
#include "op_args.h"

namespace specdec::cpu {
namespace {

// Entropy (nats) of every distribution of target_probs [B, T, V] -> float32 [B, T], for
// Medusa's typical acceptance (the CUDA kernels sum them per node, cuda/tree.cu).
at::Tensor node_entropy(const at::Tensor& target_probs) {
  return at::special_entr(target_probs.to(at::kFloat)).sum(-1).contiguous();
}

void build_tree(const at::Tensor& parents, const at::Tensor& tree_mask, const at::Tensor& depth,
                const at::Tensor& paths) {
  const auto d = check_build_tree(parents, tree_mask, depth, paths);
  const at::Tensor par = parents.contiguous();
  const int64_t T = d.T, L = paths.size(1), P = paths.size(2);
  AT_DISPATCH_INDEX_TYPES(par.scalar_type(), "build_tree", [&] {
    const index_t* pa = par.const_data_ptr<index_t>();
    bool* mask = tree_mask.mutable_data_ptr<bool>();
    index_t* dep = depth.mutable_data_ptr<index_t>();
    index_t* path = paths.mutable_data_ptr<index_t>();
    at::parallel_for(0, d.B, 1, [&](int64_t begin, int64_t end) {
      std::vector<char> leaf(T);
      for (int64_t b = begin; b < end; ++b) {
        const index_t* row = pa + b * T;
        for (int64_t i = 0; i < T; ++i) {
          bool is_leaf;
          core::tree_node_info(row, i, T, mask + (b * T + i) * T, dep + b * T + i, &is_leaf);
          leaf[i] = is_leaf;
        }
        index_t* pb = path + b * L * P;
        for (int64_t k = 0; k < L * P; ++k) pb[k] = -1;
        for (int64_t i = 0, l = 0; i < T && l < L; ++i)
          if (leaf[i]) core::write_path(row, i, dep[b * T + i], pb + P * l++, P);
      }
    });
  });
}

void tree_verify_greedy(const at::Tensor& tree_tokens, const at::Tensor& parents,
                        const at::Tensor& target, const at::Tensor& accept_path,
                        const at::Tensor& accept_len, const at::Tensor& next_token) {
  constexpr const char* op = "tree_verify_greedy";
  const auto d =
      check_tree_greedy(tree_tokens, parents, target, accept_path, accept_len, next_token);
  const at::Tensor t = target_ids(target, tree_tokens);
  const at::Tensor tok = tree_tokens.contiguous(), par = parents.contiguous();
  const int64_t T = d.T, P = d.width;
  AT_DISPATCH_INDEX_TYPES(tok.scalar_type(), op, [&] {
    const index_t* x = tok.const_data_ptr<index_t>();
    const index_t* pa = par.const_data_ptr<index_t>();
    const index_t* y = t.const_data_ptr<index_t>();
    index_t* path = accept_path.mutable_data_ptr<index_t>();
    index_t* len = accept_len.mutable_data_ptr<index_t>();
    index_t* next = next_token.mutable_data_ptr<index_t>();
    at::parallel_for(0, d.B, 16, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const index_t* yb = y + b * T;
        core::tree_greedy_row(x + b * T, pa + b * T,
                              [=](int64_t n) { return static_cast<int64_t>(yb[n]); }, T,
                              path + b * P, P, len + b, next + b);
      }
    });
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
  const at::Tensor tok = tree_tokens.contiguous(), par = parents.contiguous(),
                   target = target_probs.contiguous(), u = uniform.contiguous();
  const at::Tensor draft = draft_probs ? draft_probs->contiguous() : at::Tensor();
  // Entropy of every node's distribution, for typical acceptance only.
  const at::Tensor entropy = posterior_threshold ? node_entropy(target) : at::Tensor();
  const int64_t T = d.T, V = d.V, P = d.width;
  AT_DISPATCH_INDEX_TYPES(tok.scalar_type(), "tree_speculative_sampling", [&] {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, target.scalar_type(), "tree_speculative_sampling", [&] {
          const index_t* x = tok.const_data_ptr<index_t>();
          const index_t* pa = par.const_data_ptr<index_t>();
          const scalar_t* p = target.const_data_ptr<scalar_t>();
          const scalar_t* q = draft.defined() ? draft.const_data_ptr<scalar_t>() : nullptr;
          const float* uu = u.const_data_ptr<float>();
          index_t* path = accept_path.mutable_data_ptr<index_t>();
          index_t* len = accept_len.mutable_data_ptr<index_t>();
          index_t* next = next_token.mutable_data_ptr<index_t>();
          at::parallel_for(0, d.B, 1, [&](int64_t begin, int64_t end) {
            SerialExec ex;
            std::vector<float> resid(posterior_threshold ? 0 : V);
            for (int64_t b = begin; b < end; ++b) {
              const scalar_t* pb = p + b * T * V;
              if (posterior_threshold) {
                const int64_t node = core::tree_typical_walk(
                    x + b * T, pa + b * T, pb, entropy.const_data_ptr<float>() + b * T,
                    static_cast<float>(*posterior_threshold), static_cast<float>(posterior_alpha),
                    T, V, path + b * P, P, len + b, next + b);
                if (node >= 0)
                  next[b] = static_cast<index_t>(
                      core::sample_probs(ex, pb + node * V, V, uu[b * T]));
              } else {
                core::tree_sampling_row(ex, x + b * T, pa + b * T, pb, uu + b * T,
                                        q ? q + b * T * V : nullptr, T, V, resid.data(),
                                        path + b * P, P, len + b, next + b);
              }
            }
          });
        });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("build_tree", &build_tree);
  m.impl("tree_verify_greedy", &tree_verify_greedy);
  m.impl("tree_speculative_sampling", &tree_speculative_sampling);
}

}  // namespace specdec::cpu
