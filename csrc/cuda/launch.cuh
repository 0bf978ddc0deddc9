// What every CUDA launcher of specdec shares: block sizes, the device scope (guard, current
// stream, SM count) and the launch helper, which checks a launch against the limits of a GPU
// before making it. Kernels register with
//   TORCH_LIBRARY_IMPL(SPECDEC_CUDA_LIBRARY, SPECDEC_CUDA_KEY, m)
// which is the CUDA key of the specdec library, or, in the CUDA simulation
// (docs/cuda_simulation.md), the CPU key of the specdec_cuda_sim library.
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>

#if defined(SPECDEC_CUDA_SIM)
#include "cuda_sim/runtime.h"
#else
#include "cuda/runtime.cuh"
#endif

namespace specdec::cuda {

// Threads per block of the per-row kernels that pass over a vocabulary.
constexpr int kRowBlock = 512;
// Threads per block of the kernels that run one thread per row.
constexpr int kThreadsPerRowBlock = 128;

// Limits of every CUDA GPU since compute capability 3.0. Shared memory: what a kernel gets
// without opting in to more (cudaFuncSetAttribute), which no kernel here does.
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxGridYZ = 65535;
constexpr int kMaxBlockThreads = 1024;
constexpr int64_t kMaxSharedBytes = 48 * 1024;

inline int64_t blocks_for(int64_t n, int64_t per_block) { return (n + per_block - 1) / per_block; }

struct Grid {
  int64_t x, y = 1, z = 1;
};

// Launches kernel<<<grid, threads, dynamic_smem, the scope's stream>>>(args...) for the op `op`.
// A grid beyond the limits raises a ValueError naming the op (inputs too large for one launch);
// a block size or shared-memory size beyond them is a bug of the launcher.
template <class... P, class... A>
void launch(const char* op, void (*kernel)(P...), Grid grid, int threads, size_t dynamic_smem,
            const DeviceScope& device, A... args) {
  TORCH_CHECK_VALUE(grid.x >= 1 && grid.x <= kMaxGridX && grid.y >= 1 && grid.y <= kMaxGridYZ &&
                        grid.z >= 1 && grid.z <= kMaxGridYZ,
                    "specdec.", op, ": the inputs need a grid of (", grid.x, ", ", grid.y, ", ",
                    grid.z, ") blocks, beyond what one CUDA launch takes (2^31 - 1, 65535, 65535)");
  TORCH_CHECK(threads >= 1 && threads <= kMaxBlockThreads &&
                  dynamic_smem <= static_cast<size_t>(kMaxSharedBytes),
              "specdec.", op, ": a launch of ", threads, " threads with ", dynamic_smem,
              " bytes of shared memory per block exceeds a CUDA block's limits");
  launch_kernel(kernel, grid.x, grid.y, grid.z, threads, dynamic_smem, device, args...);
}

}  // namespace specdec::cuda
