// CUDA kernels of tree_attention and kv_commit.
//
// tree_attention, flash-decoding style: a thread block takes one (row b, KV head), a tile of
// query rows (the G query heads sharing that KV head times some query positions, so K/V is read
// once per group) and one split of the row's keys; it keeps an online softmax per query row
// (core/attention.h) over chunks of keys staged in shared memory. With several splits each
// block writes its partial (max, sum, accumulator) and a merge kernel combines them; with one
// split the block writes the output directly. No host synchronisation: the splits are sized
// from the cache length S, and blocks whose split lies past their row's keys write an empty
// partial.
//
// kv_commit: one launch copies every layer (layer pointers travel as a kernel parameter, up to
// kMaxLayers per launch); a thread owns fixed (head, channel) elements of one row and copies
// them for i = 0, 1, .. in order, so every element sees the sequential-copy semantics with no
// race. A second tiny kernel then advances the lengths.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "core/attention.h"
#include "cuda/launch.cuh"
#include "cuda/warp.cuh"
#include "op_args.h"

namespace specdec::cuda {
namespace {

constexpr int kAttnThreads = 128;
constexpr int64_t kMinSplitKeys = 256;     // fewer keys per split do not pay for the merge

struct Tile {
  int64_t rows, keys;  // query rows per block, keys per shared-memory chunk
  int64_t smem_floats(int64_t D) const {
    // Q, K (padded rows), V, scores, m/l/alpha, accumulator.
    return rows * D + keys * (D + 1) + keys * D + rows * keys + 3 * rows + rows * D;
  }
};

Tile pick_tile(int64_t D) {
  Tile t{16, 32};
  while (t.smem_floats(D) * 4 > kMaxSharedBytes && (t.keys > 1 || t.rows > 1)) {
    if (t.keys > 8 || t.rows == 1) t.keys /= 2; else t.rows /= 2;
  }
  return t;
}

struct AttnParams {
  int64_t B, H, Hkv, T, D, S;
  int64_t k_sb, k_sh, k_ss, v_sb, v_sh, v_ss;
  float scale;
  int64_t tile_rows, chunk, split_len, num_splits;
};

template <class scalar_t, class I>
__global__ void __launch_bounds__(kAttnThreads)
    tree_attention_kernel(const scalar_t* __restrict__ q, const scalar_t* __restrict__ k,
                          const scalar_t* __restrict__ v, const I* __restrict__ prefix_len,
                          const bool* __restrict__ mask, AttnParams p, scalar_t* __restrict__ out,
                          float* __restrict__ part_acc, float* __restrict__ part_ml) {
  SPECDEC_DYNAMIC_SHARED(float, smem);
  const int64_t R = p.tile_rows, C = p.chunk, D = p.D, T = p.T;
  float* qs = smem;                 // [R, D]
  float* ks = qs + R * D;           // [C, D + 1]
  float* vs = ks + C * (D + 1);     // [C, D]
  float* ps = vs + C * D;           // [R, C]
  float* m_s = ps + R * C;          // [R]
  float* l_s = m_s + R;             // [R]
  float* alpha_s = l_s + R;         // [R]
  float* acc = alpha_s + R;         // [R, D]

  const int64_t G = p.H / p.Hkv, rows_total = T * G;
  // Rows x KV heads on x (up to 2^31 - 1 blocks), splits on y, query tiles on z.
  const int64_t split = blockIdx.y, b = blockIdx.x / p.Hkv, kvh = blockIdx.x % p.Hkv;
  const int64_t r0 = static_cast<int64_t>(blockIdx.z) * R;
  const int64_t r_end = r0 + R < rows_total ? r0 + R : rows_total;
  const int64_t P = core::clamp_prefix(static_cast<int64_t>(prefix_len[b]), T, p.S);
  const int64_t n_keys = core::keys_needed(mask == nullptr, (r_end - 1) / G + 1, P, T);
  const int64_t s0 = split * p.split_len;
  const int64_t s1 = s0 + p.split_len < n_keys ? s0 + p.split_len : n_keys;
  const scalar_t* kb = k + b * p.k_sb + kvh * p.k_sh;
  const scalar_t* vb = v + b * p.v_sb + kvh * p.v_sh;

  for (int64_t x = threadIdx.x; x < R * D; x += blockDim.x) {
    const int64_t r = x / D, d = x % D, row = r0 + r;
    float val = 0.f;
    if (row < rows_total) {
      const int64_t i = row / G, h = kvh * G + row % G;
      val = static_cast<float>(q[((b * p.H + h) * T + i) * D + d]) * p.scale;
    }
    qs[x] = val;
    acc[x] = 0.f;
  }
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.f;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  for (int64_t c0 = s0; c0 < s1; c0 += C) {
    for (int64_t x = threadIdx.x; x < C * D; x += blockDim.x) {
      const int64_t c = x / D, d = x % D, j = c0 + c;
      const bool in = j < s1;
      ks[c * (D + 1) + d] = in ? static_cast<float>(kb[j * p.k_ss + d]) : 0.f;
      vs[c * D + d] = in ? static_cast<float>(vb[j * p.v_ss + d]) : 0.f;
    }
    __syncthreads();
    for (int64_t x = threadIdx.x; x < R * C; x += blockDim.x) {
      const int64_t r = x / C, c = x % C, row = r0 + r, j = c0 + c;
      float s = -INFINITY;
      if (row < rows_total && j < s1) {
        const int64_t i = row / G;
        if (core::key_visible(mask ? mask + (b * T + i) * T : nullptr, i, j, P, T)) {
          s = 0.f;
          for (int64_t d = 0; d < D; ++d) s += qs[r * D + d] * ks[c * (D + 1) + d];
        }
      }
      ps[x] = s;
    }
    __syncthreads();
    // Online softmax: a warp per query row.
    for (int64_t r = warp; r < R; r += n_warps) {
      float block_max = -INFINITY;
      for (int64_t c = lane; c < C; c += 32) block_max = fmaxf(block_max, ps[r * C + c]);
      block_max = warp_max(block_max);
      core::SoftmaxState st{m_s[r], l_s[r]};
      const float alpha = core::softmax_rescale(st, block_max);
      float sum = 0.f;
      for (int64_t c = lane; c < C; c += 32) {
        const float w = core::softmax_weight(ps[r * C + c], st.m);
        ps[r * C + c] = w;
        sum += w;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        m_s[r] = st.m;
        l_s[r] = st.l + sum;
        alpha_s[r] = alpha;
      }
    }
    __syncthreads();
    for (int64_t x = threadIdx.x; x < R * D; x += blockDim.x) {
      const int64_t r = x / D, d = x % D;
      float a = acc[x] * alpha_s[r];
      for (int64_t c = 0; c < C; ++c) a += ps[r * C + c] * vs[c * D + d];
      acc[x] = a;
    }
    __syncthreads();
  }

  for (int64_t x = threadIdx.x; x < R * D; x += blockDim.x) {
    const int64_t r = x / D, d = x % D, row = r0 + r;
    if (row >= rows_total) continue;
    const int64_t i = row / G, h = kvh * G + row % G;
    const int64_t slot = (b * p.H + h) * T + i;
    if (p.num_splits == 1) {
      out[slot * D + d] = static_cast<scalar_t>(acc[x] * core::softmax_inv_sum(l_s[r]));
    } else {
      const int64_t part = split * p.B * p.H * T + slot;
      part_acc[part * D + d] = acc[x];
      if (d == 0) {
        part_ml[2 * part] = m_s[r];
        part_ml[2 * part + 1] = l_s[r];
      }
    }
  }
}

// One block per (b, h, i): combines the splits' partial states.
template <class scalar_t>
__global__ void merge_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                             int64_t n_slots, int64_t num_splits, int64_t D,
                             scalar_t* __restrict__ out) {
  const int64_t slot = blockIdx.x;
  float m = -INFINITY;
  for (int64_t s = 0; s < num_splits; ++s) m = core::merge_max(m, part_ml[2 * (s * n_slots + slot)]);
  float l = 0.f;
  for (int64_t s = 0; s < num_splits; ++s) {
    const int64_t part = s * n_slots + slot;
    l += core::merge_weight(part_ml[2 * part], m) * part_ml[2 * part + 1];
  }
  const float inv = core::softmax_inv_sum(l);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0.f;
    for (int64_t s = 0; s < num_splits; ++s) {
      const int64_t part = s * n_slots + slot;
      a += core::merge_weight(part_ml[2 * part], m) * part_acc[part * D + d];
    }
    out[slot * D + d] = static_cast<scalar_t>(a * inv);
  }
}

