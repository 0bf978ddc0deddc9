"""Shared pieces of the op tests: seeded random inputs (built on CPU) and comparisons."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from . import cuda_sim

# Every op test runs on each device present: CPU here, CUDA too wherever a GPU exists, and the
# simulated GPU where tools/cuda_sim.sh gives its library (support/cuda_sim.py).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
if cuda_sim.load():
    DEVICES.append(pytest.param(cuda_sim.SimDevice(), id="cuda_sim"))


def random_probs(*shape: int, gen: torch.Generator, sparsity: float = 0.3) -> torch.Tensor:
    """Peaked distributions over the last dim with some exact zeros (never an all-zero row)."""
    logits = torch.randn(*shape, generator=gen) * 3.0
    zero = torch.rand(*shape, generator=gen) < sparsity
    zero[..., 0] = False
    probs = torch.softmax(logits.masked_fill(zero, float("-inf")), -1)
    return probs


def random_parents(T: int, gen: torch.Generator) -> list[int]:
    """A random tree of T nodes: node i's parent drawn from 0..i-1, biased to recent nodes."""
    parents = [-1]
    for i in range(1, T):
        lo = max(0, i - 4) if torch.rand(1, generator=gen).item() < 0.6 else 0
        parents.append(int(torch.randint(lo, i, (1,), generator=gen)))
    return parents


def drafts_from(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per distribution, sampled from it (so drafts are often accepted)."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).reshape(probs.shape[:-1])


def assert_draws_match(got: torch.Tensor, want: torch.Tensor, device: str) -> None:
    """Tokens drawn by an op vs the reference's draws: identical on CPU. The CUDA kernels sum a
    draw's weights in float32 blocks rather than in float64 in index order, so a draw can land on
    the neighbouring token when u * total falls within rounding of a cumulative boundary: there
    at most 1% of the rows (and at least one) may differ."""
    got = got.cpu()
    assert got.shape == want.shape and got.dtype == want.dtype
    if device == "cpu":
        assert torch.equal(got, want)
    else:
        assert int((got != want).sum()) <= max(1, got.numel() // 100)


def assert_all_raise(cases) -> None:
    """Each (description, call, match) must raise ValueError/TypeError whose message matches."""
    for description, call, match in cases:
        with pytest.raises((ValueError, TypeError), match=match):
            call()
            pytest.fail(f"no error for: {description}")


def assert_fakes_match_kernels(inputs: dict, bad_calls, op_calls) -> tuple[FakeTensorMode, dict]:
    """Under FakeTensorMode (what torch.compile traces with) the fake kernels raise the kernels'
    shape, dtype and device errors (fake tensors hold no values: value checks are left out) and
    correct calls pass. Returns the mode and the fake inputs for further checks."""
    mode = FakeTensorMode()
    x = {k: mode.from_tensor(v) for k, v in inputs.items()}
    with mode:
        assert_all_raise(bad_calls(x, values=False))
        for op, args, kwargs in op_calls(x):
            op(*args, **kwargs)
    return mode, x
