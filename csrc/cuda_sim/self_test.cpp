// Kernels that break the CUDA execution model's rules on purpose (barriers, shuffles, CUB's
// collectives), each run by the op specdec_cuda_sim::self_test(name) so that
// tests/ops/test_cuda_sim.py can check that the simulation catches what it claims to
// (docs/cuda_simulation.md). Each returns what its threads saw, as int64 [blocks, threads].
#include "cuda_sim/self_test.h"

#include <ATen/ops/full.h>
#include <torch/library.h>

#include <cmath>

#include "cuda_sim/collectives.h"
#include "cuda_sim/compat.h"

namespace specdec::sim {

at::Tensor run_self_test(const std::map<std::string, SelfTestCase>& cases, const std::string& name) {
  const auto it = cases.find(name);
  TORCH_CHECK_VALUE(it != cases.end(), "self_test: no case named '", name, "'");
  at::Tensor out = at::full({kSelfTestBlocks, kSelfTestThreads}, -2, at::kLong);
  int64_t* data = out.mutable_data_ptr<int64_t>();
  run_grid({kSelfTestBlocks}, {kSelfTestThreads}, 0, [&] { it->second(data); });
  return out;
}

namespace {

constexpr unsigned kThreads = kSelfTestThreads;

// Thread i writes its index, then reads its neighbour's, with or without a barrier between.
void neighbour_read(int64_t* out, bool barrier) {
  __shared__ int64_t slots[kThreads];
  const unsigned i = threadIdx.x;
  slots[i] = 1000 * blockIdx.x + i;
  if (barrier) __syncthreads();
  out[blockIdx.x * kThreads + i] = slots[(i + 1) % kThreads];
  __syncthreads();  // slots are reused by the next block's threads only after every read
}

void divergent_barrier(int64_t* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[blockIdx.x * kThreads + threadIdx.x] = 1;
}

void barriers_at_two_sites(int64_t* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[blockIdx.x * kThreads + threadIdx.x] = 1;
}

void warp_sum(int64_t* out) {
  int64_t x = threadIdx.x % 32;
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  out[blockIdx.x * kThreads + threadIdx.x] = x;
}

void half_warp_shuffle(int64_t* out) {
  int64_t x = threadIdx.x;
  if (threadIdx.x % 32 < 16) x = __shfl_xor_sync(0xffffffffu, x, 1);
  out[blockIdx.x * kThreads + threadIdx.x] = x;
}

void partial_mask_shuffle(int64_t* out) {
  const int64_t x = __shfl_xor_sync(0x0000ffffu, static_cast<int64_t>(threadIdx.x), 1);
  out[blockIdx.x * kThreads + threadIdx.x] = x;
}

// BlockReduce's sum: defined in thread 0 only; the others get NaN (written as -1).
void reduce_poison(int64_t* out) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ Reduce::TempStorage temp;
  const float total = Reduce(temp).Sum(static_cast<float>(threadIdx.x));
  out[blockIdx.x * kThreads + threadIdx.x] = std::isnan(total) ? -1 : static_cast<int64_t>(total);
}

// BlockScan's inclusive sums and total, every thread: prefix * 10000 + total.
void scan(int64_t* out) {
  using Scan = cub::BlockScan<float, kThreads>;
  __shared__ Scan::TempStorage temp;
  float inclusive, total;
  Scan(temp).InclusiveSum(1.f, inclusive, total);
  out[blockIdx.x * kThreads + threadIdx.x] = static_cast<int64_t>(inclusive) * 10000 +
                                             static_cast<int64_t>(total);
}

at::Tensor self_test(const std::string& name) {
  static const std::map<std::string, SelfTestCase> cases{
      {"neighbour_read_with_barrier", [](int64_t* o) { neighbour_read(o, true); }},
      {"neighbour_read_without_barrier", [](int64_t* o) { neighbour_read(o, false); }},
      {"divergent_barrier", divergent_barrier},
      {"barriers_at_two_sites", barriers_at_two_sites},
      {"warp_sum", warp_sum},
      {"half_warp_shuffle", half_warp_shuffle},
      {"partial_mask_shuffle", partial_mask_shuffle},
      {"reduce_poison", reduce_poison},
      {"scan", scan},
  };
  return run_self_test(cases, name);
}

}  // namespace
}  // namespace specdec::sim

TORCH_LIBRARY_FRAGMENT(specdec_cuda_sim, m) {
  m.def("self_test(str name) -> Tensor", &specdec::sim::self_test);
}
