// CUDA's pipeline primitives (cuda_pipeline.h: cp.async on sm_80 and later) for the CUDA
// simulation: each thread's copies are deferred until a __pipeline_wait_prior covers their group
// (block_scheduler.h), so a kernel that reads shared memory before waiting, or before the barrier
// after the wait, reads stale bytes.
#pragma once

#include <cstddef>

#include "cuda_sim/block_scheduler.h"

inline void __pipeline_memcpy_async(void* dst_shared, const void* src_global, size_t size_and_align,
                                    size_t zfill = 0) {
  specdec::sim::async_copy(dst_shared, src_global, size_and_align, zfill);
}
inline void __pipeline_commit() { specdec::sim::async_commit(); }
inline void __pipeline_wait_prior(size_t prior) { specdec::sim::async_wait_prior(prior); }
