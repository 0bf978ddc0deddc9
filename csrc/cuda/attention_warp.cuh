// What a warp of tree_attention's kernel (cuda/attention.cu) computes for its 16 query rows from
// the block's shared tiles (cuda/attention_smem.cuh): the scores of a key tile, S = Q K^T, into
// its score tile; its output accumulator O (16 x dp, fp32, in registers) rescaled by the rows'
// factors and advanced by O += P V from its probability tile; and O's 16-column slices, one at a
// time, into a 16 x 16 fp32 scratch tile. Two ways with one interface:
//  - WmmaTile: tensor cores (16x16x16 half/bfloat16 products, fp32 accumulation). Which element
//    of a fragment a lane holds is unspecified, so per-row work goes through shared memory, and
//    the rescaling reads each accumulator element's row from a fragment of row indices (loaded
//    once; element-wise operations between fragments of one kind are what CUDA allows).
//  - SimtTile: plain fp32 arithmetic (float and double inputs, and GPUs without bfloat16 wmma).
//    Lane l holds row l / 2, columns 8 (l % 2) .. 8 (l % 2) + 7 of each 16-column slice.
// nf <= NF is the number of 16-column slices of the head (dp = 16 nf); KEYS keys per tile.
#pragma once

#include <cstdint>

#include "cuda/attention_smem.cuh"
#include "cuda/mma.cuh"

namespace specdec::cuda {

template <class Elem, int NF, int KEYS>
struct SimtTile {
  float o[NF][8];
  int r, h;  // this lane's row and half-slice

  __device__ explicit SimtTile(float*) : r(threadIdx.x % 32 / 2), h(threadIdx.x % 2) {
    for (auto& slice : o)
      for (float& x : slice) x = 0.f;
  }

  // Lane (r, h) computes row r's scores of keys h, h + 2, ..
  __device__ void scores(const Elem* q, const Elem* k, int64_t ld, int nf, float* s,
                         int64_t s_ld) const {
    for (int c = h; c < KEYS; c += 2) {
      float dot = 0.f;
      for (int64_t d = 0; d < 16 * nf; ++d)
        dot += static_cast<float>(q[r * ld + d]) * static_cast<float>(k[c * ld + d]);
      s[r * s_ld + c] = dot;
    }
  }

  __device__ void rescale(const float* alpha, int nf) {
#pragma unroll
    for (int f = 0; f < NF; ++f)
      if (f < nf)
        for (float& x : o[f]) x *= alpha[r];
  }

  __device__ void accumulate(const Elem* p, int64_t p_ld, const Elem* v, int64_t ld, int nf) {
    for (int c = 0; c < KEYS; ++c) {
      const float w = static_cast<float>(p[r * p_ld + c]);
#pragma unroll
      for (int f = 0; f < NF; ++f)
        if (f < nf)
          for (int e = 0; e < 8; ++e) o[f][e] += w * static_cast<float>(v[c * ld + 16 * f + 8 * h + e]);
    }
  }

  __device__ void store(int f, float* tile) const {
    for (int e = 0; e < 8; ++e) tile[r * 16 + 8 * h + e] = o[f][e];
  }
};

#if SPECDEC_WMMA
template <class Elem, int NF, int KEYS>
struct WmmaTile {
  using T = typename WmmaType<Elem>::type;
  using Acc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
  using RowMajor = nvcuda::wmma::row_major;
  template <class Use, class Layout>
  using Frag = nvcuda::wmma::fragment<Use, 16, 16, 16, T, Layout>;
  static_assert(KEYS % 16 == 0, "tensor cores take keys 16 at a time");

  Acc o[NF];
  Acc row;  // each element's row index

  // scratch: the warp's 16 x 16 fp32 scratch tile, which the row indices pass through.
  __device__ explicit WmmaTile(float* scratch) {
    for (int e = threadIdx.x % 32; e < 256; e += 32) scratch[e] = static_cast<float>(e / 16);
    __syncwarp();
    nvcuda::wmma::load_matrix_sync(row, scratch, 16, nvcuda::wmma::mem_row_major);
#pragma unroll
    for (int f = 0; f < NF; ++f) nvcuda::wmma::fill_fragment(o[f], 0.f);
  }

  __device__ void scores(const Elem* q, const Elem* k, int64_t ld, int nf, float* s,
                         int64_t s_ld) const {
    Acc acc[KEYS / 16];
#pragma unroll
    for (int n = 0; n < KEYS / 16; ++n) nvcuda::wmma::fill_fragment(acc[n], 0.f);
#pragma unroll
    for (int f = 0; f < NF; ++f) {
      if (f >= nf) break;
      Frag<nvcuda::wmma::matrix_a, RowMajor> a;
      nvcuda::wmma::load_matrix_sync(a, reinterpret_cast<const T*>(q + 16 * f), ld);
#pragma unroll
      for (int n = 0; n < KEYS / 16; ++n) {
        // K^T's 16 x 16 block (d, key) is K's block read column-major.
        Frag<nvcuda::wmma::matrix_b, nvcuda::wmma::col_major> b;
        nvcuda::wmma::load_matrix_sync(b, reinterpret_cast<const T*>(k + 16 * n * ld + 16 * f), ld);
        nvcuda::wmma::mma_sync(acc[n], a, b, acc[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < KEYS / 16; ++n)
      nvcuda::wmma::store_matrix_sync(s + 16 * n, acc[n], s_ld, nvcuda::wmma::mem_row_major);
  }

  __device__ void rescale(const float* alpha, int nf) {
#pragma unroll
    for (int f = 0; f < NF; ++f)
      if (f < nf)
        for (int e = 0; e < Acc::num_elements; ++e) o[f].x[e] *= alpha[static_cast<int>(row.x[e])];
  }

  __device__ void accumulate(const Elem* p, int64_t p_ld, const Elem* v, int64_t ld, int nf) {
#pragma unroll
    for (int c = 0; c < KEYS / 16; ++c) {
      Frag<nvcuda::wmma::matrix_a, RowMajor> a;
      nvcuda::wmma::load_matrix_sync(a, reinterpret_cast<const T*>(p + 16 * c), p_ld);
#pragma unroll
      for (int f = 0; f < NF; ++f) {
        if (f >= nf) break;
        Frag<nvcuda::wmma::matrix_b, RowMajor> b;
        nvcuda::wmma::load_matrix_sync(b, reinterpret_cast<const T*>(v + 16 * c * ld + 16 * f), ld);
        nvcuda::wmma::mma_sync(o[f], a, b, o[f]);
      }
    }
  }

  __device__ void store(int f, float* tile) const {
    nvcuda::wmma::store_matrix_sync(tile, o[f], 16, nvcuda::wmma::mem_row_major);
  }
};
#endif

// The warp tile for a block's element type: tensor cores for half and bfloat16 where the code is
// compiled for them.
#if SPECDEC_WMMA
template <class Elem, int NF, int KEYS>
using WarpTile = std::conditional_t<sizeof(Elem) == 2, WmmaTile<Elem, NF, KEYS>, SimtTile<Elem, NF, KEYS>>;
#else
template <class Elem, int NF, int KEYS>
using WarpTile = SimtTile<Elem, NF, KEYS>;
#endif

}  // namespace specdec::cuda
