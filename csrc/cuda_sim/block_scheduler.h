// The CUDA execution model on the host, for the CUDA simulation (docs/cuda_simulation.md).
//
// A launch runs its blocks one after the other on the calling OS thread; a block's threads are
// fibers (fiber.h). A thread runs until it reaches a barrier (__syncthreads), a warp shuffle or
// its end; a barrier phase ends when every thread is waiting, and the next phase starts. The
// scheduler runs a phase's threads in forward, reverse or random order (by phase and block), so
// that a read of another thread's write without a barrier in between sees a stale value in some
// order. Everything a GPU leaves undefined and the simulation can see fails the launch with a
// c10::Error naming the block, the threads and the source lines: a barrier that not every thread
// of the block reaches (some exited or wait at another __syncthreads), a shuffle whose mask is not
// the full warp or that not all 32 lanes of a warp reach.
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
// A butterfly shuffle at file:line: every lane of the warp gives `bits` and reads those of the
// lane whose index is its own xor lane_xor.
uint64_t warp_exchange(unsigned mask, uint64_t bits, unsigned lane_xor, const char* file, int line);
// Stops the simulated block with an error (raised by the launch).
[[noreturn]] void fail(const std::string& what);

template <class T>
T shfl_xor(const char* file, int line, unsigned mask, T value, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  if (width != 32)
    fail("__shfl_xor_sync with width " + std::to_string(width) + " (only 32 is simulated)");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = warp_exchange(mask, bits, static_cast<unsigned>(lane_mask), file, line);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

// Runs body on every thread of every block of the grid; raises the first failure.
void run_grid(Dim3 grid, Dim3 block, size_t dynamic_smem, const std::function<void()>& body);

// What the simulated device reports as its number of streaming multiprocessors (default 132, an
// H100/H200 SXM; 108 is an A100).
int sm_count();
int64_t set_sm_count(int64_t n);  // returns the previous value

}  // namespace specdec::sim
