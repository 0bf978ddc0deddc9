// Compiles the CUDA sources (csrc/cuda) with the host compiler, for the CUDA simulation
// (docs/cuda_simulation.md): the qualifiers, the thread coordinates, __syncthreads, __syncwarp and
// the warp shuffles, mapped onto the block scheduler (wmma: cuda_sim/wmma.h). Included before anything else by each simulated
// translation unit (the build generates one per .cu file).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda_sim/block_scheduler.h"

#define __global__
#define __device__
#define __launch_bounds__(...)
// Static shared memory: one object per kernel (per template instance) and OS thread, which the
// blocks of a launch, run one after the other, share in turn.
#define __shared__ static thread_local

#define threadIdx (::specdec::sim::thread_idx())
#define blockIdx (::specdec::sim::block_idx())
#define blockDim (::specdec::sim::block_dim())
#define gridDim (::specdec::sim::grid_dim())

#define __syncthreads() ::specdec::sim::sync_threads(__FILE__, __LINE__)
#define __shfl_xor_sync(...) ::specdec::sim::shfl_xor(__FILE__, __LINE__, __VA_ARGS__)
#define __syncwarp(...) ::specdec::sim::sync_warp(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)

using cudaStream_t = struct specdec_sim_stream*;
