// The CUDA execution model on the host, for the CUDA simulation (docs/cuda_simulation.md).
//
// A launch runs its blocks one after the other on the calling OS thread; a block's threads are
// fibers (fiber.h). A thread runs until it reaches a barrier (__syncthreads), a warp shuffle or
// its end; a barrier phase ends when every thread is waiting, and the next phase starts. The
// scheduler runs a phase's threads in forward, reverse or random order (by phase and block), so
// that a read of another thread's write without a barrier in between sees a stale value in some
// order. Everything a GPU leaves undefined and the simulation can see fails the launch with a
// c10::Error naming the block, the threads and the source lines: a barrier that not every thread
// of the block reaches (some exited or wait at another __syncthreads), a warp collective (shuffle,
// __syncwarp, wmma operation) whose mask is not the full warp or that not all 32 lanes of a warp
// reach, and what a collective finds wrong with its lanes' arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

namespace specdec::sim {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  unsigned count() const { return x * y * z; }
};

// Coordinates of the running simulated thread (valid inside a kernel only).
const Dim3& thread_idx();
const Dim3& block_idx();
const Dim3& block_dim();
const Dim3& grid_dim();
// The block's dynamic shared memory (the launch's size, filled with 0xff bytes at block start).
void* dynamic_shared_bytes();
template <class T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_bytes());
}

// __syncthreads() at file:line.
void sync_threads(const char* file, int line);
// Completes a warp collective, given its 32 lanes' arguments in lane order; returns what is wrong
// with them (empty when nothing is).
using WarpComplete = std::string (*)(void* const* lanes);
// A warp-collective operation `what` at file:line: the calling lane parks with `arg`; once all 32
// lanes of its warp wait at the same site for the same operation, `complete` runs once on their
// arguments, and they go on.
void warp_collective(const char* what, const char* file, int line, void* arg,
                     WarpComplete complete);
// Fails unless mask is the full warp (the only one simulated).
void check_full_mask(unsigned mask, const char* what, const char* file, int line);
// __syncwarp(mask) at file:line.
void sync_warp(const char* file, int line, unsigned mask = 0xffffffffu);
// Asynchronous global-to-shared copies (cp.async, cuda_sim/pipeline.h): a copy of `bytes` (4, 8
// or 16, both addresses aligned to it) happens only when a wait covers its group, so a read before
// the wait (or by another thread before wait and barrier) sees the old bytes.
void async_copy(void* dst, const void* src, size_t bytes, size_t zfill);
// Closes the calling thread's current group of copies.
void async_commit();
// Completes the calling thread's copies in every committed group but the `prior` newest.
void async_wait_prior(size_t prior);
// Stops the simulated block with an error (raised by the launch).
[[noreturn]] void fail(const std::string& what);
// Fails unless p is `bytes`-aligned; `what` names the access.
void check_aligned(const void* p, size_t bytes, const std::string& what);

// A butterfly shuffle at file:line: every lane gives `value` and reads that of the lane whose
// index is its own xor lane_mask.
template <class T>
T shfl_xor(const char* file, int line, unsigned mask, T value, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (width != 32)
    fail("__shfl_xor_sync with width " + std::to_string(width) + " (only 32 is simulated)");
  check_full_mask(mask, "a warp shuffle", file, line);
  struct Lane {
    T value, result;
    unsigned lane_xor;
  } lane{value, value, static_cast<unsigned>(lane_mask)};
  warp_collective("a warp shuffle", file, line, &lane, [](void* const* lanes) {
    for (unsigned i = 0; i < 32; ++i) {
      auto* me = static_cast<Lane*>(lanes[i]);
      me->result = static_cast<Lane*>(lanes[(i ^ me->lane_xor) % 32])->value;
    }
    return std::string();
  });
  return lane.result;
}

// Runs body on every thread of every block of the grid; raises the first failure.
void run_grid(Dim3 grid, Dim3 block, size_t dynamic_smem, const std::function<void()>& body);

// What the simulated device reports as its number of streaming multiprocessors (default 132, an
// H100/H200 SXM; 108 is an A100).
int sm_count();
int64_t set_sm_count(int64_t n);  // returns the previous value

}  // namespace specdec::sim
