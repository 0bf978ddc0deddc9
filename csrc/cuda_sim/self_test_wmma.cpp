// The simulation's wmma (cuda_sim/wmma.h), __syncwarp and 16-byte vector loads, checked by
// tests/ops/test_cuda_sim.py: wmma_mma(a, b, c, b_col_major) multiplies through a warp's
// fragments; wmma_self_test(name) runs kernels that show the element mapping or break the rules
// (a 3 x 64-thread grid, self_test.h).
#include "cuda_sim/self_test.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cuda_sim/compat.h"
#include "cuda_sim/wmma.h"
// After compat.h: a CUDA source.
#include "cuda/vec.cuh"

namespace specdec::sim {
namespace {

namespace wmma = nvcuda::wmma;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Entry (r, c) of a 16 x 16 float matrix in shared memory is `value(r, c)`; every lane writes its
// share, then the warp synchronises.
template <class Value>
float* shared_matrix(Value value) {
  alignas(32) __shared__ float m[2][256];  // one per warp
  float* mine = m[threadIdx.x / 32];
  for (unsigned e = threadIdx.x % 32; e < 256; e += 32) mine[e] = value(e / 16, e % 16);
  __syncwarp();
  return mine;
}

void write(int64_t* out, int64_t x) { out[blockIdx.x * kSelfTestThreads + threadIdx.x] = x; }

// Which entry (r * 16 + c) lane's element 0 holds.
void wmma_positions(int64_t* out) {
  const float* m = shared_matrix([](unsigned r, unsigned c) { return 16.f * r + c; });
  Acc f;
  wmma::load_matrix_sync(f, m, 16, wmma::mem_row_major);
  write(out, static_cast<int64_t>(f.x[0]));
}

// The row-index fragment's use in tree_attention: every element of a ones fragment times its
// row + 1; each lane returns the sum of row lane % 16 as stored back.
void wmma_row_scale(int64_t* out) {
  float* m = shared_matrix([](unsigned r, unsigned) { return static_cast<float>(r); });
  Acc row, ones;
  wmma::load_matrix_sync(row, m, 16, wmma::mem_row_major);
  wmma::fill_fragment(ones, 1.f);
  for (int e = 0; e < Acc::num_elements; ++e) ones.x[e] *= row.x[e] + 1.f;
  __syncwarp();
  wmma::store_matrix_sync(m, ones, 16, wmma::mem_row_major);
  __syncwarp();
  float sum = 0.f;
  for (unsigned c = 0; c < 16; ++c) sum += m[threadIdx.x % 16 * 16 + c];
  write(out, static_cast<int64_t>(sum));
}

void wmma_half_warp(int64_t* out) {
  Acc f;
  if (threadIdx.x % 32 < 16) wmma::fill_fragment(f, 0.f);
  write(out, 1);
}

void wmma_lanes_disagree(int64_t* out) {
  const float* m = shared_matrix([](unsigned, unsigned) { return 0.f; });
  Acc f;
  wmma::load_matrix_sync(f, m + threadIdx.x % 2 * 8, 16, wmma::mem_row_major);
  write(out, 1);
}

void wmma_misaligned(int64_t* out) {
  const float* m = shared_matrix([](unsigned, unsigned) { return 0.f; });
  Acc f;
  wmma::load_matrix_sync(f, m + 4, 16, wmma::mem_row_major);
  write(out, 1);
}

void wmma_bad_ldm(int64_t* out) {
  const float* m = shared_matrix([](unsigned, unsigned) { return 0.f; });
  Acc f;
  wmma::load_matrix_sync(f, m, 6, wmma::mem_row_major);
  write(out, 1);
}

void wmma_fill_differs(int64_t* out) {
  Acc f;
  wmma::fill_fragment(f, static_cast<float>(threadIdx.x));
  write(out, 1);
}

void syncwarp_half(int64_t* out) {
  if (threadIdx.x % 32 < 16) __syncwarp();
  write(out, 1);
}

void misaligned_vector_load(int64_t* out) {
  const float* m = shared_matrix([](unsigned, unsigned) { return 0.f; });
  write(out, static_cast<int64_t>(specdec::cuda::load16(m + 1).v[0]));
}

at::Tensor wmma_self_test(const std::string& name) {
  static const std::map<std::string, SelfTestCase> cases{
      {"wmma_positions", wmma_positions},
      {"wmma_row_scale", wmma_row_scale},
      {"wmma_half_warp", wmma_half_warp},
      {"wmma_lanes_disagree", wmma_lanes_disagree},
      {"wmma_misaligned", wmma_misaligned},
      {"wmma_bad_ldm", wmma_bad_ldm},
      {"wmma_fill_differs", wmma_fill_differs},
      {"syncwarp_half", syncwarp_half},
      {"misaligned_vector_load", misaligned_vector_load},
  };
  return run_self_test(cases, name);
}

// D = A B + C through one warp's fragments; b_col_major: B is read from memory column-major.
template <class T>
void mma_warp(const T* a, const T* b, const float* c, bool b_col_major, float* d) {
  alignas(32) __shared__ T sa[256], sb[256];
  alignas(32) __shared__ float sc[256];
  for (unsigned e = threadIdx.x; e < 256; e += 32) {
    sa[e] = a[e];
    sb[e] = b_col_major ? b[e % 16 * 16 + e / 16] : b[e];
    sc[e] = c[e];
  }
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
  Acc acc;
  wmma::load_matrix_sync(fa, sa, 16);
  wmma::load_matrix_sync(acc, sc, 16, wmma::mem_row_major);
  if (b_col_major) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
    wmma::load_matrix_sync(fb, sb, 16);
    wmma::mma_sync(acc, fa, fb, acc);
  } else {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
    wmma::load_matrix_sync(fb, sb, 16);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(sc, acc, 16, wmma::mem_row_major);
  __syncwarp();
  for (unsigned e = threadIdx.x; e < 256; e += 32) d[e] = sc[e];
}

at::Tensor wmma_mma(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, bool b_col_major) {
  TORCH_CHECK_VALUE(a.sizes() == at::IntArrayRef({16, 16}) && b.sizes() == a.sizes() &&
                        c.sizes() == a.sizes() && b.scalar_type() == a.scalar_type() &&
                        c.scalar_type() == at::kFloat,
                    "wmma_mma: a, b half or bfloat16 [16, 16], c float [16, 16]");
  const at::Tensor ac = a.contiguous(), bc = b.contiguous(), cc = c.contiguous();
  at::Tensor d = at::empty({16, 16}, c.options());
  AT_DISPATCH_REDUCED_FLOATING_TYPES(a.scalar_type(), "wmma_mma", [&] {
    run_grid({1}, {32}, 0, [&] {
      mma_warp(ac.const_data_ptr<scalar_t>(), bc.const_data_ptr<scalar_t>(),
               cc.const_data_ptr<float>(), b_col_major, d.mutable_data_ptr<float>());
    });
  });
  return d;
}

}  // namespace
}  // namespace specdec::sim

TORCH_LIBRARY_FRAGMENT(specdec_cuda_sim, m) {
  m.def("wmma_self_test(str name) -> Tensor", &specdec::sim::wmma_self_test);
  m.def("wmma_mma(Tensor a, Tensor b, Tensor c, bool b_col_major) -> Tensor", &specdec::sim::wmma_mma);
}
