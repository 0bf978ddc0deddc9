"""CPU kernels of the sampling/verification ops vs their plain-PyTorch reference.

Run: ``python -m pytest bench/bench_ops.py --benchmark-json bench/results/ops.json`` then
``python bench/report.py bench/results/ops.json`` for the markdown table.
Shapes are decode shapes: B 1 and 16, K 4 and 8, V 32000 (Llama) and 152064 (Qwen2.5), trees of
64 nodes.
"""

import pytest
import torch
from support import drafts_from, random_parents, random_probs

import specdec.ops.reference as ref
from specdec import ops

IMPLS = {"kernel": ops, "reference": ref}


def chain_inputs(B, K, V, stochastic):
    gen = torch.Generator().manual_seed(0)
    p = random_probs(B, K + 1, V, gen=gen)
    q = random_probs(B, K, V, gen=gen) if stochastic else None
    ids = drafts_from(p[:, :K] if q is None else q, gen)
    return q, ids, p, torch.rand(B, K + 1, generator=gen)


def tree_inputs(B, T, V):
    gen = torch.Generator().manual_seed(0)
    parents = torch.tensor([random_parents(T, gen) for _ in range(B)])
    p = random_probs(B, T, V, gen=gen)
    parent_p = torch.gather(p, 1, parents.clamp_min(0)[..., None].expand(B, T, V))
    tokens = drafts_from(parent_p, gen)
    return tokens, parents, p, torch.rand(B, T, generator=gen)


def run(benchmark, fn, *args, **kwargs):
    # References can take seconds at these shapes: a few rounds, one call each.
    benchmark.pedantic(fn, args, kwargs, rounds=5, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("stochastic", [True, False], ids=["draft_probs", "q=1"])
@pytest.mark.parametrize("B,K,V", [(1, 4, 32000), (16, 4, 32000), (1, 8, 152064), (16, 8, 152064)])
def test_chain_speculative_sampling(benchmark, impl, stochastic, B, K, V):
    benchmark.group = f"chain_speculative_sampling {'draft_probs' if stochastic else 'q=1'} B={B} K={K} V={V}"
    run(benchmark, IMPLS[impl].chain_speculative_sampling, *chain_inputs(B, K, V, stochastic))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B,K,V", [(1, 8, 152064), (16, 8, 152064)])
def test_chain_greedy_verify(benchmark, impl, B, K, V):
    benchmark.group = f"chain_greedy_verify logits B={B} K={K} V={V}"
    logits = torch.randn(B, K + 1, V, generator=torch.Generator().manual_seed(0))
    ids = logits[:, :K].argmax(-1)
    run(benchmark, IMPLS[impl].chain_greedy_verify, ids, logits)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B", [1, 16])
def test_build_tree(benchmark, impl, B):
    benchmark.group = f"build_tree B={B} T=64"
    run(benchmark, IMPLS[impl].build_tree, tree_inputs(B, 64, 8)[1])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B", [1, 16])
def test_tree_verify_greedy(benchmark, impl, B):
    benchmark.group = f"tree_verify_greedy ids B={B} T=64"
    tokens, parents, p, _ = tree_inputs(B, 64, 8)
    run(benchmark, IMPLS[impl].tree_verify_greedy, tokens, parents, p.argmax(-1))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B,V", [(1, 32000), (16, 32000), (1, 152064)])
def test_tree_speculative_sampling(benchmark, impl, B, V):
    benchmark.group = f"tree_speculative_sampling q=1 B={B} T=64 V={V}"
    run(benchmark, IMPLS[impl].tree_speculative_sampling, *tree_inputs(B, 64, V))