void tree_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                    const at::Tensor& prefix_len, const std::optional<at::Tensor>& tree_mask,
                    std::optional<double> scale, const at::Tensor& out) {
  const auto d = check_tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, out);
  if (d.B == 0) return;
  const Tile tile = pick_tile(d.D);
  TORCH_CHECK_VALUE(tile.smem_floats(d.D) * 4 <= kMaxSharedBytes, "specdec.tree_attention: q's head size ",
                    d.D, " is too large for the CUDA kernel");
  const DeviceScope device(q);
  const at::Tensor qc = q.contiguous(), plen = prefix_len.contiguous();
  const at::Tensor mask = tree_mask ? tree_mask->contiguous() : at::Tensor();

  const int64_t G = d.H / d.Hkv;
  const int64_t tiles = (d.T * G + tile.rows - 1) / tile.rows;
  // Enough splits to fill the GPU about twice with one tile per (row, KV head), none shorter
  // than kMinSplitKeys. Not counted by tiles: a query's key splits, so its rounding, must not
  // depend on how many queries share the pass (T) or how they are tiled (G, D).
  const int64_t max_splits = std::max<int64_t>(1, (d.S + kMinSplitKeys - 1) / kMinSplitKeys);
  const int64_t heads = d.B * d.Hkv;
  const int64_t want = (2 * device.sm_count() + heads - 1) / heads;
  const int64_t num_splits = std::min(max_splits, std::max<int64_t>(1, want));
  const int64_t split_len = (d.S + num_splits - 1) / num_splits;

  AttnParams p{d.B, d.H, d.Hkv, d.T, d.D, d.S,
               k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
               v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
               static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d.D))),
               tile.rows, tile.keys, split_len, num_splits};
  at::Tensor part_acc, part_ml;
  if (num_splits > 1) {
    const auto opts = q.options().dtype(at::kFloat);
    part_acc = at::empty({num_splits, d.B * d.H * d.T, d.D}, opts);
    part_ml = at::empty({num_splits, d.B * d.H * d.T, 2}, opts);
  }
  const size_t smem = static_cast<size_t>(tile.smem_floats(d.D)) * sizeof(float);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "tree_attention", [&] {
    AT_DISPATCH_INDEX_TYPES(plen.scalar_type(), "tree_attention", [&] {
      launch("tree_attention", tree_attention_kernel<scalar_t, index_t>,
             {d.B * d.Hkv, num_splits, tiles}, kAttnThreads, smem, device,
             qc.const_data_ptr<scalar_t>(), k_cache.const_data_ptr<scalar_t>(),
             v_cache.const_data_ptr<scalar_t>(), plen.const_data_ptr<index_t>(),
             mask.defined() ? mask.const_data_ptr<bool>() : nullptr, p,
             out.mutable_data_ptr<scalar_t>(),
             num_splits > 1 ? part_acc.mutable_data_ptr<float>() : nullptr,
             num_splits > 1 ? part_ml.mutable_data_ptr<float>() : nullptr);
    });
    if (num_splits > 1) {
      const int64_t slots = d.B * d.H * d.T;
      launch("tree_attention", merge_kernel<scalar_t>, {slots}, 128, 0, device,
             part_acc.const_data_ptr<float>(), part_ml.const_data_ptr<float>(), slots,
             num_splits, d.D, out.mutable_data_ptr<scalar_t>());
    }
  });
}

// --- kv_commit ------------------------------------------------------------------------------
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

TORCH_LIBRARY_IMPL(SPECDEC_CUDA_LIBRARY, SPECDEC_CUDA_KEY, m) {
  m.impl("tree_attention", &tree_attention);
  m.impl("kv_commit", &kv_commit);
}

}  // namespace specdec::cuda
