// CPU launcher of linear (the kernel: cpu/linear_kernel.h). A CPU-only op: it is what
// specdec.pack_linear_layers prepares CPU models with; on GPUs the engines' own GEMMs serve
// targets (docs/verification.md).
#include <torch/library.h>

#include "cpu/linear_args.h"
#include "cpu/isa.h"
#include "op_args.h"

namespace specdec::cpu {
namespace {

void check_dim(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK_VALUE(t.dim() == dim, "specdec.linear: ", name, " must have ", dim,
                    " dimensions, got shape ", t.sizes());
}

void linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
            const at::Tensor& out) {
  const char* op = "linear";
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
                   "specdec.linear: x must be float32 or bfloat16, got ", x.scalar_type());
  check_dim(x, "x", 2);
  check_same_dtype(weight, x, op, "weight", "x");
  check_dim(weight, "weight", 2);
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  check_shape(weight, op, "weight", {N, K});
  check_device(weight, x, op, "weight");
  TORCH_CHECK_VALUE(weight.is_contiguous(), "specdec.linear: weight must be contiguous");
  if (bias) {
    check_same_dtype(*bias, x, op, "bias", "x");
    check_dim(*bias, "bias", 1);
    check_shape(*bias, op, "bias", {N});
    check_device(*bias, x, op, "bias");
  }
  check_out(out, x, op, "out", {M, N}, x.scalar_type());
  if (M == 0 || N == 0) return;
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  const at::Tensor bc = bias ? bias->contiguous() : at::Tensor();
  LinearArgs a{};
  a.x = xc.const_data_ptr();
  a.w = weight.const_data_ptr();
  a.bias = bc.defined() ? bc.const_data_ptr() : nullptr;
  a.y = out.mutable_data_ptr();
  a.M = M, a.N = N, a.K = K, a.ldx = xc.stride(0), a.ldy = N;
  a.dtype = x.scalar_type();
  if (cpu_has_avx512bf16())
    avx512bf16::linear(a);
  else if (cpu_has_avx512())
    avx512::linear(a);
  else if (cpu_has_avx2())
    avx2::linear(a);
  else
    base::linear(a);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("linear", &linear); }

}  // namespace specdec::cpu
