"""A draft taking copied tokens (`DraftModel(lookup=m)`): the same chain as drafting token by
token, in fewer draft passes where the text repeats; greedy identity, ragged batches and bad
arguments. Seeded sampling and the sampling distribution are in test_verify_loop and
test_decoders (their method lists include it)."""

from __future__ import annotations

import pytest
import torch
from support.clock import SyntheticClock
from support.decoding import assert_greedy_identity, PROMPTS
from support.models import bigram_target, cyclic_lm, perturbed, tiny_lm
from support.proposers import Recording

import specdec
from specdec.model.attention import enable_tree_attention
from specdec.proposers.draft.proposer import draft_proposer


def draft_passes(draft: torch.nn.Module) -> list[int]:
    """A list that grows by one per forward pass of ``draft``."""
    calls: list[int] = []
    draft.get_input_embeddings().register_forward_hook(lambda *_: calls.append(1))
    return calls


def chains(recording: Recording) -> list[list[list[int]]]:
    return [step[1].tokens.tolist() for step in recording.steps]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("batch", [[PROMPTS[2]], PROMPTS])
def test_same_chains_as_token_by_token_in_fewer_draft_passes(family, batch):
    target = cyclic_lm(family)
    draft = perturbed(target, 0.1, seed=1)
    passes = draft_passes(draft)
    runs = {}
    for lookup in (0, 4):
        passes.clear()
        recording = Recording(specdec.DraftModel(draft, 6, lookup=lookup))
        out = assert_greedy_identity(target, batch, recording, max_new=40)
        runs[lookup] = chains(recording), len(passes), out.stats.total_accepted
    assert runs[4][0] == runs[0][0]  # every step's chain, token for token
    assert runs[4][2] > 0
    if len(batch) == 1:  # a batch's pass goes on while any row drafts token by token
        assert runs[4][1] < runs[0][1], (runs[4][1], runs[0][1])  # copies taken: passes saved


def test_ragged_batch_with_eos_and_adaptive_lengths(device):
    target = cyclic_lm().to(device)
    draft = perturbed(target, 0.05, seed=2).to(device)
    for eos in (None, 67):
        out = assert_greedy_identity(target, PROMPTS, specdec.DraftModel(draft, 4, adaptive=True, lookup=3), eos=eos)
        assert out.stats.total_accepted > 0


def test_limit_one_and_draft_equal_to_target():
    target = cyclic_lm()
    out = assert_greedy_identity(target, PROMPTS, specdec.DraftModel(target, 1, lookup=4))
    assert out.stats.acceptance_rate == 1.0
    out = assert_greedy_identity(target, PROMPTS[:1], specdec.DraftModel(target, 8, lookup=8), max_new=40)
    assert out.stats.acceptance_rate == 1.0  # every chain accepted whole: the chain is the draft's


def test_default_takes_copies_for_one_rows_chain_only():
    draft = tiny_lm()
    assert specdec.DraftModel(draft).copied_tokens(1) == 8
    assert specdec.DraftModel(draft).copied_tokens(4) == 0  # a batch's pass would widen with every row's copy
    # An adaptive tree's chain steps take copies as the chain would; a fixed tree never drafts a chain.
    assert specdec.DraftModel(draft, tree="dynamic", top_k=2).copied_tokens(1) == 8
    ids = torch.tensor([PROMPTS[0]])
    fixed = specdec.DraftModel(draft, 3, tree="dynamic", top_k=2)
    enable_tree_attention(draft)
    assert draft_proposer([fixed], draft, ids, torch.tensor([ids.shape[1]]), 32).lookup == 0
    assert specdec.DraftModel(draft, coupled=False).copied_tokens(1) == 0
    assert specdec.DraftModel(draft, lookup=3).copied_tokens(4) == 3


def test_bad_arguments():
    target = tiny_lm()
    with pytest.raises(ValueError, match="lookup must be >= 0"):
        specdec.DraftModel(target, lookup=-1)
    with pytest.raises(ValueError, match="needs tree=None"):
        specdec.DraftModel(target, lookup=4, tree="dynamic", top_k=2)
    with pytest.raises(ValueError, match="needs coupled=True"):
        specdec.DraftModel(target, lookup=4, coupled=False)


def test_a_pass_that_takes_copies_is_priced_for_them(monkeypatch):
    """On text that repeats, each pass after the first is fed 8 copies and takes them all.
    Priced as if it added one token (a draft pass costs 40 ms, a target node 10) the chain
    would stop after two passes at 10 tokens; priced for the copies the draft took in the
    passes before, it goes on to the limit."""
    target = bigram_target()  # its greedy text soon cycles: every copy is right
    with torch.no_grad():
        target.lm_head.weight.mul_(20.0)  # confident, as a real draft is on copied code
    draft = perturbed(target, 0.0, seed=0)  # the target's copy: its chains are accepted whole
    SyntheticClock(target, [draft], target_ms=lambda tokens: 100.0 + 10.0 * tokens, draft_ms=40.0).install(monkeypatch)
    recording = Recording(specdec.DraftModel(draft, adaptive=True, lookup=8, max_draft_tokens=24))
    out = assert_greedy_identity(target, [PROMPTS[2]], recording, max_new=120)
    lengths = [step[1].width - 1 for step in recording.steps]
    assert out.stats.acceptance_rate == 1.0
    # The first step drafts before any draft pass is timed; the second learns what copies give.
    assert all(n > 10 for n in lengths[1:]) and lengths.count(24) >= 3, lengths
