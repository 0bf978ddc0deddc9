// The harness of the simulation's self tests (self_test.cpp, self_test_wmma.cpp): kernels that
// break the CUDA execution model's rules on purpose, or show what a primitive does, run on a grid
// of kSelfTestBlocks blocks of kSelfTestThreads threads; each thread writes what it saw.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace specdec::sim {

constexpr unsigned kSelfTestBlocks = 3, kSelfTestThreads = 64;

// A case's kernel: thread t of block b writes out[b * kSelfTestThreads + t].
using SelfTestCase = std::function<void(int64_t* out)>;

// Runs the named case; returns out, int64 [blocks, threads], -2 where a thread wrote nothing.
at::Tensor run_self_test(const std::map<std::string, SelfTestCase>& cases, const std::string& name);

}  // namespace specdec::sim
