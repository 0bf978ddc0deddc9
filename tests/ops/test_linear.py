"""specdec.ops.linear: a CPU product (float32, bfloat16) whose rows have the same bits for any
row count."""

import pytest
import torch
from support.ops import assert_all_raise, assert_fakes_match_kernels

from specdec import ops

# (N, K): K with and without a tail of < 8, N with and without a tail of the 4- and 12-column tiles.
SHAPES = [(1, 1), (5, 3), (37, 29), (48, 64), (130, 257), (896, 1024)]


def reference(x, w, b):
    return torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_close_to_the_exact_product(N, K, with_bias):
    gen = torch.Generator().manual_seed(N * 1000 + K)
    w, x = torch.randn(N, K, generator=gen), torch.randn(7, K, generator=gen)
    b = torch.randn(N, generator=gen) if with_bias else None
    y = ops.linear(x, w, b)
    assert y.shape == (7, N) and y.dtype == torch.float32
    # float32 summation of K products: within a few ulps of the largest partial sums
    tol = 1e-6 * (K ** 0.5) * (x.abs().max() * w.abs().max() * K ** 0.5 + 1)
    assert (y.double() - reference(x, w, b)).abs().max() <= tol


@pytest.mark.parametrize("N,K", SHAPES)
def test_bfloat16_is_the_float32_product_rounded(N, K):
    """bfloat16 products are summed in float32 and rounded once: within one bfloat16 step of
    the float32 product of the same values (the float32 sums' order differs with AVX512-BF16)."""
    gen = torch.Generator().manual_seed(K)
    w, x, b = (torch.randn(*s, generator=gen).bfloat16() for s in ((N, K), (9, K), (N,)))
    y = ops.linear(x, w, b)
    assert y.dtype == torch.bfloat16
    want = reference(x.float(), w.float(), b.float())
    summing = 1e-6 * K * x.abs().max().item() * w.abs().max().item()  # float32 sums, any order
    assert ((y.double() - want).abs() <= want.abs() * 2**-8 + summing).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,K", SHAPES)
def test_a_row_has_the_same_bits_whatever_shares_the_product(N, K, dtype):
    """What keeps verification exact: a token's outputs do not depend on the pass's width. Row
    counts cross the few-rows paths (1, 2, 3: tiles of all the rows), the row tiles (3 or 4)
    and the row chunks (96)."""
    gen = torch.Generator().manual_seed(K)
    w, b = torch.randn(N, K, generator=gen).to(dtype), torch.randn(N, generator=gen).to(dtype)
    x = torch.randn(200, K, generator=gen).to(dtype)
    whole = ops.linear(x, w, b)
    for start, stop in [(0, 1), (5, 6), (199, 200), (0, 2), (3, 5), (0, 3), (1, 8), (0, 16),
                        (10, 107), (0, 97), (0, 200)]:
        assert torch.equal(ops.linear(x[start:stop], w, b), whole[start:stop]), (start, stop)


def test_strided_rows_and_thread_counts_give_the_same_bits():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(300, 100, generator=gen)
    wide = torch.randn(9, 250, generator=gen)
    x = wide[:, 50:150]                       # rows 250 floats apart
    y = ops.linear(x, w)
    assert torch.equal(y, ops.linear(x.contiguous(), w))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(ops.linear(x, w), y)
    finally:
        torch.set_num_threads(threads)


def test_empty_products():
    assert ops.linear(torch.randn(0, 8), torch.randn(4, 8)).shape == (0, 4)
    assert ops.linear(torch.randn(3, 8), torch.randn(0, 8)).shape == (3, 0)


def test_opcheck():
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(5, 19, generator=gen), torch.randn(13, 19, generator=gen), torch.randn(13, generator=gen)
    for bias in (b, None):
        torch.library.opcheck(torch.ops.specdec.linear.default, (x, w, bias), {"out": torch.empty(5, 13)})


def bad_calls(t, values=True):
    x, w, b = t["x"], t["w"], t["b"]
    lin = torch.ops.specdec.linear

    def out(m=5, n=13, dtype=torch.float32):
        return torch.empty(m, n, dtype=dtype, device=x.device)

    return [
        ("x float64", lambda: lin(x.double(), w.double(), b.double(), out=out(dtype=torch.float64)),
         "x must be float32 or bfloat16"),
        ("weight bf16", lambda: lin(x, w.bfloat16(), b, out=out()), "weight must have the dtype of x"),
        ("x 3-D", lambda: lin(x[None], w, b, out=out()), "x must have 2 dimensions"),
        ("K differs", lambda: lin(x[:, :10], w, b, out=out()), r"weight must have shape \[13, 10\]"),
        ("weight transposed view", lambda: lin(x, w.t().contiguous().t(), b, out=out()),
         "weight must be contiguous"),
        ("bias size", lambda: lin(x, w, b[:4], out=out()), r"bias must have shape \[13\]"),
        ("bias dtype", lambda: lin(x, w, b.double(), out=out()), "bias must have the dtype of x"),
        ("out shape", lambda: lin(x, w, b, out=out(5, 12)), r"output out must have shape \[5, 13\]"),
        ("out dtype", lambda: lin(x, w, b, out=out(dtype=torch.bfloat16)), "output out must be"),
    ]


def linear_inputs():
    gen = torch.Generator().manual_seed(2)
    return {"x": torch.randn(5, 19, generator=gen), "w": torch.randn(13, 19, generator=gen),
            "b": torch.randn(13, generator=gen)}


def test_bad_input_raises_clear_errors_and_writes_nothing():
    t = linear_inputs()
    assert_all_raise(bad_calls(t))
    out = torch.full((5, 13), 7.0)
    with pytest.raises(ValueError):
        torch.ops.specdec.linear(t["x"], t["w"], t["b"][:4], out=out)
    assert torch.equal(out, torch.full((5, 13), 7.0))


def test_fake_kernels_reject_what_the_kernel_rejects():
    def calls(x):
        return [(torch.ops.specdec.linear.default, (x["x"], x["w"], x["b"]),
                 {"out": x["x"].new_empty(5, 13)})]

    assert_fakes_match_kernels(linear_inputs(), bad_calls, calls)


def test_torch_compile_fullgraph():
    w = torch.randn(13, 19)

    @torch.compile(fullgraph=True, backend="eager")
    def f(x):
        return ops.linear(x, w) * 2

    x = torch.randn(4, 19)
    assert torch.equal(f(x), ops.linear(x, w) * 2)
