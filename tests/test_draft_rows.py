"""DraftModel's chain in a packed batch (CPU): each row drafts while its next candidate pays for
its own node (`CostModel.extend_rows`), so confident rows keep long chains and the others stop
early; the chains are the batch's own, cut per row."""

import torch
from test_decoders import PROMPTS, assert_greedy_identity
from tiny_models import perturbed, tiny_lm

import specdec
from specdec.cost_model import CostModel
from specdec.decoders.protocol import Context
from specdec.sampling import Sampling
from specdec.tree_forward import tree_attention_enabled

LIMIT = 8


def proposal(draft, target, costs: CostModel) -> tuple[torch.Tensor, list[int]]:
    """The first step's chains of ``DraftModel(draft, adaptive=True)`` for PROMPTS, the draft
    having seen every prompt token but the last (the step's root), and each row's length."""
    B, S = len(PROMPTS), max(map(len, PROMPTS))
    lengths = torch.tensor([len(p) for p in PROMPTS])
    tokens = torch.zeros(B, S + 2 * LIMIT, dtype=torch.long)
    for b, p in enumerate(PROMPTS):
        tokens[b, : len(p)] = torch.tensor(p)
    ctx = Context(tokens=tokens, lengths=lengths, finished=torch.zeros(B, dtype=torch.bool), sampling=Sampling(),
                  streams=None, costs=costs)
    method = specdec.DraftModel(draft, adaptive=True, max_draft_tokens=LIMIT)
    with torch.inference_mode(), tree_attention_enabled(draft):
        proposer = method.start(target, ctx, tokens[:, :S], lengths - 1, tokens.shape[1] + LIMIT + 1, None)
        chains = proposer.propose(ctx).tokens[:, 1:]
    return chains, (chains >= 0).sum(1).tolist()


def own_chain(draft, prompt: list[int]) -> tuple[list[int], list[float]]:
    """The draft's greedy chain after ``prompt`` run on its own (plain forward passes), and its
    probability of each token."""
    ids, probs = list(prompt), []
    with torch.no_grad():
        for _ in range(LIMIT):
            p = draft(torch.tensor([ids])).logits[0, -1].float().softmax(-1)
            ids.append(int(p.argmax()))
            probs.append(float(p.max()))
    return ids[len(prompt):], probs


def test_each_row_drafts_what_pays_for_its_own_nodes():
    target = tiny_lm(init=0.6)  # peaked: the draft's confidence varies from 0.3 to 1 along its chains
    draft = perturbed(target, 0.3, seed=3)
    # A one-token step 10 ms a row, each more node 2 ms, a draft pass 2 ms.
    B = len(PROMPTS)
    costs = CostModel({B: 10.0 * B, B + 32: 10.0 * B + 64}, draft_ms_per_token=2.0, rows=B, packed=True)
    chains, lengths = proposal(draft, target, costs)
    assert len(set(lengths)) > 1, lengths  # rows stop at different lengths
    gains = []
    for b, prompt in enumerate(PROMPTS):
        tokens, probs = own_chain(draft, prompt)
        assert chains[b, : lengths[b]].tolist() == tokens[: lengths[b]]  # the row's own chain, cut
        assert (chains[b, lengths[b]:] == -1).all()
        reach = torch.tensor(probs).cumprod(0)
        # What the next candidate after draft i was expected to add (the next taken as likely).
        gains.append((reach * torch.tensor(probs)).tolist())
    # At every length, the rows that went on expected more from their next candidate than the
    # rows that stopped there.
    for i in range(LIMIT - 1):
        on = [gains[b][i] for b in range(B) if lengths[b] > i + 1]
        stopped = [gains[b][i] for b in range(B) if lengths[b] == i + 1]
        if on and stopped:
            assert min(on) > max(stopped) - 1e-5, (i, on, stopped)


def test_free_nodes_draft_every_row_to_the_limit_and_dear_ones_one():
    target = tiny_lm()
    draft = perturbed(target, 0.3, seed=3)
    B = len(PROMPTS)
    free = CostModel({B: 40.0, B + 64: 40.0}, rows=B, packed=True)
    assert proposal(draft, target, free)[1] == [LIMIT] * B
    # Every node costs a one-token step: no second candidate pays (the first is always drafted).
    dear = CostModel({B: 40.0, B + 64: 40.0 * (1 + 64)}, draft_ms_per_token=2.0, rows=B, packed=True)
    assert proposal(draft, target, dear)[1] == [1] * B


def test_per_row_lengths_keep_greedy_identity_in_ragged_batches():
    target = tiny_lm()
    for scale in (0.05, 0.3):  # a draft that agrees mostly, and one that agrees less
        method = specdec.DraftModel(perturbed(target, scale, seed=4), 4, adaptive=True, max_draft_tokens=6)
        for eos in (None, 67):
            out = assert_greedy_identity(target, PROMPTS, method, eos=eos)
            assert out.stats.total_accepted > 0
