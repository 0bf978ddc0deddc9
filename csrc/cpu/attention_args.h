// What the CPU tree-attention kernel needs, gathered by the launcher (cpu/attention.cpp) after
// the shared argument checks.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace specdec::cpu {

struct AttentionArgs {
  const void* q;               // [B, H, T, D], contiguous
  const void* k;               // [B, Hkv, S, D], strides below, last dim contiguous
  const void* v;
  void* out;                   // [B, H, T, D], contiguous
  const int64_t* prefix_len;   // [B]
  const bool* mask;            // [B, T, T] contiguous, or nullptr: causal
  int64_t B, H, Hkv, T, D, S;
  int64_t k_sb, k_sh, k_ss, v_sb, v_sh, v_ss;
  float scale;
  c10::ScalarType dtype;
};

// One instantiation per instruction set (see cpu/attention_kernel.h).
namespace base {
void tree_attention(const AttentionArgs& a);
}
namespace avx2 {
void tree_attention(const AttentionArgs& a);
}

}  // namespace specdec::cpu
