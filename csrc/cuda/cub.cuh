// CUB's block collectives, or under the CUDA simulation its own (cuda_sim/collectives.h).
#pragma once

#if defined(SPECDEC_CUDA_SIM)
#include "cuda_sim/collectives.h"
#else
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#endif
