// The simulation's asynchronous copies (cuda_sim/pipeline.h), checked by
// tests/ops/test_cuda_sim.py through async_self_test(name) (a 3 x 64-thread grid, self_test.h):
// thread i copies 16 bytes holding 1000 * (block + 1) + i into shared slot i, reads slot i + 1.
#include "cuda_sim/self_test.h"

#include <torch/library.h>

#include "cuda_sim/compat.h"
#include "cuda_sim/pipeline.h"

namespace specdec::sim {
namespace {

struct alignas(16) Slot {
  int64_t value, unused;
};

// The source ("global memory") of thread i's copy, filled by thread i.
Slot* source() {
  thread_local Slot src[kSelfTestThreads];
  const unsigned i = threadIdx.x;
  src[i] = {1000 * (static_cast<int64_t>(blockIdx.x) + 1) + i, 0};
  return &src[i];
}

template <bool wait>
void neighbour_after_copy(int64_t* out) {
  __shared__ Slot slots[kSelfTestThreads];
  const unsigned i = threadIdx.x;
  __pipeline_memcpy_async(&slots[i], source(), 16);
  __pipeline_commit();
  if constexpr (wait) __pipeline_wait_prior(0);
  __syncthreads();
  out[blockIdx.x * kSelfTestThreads + i] = slots[(i + 1) % kSelfTestThreads].value;
  __pipeline_wait_prior(0);  // the next block's copies land after every read
  __syncthreads();
}

// Two groups, then a wait for all but the newest: 10 * (first landed) + (second landed).
void wait_prior_one(int64_t* out) {
  __shared__ Slot first[kSelfTestThreads], second[kSelfTestThreads];
  const unsigned i = threadIdx.x;
  first[i] = second[i] = {-1, 0};
  const Slot* src = source();
  __pipeline_memcpy_async(&first[i], src, 16);
  __pipeline_commit();
  __pipeline_memcpy_async(&second[i], src, 16);
  __pipeline_commit();
  __pipeline_wait_prior(1);
  out[blockIdx.x * kSelfTestThreads + i] = 10 * (first[i].value == src->value) +
                                           (second[i].value == src->value);
  __pipeline_wait_prior(0);
}

void misaligned_copy(int64_t* out) {
  __shared__ Slot slots[kSelfTestThreads + 1];
  __pipeline_memcpy_async(reinterpret_cast<char*>(&slots[threadIdx.x]) + 8, source(), 16);
  out[blockIdx.x * kSelfTestThreads + threadIdx.x] = 1;
}

at::Tensor async_self_test(const std::string& name) {
  static const std::map<std::string, SelfTestCase> cases{
      {"copy_waited", neighbour_after_copy<true>},
      {"copy_not_waited", neighbour_after_copy<false>},
      {"wait_prior_one", wait_prior_one},
      {"misaligned_copy", misaligned_copy},
  };
  return run_self_test(cases, name);
}

}  // namespace
}  // namespace specdec::sim

TORCH_LIBRARY_FRAGMENT(specdec_cuda_sim, m) {
  m.def("async_self_test(str name) -> Tensor", &specdec::sim::async_self_test);
}
