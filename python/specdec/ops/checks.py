"""Argument checks shared by the fake kernels (the checks of csrc/op_args.cpp that read no
data), and the output-size helper of the wrappers."""

from __future__ import annotations

import torch
from torch import Tensor


def size_or_one(t: Tensor, dim: int) -> int:
    # Output shapes come from the inputs; when an input has the wrong rank the op itself reports
    # it (naming the argument), so any placeholder size will do here.
    return t.shape[dim] if t.dim() > dim else 1


# ---- fake kernels ------------------------------------------------------------------------------
# The ops only write their out-arguments, so the fake kernels compute nothing; they make the
# checks of csrc/op_args.cpp that read no data, raising the same error types naming the same
# arguments, so that torch.compile reports a wrong shape, dtype or device while tracing. Sizes
# may be symbolic: every comparison goes to torch._check_* as it is, never through bool().

INDEX_DTYPES = (torch.int64, torch.int32)


def fail_unless(cond, op: str, message, error=torch._check_value) -> None:
    error(cond, lambda: f"specdec.{op}: {message() if callable(message) else message}")


def shape_str(shape) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_index(t: Tensor, op: str, name: str, dim: int) -> None:
    fail_unless(t.dtype in INDEX_DTYPES, op,
                 lambda: f"{name} must be int64 or int32, got {t.dtype}", torch._check_type)
    fail_unless(t.dim() == dim, op,
                 lambda: f"{name} must have {dim} dimensions, got shape {list(t.shape)}")


def check_index_like(t: Tensor, ref: Tensor, op: str, name: str, ref_name: str, shape) -> None:
    """An index tensor of ``shape`` with ``ref``'s dtype and device."""
    check_index(t, op, name, len(shape))
    check_shape(t, op, name, shape)
    check_same_dtype(t, ref, op, name, ref_name)
    check_device(t, ref, op, name)


# The floating dtypes the kernels dispatch on (not the float8 types).
COMPUTE_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_probs(t: Tensor, op: str, name: str, dim: int) -> None:
    fail_unless(t.dtype in COMPUTE_FLOATS, op,
                 lambda: f"{name} must be float32, float16, bfloat16 or float64, got {t.dtype}",
                 torch._check_type)
    fail_unless(t.dim() == dim, op,
                 lambda: f"{name} must have {dim} dimensions, got shape {list(t.shape)}")


def check_cache(t: Tensor, op: str, name: str, dim: int) -> None:
    """A KV cache, whose entries are only copied: any floating dtype (float8 too)."""
    fail_unless(t.is_floating_point(), op, lambda: f"{name} must be a floating tensor, got {t.dtype}",
                torch._check_type)
    fail_unless(t.dim() == dim, op,
                 lambda: f"{name} must have {dim} dimensions, got shape {list(t.shape)}")


def check_shape(t: Tensor, op: str, name: str, shape, *, output: bool = False) -> None:
    """``shape``: a None entry matches any size (any size >= 1 for an output)."""
    label = f"output {name}" if output else name

    def message() -> str:
        return f"{label} must have shape {shape_str(shape)}, got {list(t.shape)}"

    fail_unless(t.dim() == len(shape), op, message)
    for size, want in zip(t.shape, shape):
        if want is not None:
            fail_unless(size == want, op, message)
        elif output:
            fail_unless(size >= 1, op, message)


def check_same_dtype(t: Tensor, ref: Tensor, op: str, name: str, ref_name: str) -> None:
    fail_unless(t.dtype == ref.dtype, op,
                 lambda: f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}",
                 torch._check_type)


def check_device(t: Tensor, ref: Tensor, op: str, name: str) -> None:
    fail_unless(t.device == ref.device, op,
                 lambda: f"{name} is on {t.device} but the other arguments are on {ref.device}")


def check_uniform(t: Tensor, op: str, shape) -> None:
    fail_unless(t.dtype == torch.float32, op,
                 lambda: f"uniform must be float32, got {t.dtype}", torch._check_type)
    check_shape(t, op, "uniform", shape)


def check_out(out: Tensor, ref: Tensor, op: str, name: str, shape, dtype: torch.dtype) -> None:
    check_device(out, ref, op, name)
    fail_unless(out.dtype == dtype, op,
                 lambda: f"output {name} must be {dtype}, got {out.dtype}", torch._check_type)
    check_shape(out, op, name, shape, output=True)
    fail_unless(out.is_contiguous(), op, f"output {name} must be contiguous")


def check_target(target: Tensor, ids: Tensor, op: str, B, N) -> None:
    """A greedy op's target: token ids [B, N] (ids' dtype) or logits [B, N, V]."""
    check_device(target, ids, op, "target")
    if target.is_floating_point():
        fail_unless(target.dtype in COMPUTE_FLOATS, op,
                     lambda: "target logits must be float32, float16, bfloat16 or float64, "
                     f"got {target.dtype}", torch._check_type)
        check_shape(target, op, "target", (B, N, None))
        fail_unless(target.shape[2] >= 1, op, "target logits have an empty vocabulary")
        return
    check_index(target, op, "target", 2)
    check_same_dtype(target, ids, op, "target", "the draft token ids")
    check_shape(target, op, "target", (B, N))


def check_tree_outputs(op, tree_tokens, parents, accept_path, accept_len, next_token):
    check_index(tree_tokens, op, "tree_tokens", 2)
    B, T = tree_tokens.shape
    fail_unless(T >= 1, op, "tree_tokens needs at least the root node")
    check_index_like(parents, tree_tokens, op, "parents", "tree_tokens", (B, T))
    check_out(accept_path, tree_tokens, op, "accept_path", (B, None), tree_tokens.dtype)
    check_out(accept_len, tree_tokens, op, "accept_len", (B,), tree_tokens.dtype)
    check_out(next_token, tree_tokens, op, "next_token", (B,), tree_tokens.dtype)
    return B, T



def check_pool_tables(op: str, head: Tensor, entries: Tensor):
    check_index(head, op, "head", 2)
    B, V = head.shape
    fail_unless(V >= 1, op, "head must have one entry per token (V >= 1)")
    check_index_like(entries, head, op, "entries", "head", (B, None, None))
    C, N = entries.shape[1], entries.shape[2] - 1

    def message() -> str:
        return ("entries must have shape [B, C, N + 1] with C >= 1 slots and n-grams of N >= 2 "
                f"tokens, got {list(entries.shape)}")

    fail_unless(C >= 1, op, message)
    fail_unless(N >= 2, op, message)
    for t in (head, entries):
        fail_unless(t.is_contiguous(), op, "head and entries must be contiguous")
    return B, N
