"""Prompt lookup's chain in a packed batch: each row proposes what pays for that row."""

import torch

from specdec.loop.cost_model import CostModel
from specdec.proposers.copy_chain import ROW_PRIOR, CopyChain
from specdec.loop.protocol import Context
from specdec.loop.sampling import Sampling

# Four rows whose contexts repeat, so every row matches: what follows "1 2" is 3 4 5 6 ...
TEXT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2]


def context(rows: int, costs: CostModel) -> Context:
    tokens = torch.tensor([TEXT + [0] * 20] * rows)
    return Context(tokens=tokens, lengths=torch.full((rows,), len(TEXT)), finished=torch.zeros(rows, dtype=torch.bool),
                   sampling=Sampling(), streams=None, costs=costs)


def packed_costs(rows: int) -> CostModel:
    # A one-token step 10 ms a row, each more node 2 ms: a candidate pays for its row when its
    # chance of being accepted exceeds 0.2.
    return CostModel({rows: 10.0 * rows, rows + 32: 10.0 * rows + 64}, rows=rows, packed=True)


def test_each_row_proposes_what_its_own_acceptance_pays_for():
    chain = CopyChain(1, 3, limit=8, adaptive=True, rows=4)
    chain.row_rates = torch.tensor([0.9, 0.5, 0.1, ROW_PRIOR], dtype=torch.float64)
    ctx = context(4, packed_costs(4))
    ctx.finished[3] = True  # a stopped row proposes nothing
    proposed = chain.propose(ctx)
    # 0.9^i > 0.2 up to i = 15 (cut to 8); 0.5^i up to i = 2; 0.1 never.
    assert (proposed >= 0).sum(1).tolist() == [8, 2, 0, 0]
    assert proposed[0].tolist() == [3, 4, 5, 6, 7, 8, 9, 10]
    # Exploring: rows with a match try one candidate at least.
    assert (chain.propose(ctx, explore=True) >= 0).sum(1).tolist() == [8, 2, 1, 0]


def test_row_rates_follow_each_rows_acceptance_and_rows_leaving_and_joining():
    chain = CopyChain(1, 3, limit=8, adaptive=True, rows=2)
    ctx = context(2, packed_costs(2))
    chain.propose(ctx)  # both rows at the prior: 0.5^i > 0.2 up to i = 2
    assert (chain.chain >= 0).sum(1).tolist() == [2, 2]
    # Row 0 took its whole chain, row 1 none of it.
    ctx.tokens[0, len(TEXT): len(TEXT) + 2] = torch.tensor([3, 4])
    ctx.tokens[1, len(TEXT)] = 99
    chain.observe(ctx, accept_len=torch.tensor([2, 0]), live=torch.ones(2, dtype=torch.bool))
    assert chain.row_rates.tolist() == [0.75, 0.25]
    chain.keep_rows(torch.tensor([1]))
    chain.join(CopyChain(1, 3, limit=8, adaptive=True, rows=2))
    assert chain.row_rates.tolist() == [0.25, ROW_PRIOR, ROW_PRIOR]


def test_unpacked_passes_keep_one_length_for_the_batch():
    chain = CopyChain(1, 3, limit=8, adaptive=True, rows=2)
    chain.row_rates = torch.tensor([0.9, 0.0], dtype=torch.float64)
    costs = CostModel({2: 40.0, 16: 40.0}, rows=2)  # flat, as on a GPU: the whole chain pays
    assert (chain.propose(context(2, costs)) >= 0).sum(1).tolist() == [8, 8]
