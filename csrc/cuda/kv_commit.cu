// CUDA kernels of kv_commit: one launch copies every layer (layer pointers travel as a kernel
// parameter, up to kMaxLayers per launch); a thread owns fixed (head, channel) elements of one row
// and copies them for i = 0, 1, .. in order, so every element sees the sequential-copy semantics
// with no race. A second tiny kernel then advances the lengths.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>

#include "core/attention.h"
#include "cuda/launch.cuh"
#include "op_args.h"

namespace specdec::cuda {
namespace {

constexpr int kMaxLayers = 64;
constexpr int kCommitThreads = 256;

struct LayerPtrs {
  void* k[kMaxLayers];
  void* v[kMaxLayers];
};

// blockIdx.x: row (up to 2^31 - 1); blockIdx.y: 2 * layer + (0 keys, 1 values).
template <class E, class I>
__global__ void kv_commit_kernel(LayerPtrs layers, const I* __restrict__ lengths,
                                 const I* __restrict__ src_pos, const I* __restrict__ accept_len,
                                 int64_t S, int64_t A, int64_t Hk, int64_t Dk, int64_t Hv,
                                 int64_t Dv) {
  const int layer = blockIdx.y / 2;
  const bool is_k = blockIdx.y % 2 == 0;
  const int64_t b = blockIdx.x, H = is_k ? Hk : Hv, D = is_k ? Dk : Dv;
  E* cache = static_cast<E*>(is_k ? layers.k[layer] : layers.v[layer]) + b * H * S * D;
  const int64_t len = lengths[b];
  const int64_t n = core::commit_count(len, static_cast<int64_t>(accept_len[b]), A, S);
  const I* src = src_pos + b * A;
  for (int64_t e = threadIdx.x; e < H * D; e += blockDim.x) {
    E* base = cache + (e / D) * S * D + e % D;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t from = src[i];
      if (from >= 0 && from < S) base[(len + i) * D] = base[from * D];
    }
  }
}

template <class I>
__global__ void advance_lengths_kernel(I* lengths, const I* accept_len, int64_t B, int64_t A,
                                       int64_t S) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int64_t len = lengths[b];
  lengths[b] = static_cast<I>(len + core::commit_count(len, static_cast<int64_t>(accept_len[b]), A, S));
}

template <class E>
void launch_commit(at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& lengths,
                   const at::Tensor& src, const at::Tensor& n, const CommitDims& d,
                   const DeviceScope& device) {
  AT_DISPATCH_INDEX_TYPES(lengths.scalar_type(), "kv_commit", [&] {
    for (int64_t l0 = 0; l0 < d.L; l0 += kMaxLayers) {
      const int64_t count = std::min<int64_t>(kMaxLayers, d.L - l0);
      LayerPtrs ptrs{};
      for (int64_t l = 0; l < count; ++l) {
        ptrs.k[l] = k_caches[l0 + l].data_ptr();
        ptrs.v[l] = v_caches[l0 + l].data_ptr();
      }
      launch("kv_commit", kv_commit_kernel<E, index_t>, {d.B, 2 * count}, kCommitThreads, 0,
             device, ptrs, lengths.const_data_ptr<index_t>(), src.const_data_ptr<index_t>(),
             n.const_data_ptr<index_t>(), d.S, d.A, d.Hk, d.Dk, d.Hv, d.Dv);
    }
    launch("kv_commit", advance_lengths_kernel<index_t>, {blocks_for(d.B, kThreadsPerRowBlock)},
           kThreadsPerRowBlock, 0, device, lengths.mutable_data_ptr<index_t>(),
           n.const_data_ptr<index_t>(), d.B, d.A, d.S);
  });
}

void kv_commit(at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& lengths,
               const at::Tensor& src_pos, const at::Tensor& accept_len) {
  const auto d = check_kv_commit(k_caches, v_caches, lengths, src_pos, accept_len);
  if (d.B == 0) return;
  const DeviceScope device(lengths);
  const at::Tensor src = src_pos.contiguous(), n = accept_len.contiguous();
  // Entries are moved as opaque elements of the caches' element size.
  switch (k_caches[0].element_size()) {
    case 1: launch_commit<uint8_t>(k_caches, v_caches, lengths, src, n, d, device); break;
    case 2: launch_commit<uint16_t>(k_caches, v_caches, lengths, src, n, d, device); break;
    case 4: launch_commit<uint32_t>(k_caches, v_caches, lengths, src, n, d, device); break;
    default: launch_commit<uint64_t>(k_caches, v_caches, lengths, src, n, d, device); break;
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(SPECDEC_CUDA_LIBRARY, SPECDEC_CUDA_KEY, m) { m.impl("kv_commit", &kv_commit); }

}  // namespace specdec::cuda
