// CUDA kernels of tree_attention, FlashAttention-2 style with flash-decoding's key splits.
//
// A thread block takes one (row b, KV head), a tile of query rows (query positions times the G
// query heads sharing that KV head, position-major, so K/V is read once per group: 16 rows per
// warp, up to 4 warps) and one split of the row's keys. It stages its queries once, then key and
// value tiles of KEYS keys in shared memory with 16-byte asynchronous copies (cp.async; one tile
// at a time: a second buffer would not fit 48 KiB at D = 128, cuda/attention_smem.cuh); each
// warp computes its rows' scores (tensor cores for half and bfloat16, cuda/attention_warp.cuh),
// runs their online softmax (core/attention.h) with two lanes per row holding the row's state in
// registers, and advances its output accumulator, in registers, by P V. Two block barriers per
// key tile. With several splits each block writes its partial (max, sum, accumulator) and a merge
// kernel combines them; with one split the block writes the output directly. No host
// synchronisation: the splits are sized from the cache length S, and blocks whose split lies past
// their row's keys write an empty partial.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "core/attention.h"
#include "cuda/attention_smem.cuh"
#include "cuda/attention_warp.cuh"
#include "cuda/launch.cuh"
#include "op_args.h"

namespace specdec::cuda {
namespace {

constexpr int kAttnMaxThreads = 4 * 32;
// Fewest keys per split: 4 key tiles. A block waits for each tile's loads (one buffer), so short
// prefixes gain from spreading over more blocks; fewer keys would not pay for the merge.
constexpr int64_t kMinSplitKeys = 128;
constexpr int64_t kMaxHead = 256;  // widest head (16-column slices: 4, 8 or 16 per bucket)

struct AttnParams {
  int64_t B, H, Hkv, T, D, S, dp;
  int64_t k_sb, k_sh, k_ss, v_sb, v_sh, v_ss;
  float scale;
  int64_t split_len, num_splits;
  bool prefix_int64;  // prefix_len's index type (int32 otherwise)
  bool vec;           // every q, k and v row starts 16-byte aligned
};

template <class scalar_t, int NF>
__global__ void __launch_bounds__(kAttnMaxThreads)
    tree_attention_kernel(const scalar_t* __restrict__ q, const scalar_t* __restrict__ k,
                          const scalar_t* __restrict__ v, const void* __restrict__ prefix_len,
                          const bool* __restrict__ mask, AttnParams p, scalar_t* __restrict__ out,
                          float* __restrict__ part_acc, float* __restrict__ part_ml) {
  using Elem = TileElem<scalar_t>;
  constexpr int KEYS = attn_config<Elem>(NF).keys;
  SPECDEC_DYNAMIC_SHARED(SharedBase, smem_base);
  const int64_t warps = blockDim.x / 32, R = warps * kWarpRows, T = p.T, D = p.D;
  const AttnSmem<Elem> sm(smem_base, warps, KEYS, p.dp);
  const int64_t ld = AttnSmem<Elem>::ld(p.dp), s_ld = AttnSmem<Elem>::score_ld(KEYS),
                p_ld = AttnSmem<Elem>::prob_ld(KEYS);
  const int nf = static_cast<int>(p.dp / 16);

  const int64_t G = p.H / p.Hkv, rows_total = T * G;
  // Rows x KV heads on x (up to 2^31 - 1 blocks), query tiles on y, splits on z: blocks run in
  // x-fastest order, so the tiles reading one (row, KV head, split)'s keys run close together and
  // all but the first find them in L2.
  const int64_t split = blockIdx.z, b = blockIdx.x / p.Hkv, kvh = blockIdx.x % p.Hkv;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * R;
  const int64_t r_end = r0 + R < rows_total ? r0 + R : rows_total;
  const int64_t plen = p.prefix_int64 ? static_cast<const int64_t*>(prefix_len)[b]
                                      : static_cast<const int32_t*>(prefix_len)[b];
  const int64_t P = core::clamp_prefix(plen, T, p.S);
  const int64_t n_keys = core::keys_needed(mask == nullptr, (r_end - 1) / G + 1, P, T);
  const int64_t s0 = split * p.split_len;
  const int64_t s1 = s0 + p.split_len < n_keys ? s0 + p.split_len : n_keys;
  const scalar_t* kb = k + b * p.k_sb + kvh * p.k_sh;
  const scalar_t* vb = v + b * p.v_sb + kvh * p.v_sh;

  // Row r of the block is query position (r0 + r) / G of head kvh * G + (r0 + r) % G.
  stage_rows<Elem, scalar_t>(sm.q, ld, R, p.dp, D, p.vec, [&](int64_t r) -> const scalar_t* {
    const int64_t row = r0 + r;
    return row < rows_total ? q + ((b * p.H + kvh * G + row % G) * T + row / G) * D : nullptr;
  });

  // This warp's rows and tiles; lanes 2 r and 2 r + 1 run row r's softmax, each over every
  // other key of a tile (keys h, h + 2, ..), and hold its state.
  const int warp = threadIdx.x / 32, r = threadIdx.x % 32 / 2, h = threadIdx.x % 2;
  const Elem* q_w = sm.q + warp * kWarpRows * ld;
  float* scores = sm.scores + warp * kWarpRows * s_ld;
  Elem* probs = sm.probs + warp * kWarpRows * p_ld;
  float* alpha = sm.alpha + warp * kWarpRows;
  const int64_t row = r0 + warp * kWarpRows + r, i = row / G;
  const bool valid = row < rows_total;
  const bool* mask_row = mask != nullptr && valid ? mask + (b * T + i) * T : nullptr;
  WarpTile<Elem, NF, KEYS> tile(scores);
  core::SoftmaxState st;
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();

  for (int64_t c0 = s0; c0 < s1; c0 += KEYS) {
    const auto key_row = [&](const scalar_t* base, int64_t stride) {
      return [=](int64_t c) -> const scalar_t* {
        return c0 + c < s1 ? base + (c0 + c) * stride : nullptr;
      };
    };
    stage_rows<Elem, scalar_t>(sm.k, ld, KEYS, p.dp, D, p.vec, key_row(kb, p.k_ss));
    stage_rows<Elem, scalar_t>(sm.v, ld, KEYS, p.dp, D, p.vec, key_row(vb, p.v_ss));
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    tile.scores(q_w, sm.k, ld, nf, scores, s_ld);
    __syncwarp();

    float s[KEYS / 2];
    float tile_max = -INFINITY;
    for (int m = 0; m < KEYS / 2; ++m) {
      const int64_t c = h + 2 * m, j = c0 + c;
      const bool visible = valid && j < s1 && core::key_visible(mask_row, i, j, P, T);
      s[m] = visible ? scores[r * s_ld + c] * p.scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[m]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float a = core::softmax_rescale(st, tile_max);
    float sum = 0.f;
    for (int m = 0; m < KEYS / 2; ++m) {
      const float w = core::softmax_weight(s[m], st.m);
      probs[r * p_ld + h + 2 * m] = static_cast<Elem>(w);
      sum += w;
    }
    st.l += sum + __shfl_xor_sync(0xffffffffu, sum, 1);
    if (h == 0) alpha[r] = a;
    __syncwarp();
    tile.rescale(alpha, nf);
    tile.accumulate(probs, p_ld, sm.v, ld, nf);
    __syncthreads();  // the key and value tiles are restaged
  }

  // The output, a 16-column slice at a time through the warp's score tile.
  const int64_t slot = (b * p.H + kvh * G + row % G) * T + i;
  const int64_t part = split * p.B * p.H * T + slot;
  const float inv = core::softmax_inv_sum(st.l);
#pragma unroll
  for (int f = 0; f < NF; ++f) {  // NF, not nf: the accumulator stays in registers
    if (f >= nf) break;
    tile.store(f, scores);
    __syncwarp();
    for (int e = 0; e < 8; ++e) {
      const int64_t d = 16 * f + 8 * h + e;
      if (!valid || d >= D) continue;
      const float x = scores[r * 16 + 8 * h + e];
      if (p.num_splits == 1) out[slot * D + d] = static_cast<scalar_t>(x * inv);
      else part_acc[part * D + d] = x;
    }
    __syncwarp();
  }
  if (valid && h == 0 && p.num_splits > 1) {
    part_ml[2 * part] = st.m;
    part_ml[2 * part + 1] = st.l;
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

bool aligned16(const at::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 != 0) return false;
  for (int dim = 0; dim + 1 < t.dim(); ++dim)
    if (t.stride(dim) * t.element_size() % 16 != 0) return false;
  return true;
}

// The attention kernel for heads of up to 16 NF channels: as many warps as the rows need, up to
// the configuration's.
template <class scalar_t, int NF>
void launch_attention(const AttentionDims& d, const AttnParams& p, const DeviceScope& device,
                      const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& plen, const at::Tensor& mask, const at::Tensor& out,
                      const at::Tensor& part_acc, const at::Tensor& part_ml) {
  constexpr AttnConfig cfg = attn_config<TileElem<scalar_t>>(NF);
  static_assert(cfg.warps > 0, "no key tile fits the shared memory at this head size");
  const int64_t rows = d.T * (d.H / d.Hkv);
  const int64_t warps = std::min<int64_t>(cfg.warps, blocks_for(rows, kWarpRows));
  const int64_t tiles = blocks_for(rows, warps * kWarpRows);
  const auto smem = AttnSmem<TileElem<scalar_t>>::bytes(warps, cfg.keys, p.dp);
  launch("tree_attention", tree_attention_kernel<scalar_t, NF>, {d.B * d.Hkv, tiles, p.num_splits},
         static_cast<int>(32 * warps), static_cast<size_t>(smem), device,
         q.const_data_ptr<scalar_t>(), k.const_data_ptr<scalar_t>(), v.const_data_ptr<scalar_t>(),
         plen.const_data_ptr(), mask.defined() ? mask.const_data_ptr<bool>() : nullptr, p,
         out.mutable_data_ptr<scalar_t>(),
         part_acc.defined() ? part_acc.mutable_data_ptr<float>() : nullptr,
         part_ml.defined() ? part_ml.mutable_data_ptr<float>() : nullptr);
}

void tree_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                    const at::Tensor& prefix_len, const std::optional<at::Tensor>& tree_mask,
                    std::optional<double> scale, const at::Tensor& out) {
  const auto d = check_tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, out);
  if (d.B == 0) return;
  const int64_t dp = (d.D + 15) / 16 * 16;
  TORCH_CHECK_VALUE(dp <= kMaxHead, "specdec.tree_attention: q's head size ", d.D,
                    " is too large for the CUDA kernel (at most ", kMaxHead, ")");
  const DeviceScope device(q);
  const at::Tensor qc = q.contiguous(), plen = prefix_len.contiguous();
  const at::Tensor mask = tree_mask ? tree_mask->contiguous() : at::Tensor();

  // Enough splits to fill the GPU about twice with one tile per (row, KV head), none shorter
  // than kMinSplitKeys. Not counted by tiles: a query's key splits, so its rounding, must not
  // depend on how many queries share the pass (T) or how they are tiled (G, D).
  const int64_t max_splits = std::max<int64_t>(1, (d.S + kMinSplitKeys - 1) / kMinSplitKeys);
  const int64_t heads = d.B * d.Hkv;
  const int64_t want = (2 * device.sm_count() + heads - 1) / heads;
  const int64_t num_splits = std::min(max_splits, std::max<int64_t>(1, want));
  const int64_t split_len = (d.S + num_splits - 1) / num_splits;

  const AttnParams p{d.B, d.H, d.Hkv, d.T, d.D, d.S, dp,
                     k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                     v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                     static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d.D))),
                     split_len, num_splits, plen.scalar_type() == at::kLong,
                     aligned16(qc) && aligned16(k_cache) && aligned16(v_cache)};
  at::Tensor part_acc, part_ml;
  if (num_splits > 1) {
    const auto opts = q.options().dtype(at::kFloat);
    part_acc = at::empty({num_splits, d.B * d.H * d.T, d.D}, opts);
    part_ml = at::empty({num_splits, d.B * d.H * d.T, 2}, opts);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "tree_attention", [&] {
    const auto run = [&](auto nf) {
      launch_attention<scalar_t, decltype(nf)::value>(d, p, device, qc, k_cache, v_cache, plen,
                                                      mask, out, part_acc, part_ml);
    };
    if (dp <= 64) run(std::integral_constant<int, 4>());
    else if (dp <= 128) run(std::integral_constant<int, 8>());
    else run(std::integral_constant<int, 16>());
    if (num_splits > 1) {
      const int64_t slots = d.B * d.H * d.T;
      launch("tree_attention", merge_kernel<scalar_t>, {slots}, 128, 0, device,
             part_acc.const_data_ptr<float>(), part_ml.const_data_ptr<float>(), slots,
             num_splits, d.D, out.mutable_data_ptr<scalar_t>());
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(SPECDEC_CUDA_LIBRARY, SPECDEC_CUDA_KEY, m) {
  m.impl("tree_attention", &tree_attention);
}

}  // namespace specdec::cuda
