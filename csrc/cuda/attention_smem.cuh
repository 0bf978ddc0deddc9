// tree_attention's shared memory (cuda/attention.cu): the tiles a block stages, their layout and
// sizes, and the staging loads.
//
// Tiles hold the inputs' own type for half and bfloat16 (tensor cores take them) and float
// otherwise, row-major, head dimensions padded with zeros to a multiple of 16 (dp) and rows 16
// bytes longer than that (ld), so that wmma's 32-byte aligned pointers fall on every 16-row,
// 16-column corner and the rows' banks are spread. A block of W warps holds: the query tile
// [16 W, ld], one key and one value tile [keys, ld], and per warp a score tile [16, score_ld]
// (fp32), a probability tile [16, keys + pad] and the rows' rescaling factors [16].
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/common.h"
#include "cuda/launch.cuh"
#include "cuda/vec.cuh"

#if defined(SPECDEC_CUDA_SIM)
#include "cuda_sim/pipeline.h"
#else
#include <cuda_pipeline.h>
#endif

namespace specdec::cuda {

constexpr int kWarpRows = 16;  // query rows per warp (wmma's M)

template <class scalar_t>
using TileElem = std::conditional_t<sizeof(scalar_t) == 2, scalar_t, float>;

// The base of the dynamic shared memory, aligned for every tile.
struct alignas(128) SharedBase {
  unsigned char bytes[128];
};

template <class Elem>
struct AttnSmem {
  static constexpr int64_t kPad = 16 / sizeof(Elem);
  SPECDEC_HD static constexpr int64_t ld(int64_t dp) { return dp + kPad; }
  SPECDEC_HD static constexpr int64_t score_ld(int64_t keys) { return keys > 16 ? keys : 16; }
  SPECDEC_HD static constexpr int64_t prob_ld(int64_t keys) { return keys + kPad; }
  SPECDEC_HD static constexpr int64_t bytes(int64_t warps, int64_t keys, int64_t dp) {
    const int64_t rows = warps * kWarpRows;
    return static_cast<int64_t>(sizeof(float)) * rows * (score_ld(keys) + 1) +
           static_cast<int64_t>(sizeof(Elem)) * ((rows + 2 * keys) * ld(dp) + rows * prob_ld(keys));
  }

  // Scores first (fp32, then the 2-byte tiles): every region starts 32-byte aligned.
  __device__ AttnSmem(SharedBase* base, int64_t warps, int64_t keys, int64_t dp) {
    const int64_t rows = warps * kWarpRows;
    scores = reinterpret_cast<float*>(base);
    q = reinterpret_cast<Elem*>(scores + rows * score_ld(keys));
    k = q + rows * ld(dp);
    v = k + keys * ld(dp);
    probs = v + keys * ld(dp);
    alpha = reinterpret_cast<float*>(probs + rows * prob_ld(keys));
  }
  float* scores;
  Elem *q, *k, *v, *probs;
  float* alpha;
};

// Keys per tile and most warps per block: the most warps (4, 2, 1), then the longest key tile
// (32, 16, and 8 below tensor cores' 16) whose shared memory fits a block at the bucket's widest
// head (16 nf), for any number of query rows. Chosen by the element type and head size only, so
// a query's rounding (its online softmax's steps) does not depend on the rows sharing its block.
struct AttnConfig {
  int warps, keys;
};
template <class Elem>
constexpr AttnConfig attn_config(int nf) {
  const int min_keys = sizeof(Elem) == 2 ? 16 : 8;
  for (int w = 4; w >= 1; w /= 2)
    for (int keys = 32; keys >= min_keys; keys /= 2)
      if (AttnSmem<Elem>::bytes(w, keys, 16 * nf) <= kMaxSharedBytes) return {w, keys};
  return {0, 0};
}

// Copies `rows` rows of D elements into a tile [rows, ld] with zeros up to dp, converting to
// Elem: row(r) gives row r's first element, or nullptr for a row of zeros. 16 bytes at a time
// where the rows allow (vec: every row start 16-byte aligned): asynchronous copies (cp.async on
// sm_80 and later, no registers held, every copy of the tile in flight at once) where no
// conversion is needed, so the caller must __pipeline_commit and __pipeline_wait_prior(0) before
// the barrier after which the tile is read; 16-byte loads converted element by element otherwise.
template <class Elem, class scalar_t, class Row>
__device__ void stage_rows(Elem* tile, int64_t ld, int64_t rows, int64_t dp, int64_t D, bool vec,
                           Row row) {
  constexpr int V = Vec16<scalar_t>::kSize;
  const int64_t per_row = dp / V;
  for (int64_t x = threadIdx.x; x < rows * per_row; x += blockDim.x) {
    const int64_t r = x / per_row, d0 = x % per_row * V;
    const scalar_t* src = row(r);
    Elem* dst = tile + r * ld + d0;
    if (src != nullptr && vec && d0 + V <= D) {
      if constexpr (std::is_same_v<Elem, scalar_t>) {
        __pipeline_memcpy_async(dst, src + d0, 16);
      } else {
        const Vec16<scalar_t> w = load16(src + d0);
        for (int e = 0; e < V; ++e) dst[e] = static_cast<Elem>(w.v[e]);
      }
    } else {
      for (int e = 0; e < V; ++e)
        dst[e] = src != nullptr && d0 + e < D ? static_cast<Elem>(src[d0 + e]) : Elem(0.f);
    }
  }
}

}  // namespace specdec::cuda
