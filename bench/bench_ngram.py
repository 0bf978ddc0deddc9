"""CPU kernels of the n-gram ops vs their plain-Python reference (specdec.ops.reference).

Run: ``python -m pytest bench/bench_ngram.py --benchmark-json bench/results/ngram.json`` (then
``python bench/report.py bench/results/ngram.json`` for the table); with ``--benchmark-disable``
every case runs once, as a smoke test.
Shapes: prompt lookup over a 4096-token context (B 1 and 16, n from 3 down to 1, k = 10, as
in HF's prompt lookup), on code-like text (spans copied from earlier) and on random text (few
matches: the scan goes through the whole row); the lookahead pool at Qwen2.5's vocabulary
(V = 151,936), N = 5, G = 15, prefilled with a 2048-token prompt's n-grams, inserting W = 15
n-grams per step and looking up one key per row.
"""

import pytest
import torch

import specdec.ops.reference as ref
from specdec import ops

IMPLS = {"kernel": ops, "reference": ref}
S, MIN_N, MAX_N, K = 4096, 1, 3, 10
V, N, G, C, W = 151936, 5, 15, 1 << 16, 15


def context(B: int, kind: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, 32000, (B, S), generator=gen)
    if kind == "copies":  # code-like: about a third of each row repeats earlier spans
        for b in range(B):
            for dst in range(256, S, 96):
                src = int(torch.randint(0, dst - 32, (1,), generator=gen))
                ctx[b, dst : dst + 32] = ctx[b, src : src + 32].clone()
    return ctx


def prefilled_pool(B: int):
    """A pool holding the 5-grams of a 2048-token prompt per row (keys from 2000 tokens, so
    many keys hold all G continuations), and the n-grams and keys of a step."""
    gen = torch.Generator().manual_seed(1)
    head = torch.full((B, V), -1, dtype=torch.int64)
    entries = torch.full((B, C, N + 1), -1, dtype=torch.int64)
    cursor = torch.zeros(B, dtype=torch.int64)
    prompt = torch.randint(0, 2000, (B, 2048), generator=gen)
    ops.ngram_pool_insert(head, entries, cursor, prompt.unfold(1, N, 1), G)
    step = torch.randint(0, 2000, (B, W, N), generator=gen)
    return (head, entries, cursor), step, prompt[:, -1].clone()


def run(benchmark, fn, *args):
    # The references take up to about a second here: a few rounds, one call each.
    benchmark.pedantic(fn, args, rounds=5, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", ["copies", "random"])
@pytest.mark.parametrize("B", [1, 16])
def test_ngram_match(benchmark, impl, kind, B):
    benchmark.group = f"ngram_match {kind} B={B} S={S} n={MIN_N}..{MAX_N} k={K}"
    ctx = context(B, kind)
    lens = torch.full((B,), S, dtype=torch.int64)
    run(benchmark, IMPLS[impl].ngram_match, ctx, lens, MIN_N, MAX_N, K)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B", [1, 16])
def test_ngram_pool_insert(benchmark, impl, B):
    benchmark.group = f"ngram_pool_insert B={B} V={V} N={N} G={G} C={C} M={W}"
    pool, step, _ = prefilled_pool(B)
    run(benchmark, IMPLS[impl].ngram_pool_insert, *pool, step, G)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B", [1, 16])
def test_ngram_pool_lookup(benchmark, impl, B):
    benchmark.group = f"ngram_pool_lookup B={B} V={V} N={N} G={G}"
    (head, entries, _), _, last = prefilled_pool(B)
    run(benchmark, IMPLS[impl].ngram_pool_lookup, head, entries, last, G)
