"""Rows that stop leave the batch (`generate(drop_finished=True)`, the default): later passes
run only the rows still going, every proposer drops their state, and nothing else changes."""

import pytest
import torch
from support.decoding import assert_greedy_identity, early_eos, hf_greedy, left_padded, METHODS, pass_rows, PROMPTS
from support.models import cyclic_lm, perturbed, tiny_lm
from support.proposers import EVERY_METHOD

import specdec
from specdec import Batching

MAX_NEW = 24


@pytest.mark.parametrize("name", EVERY_METHOD)
def test_rows_that_stop_leave_and_the_output_is_unchanged(name):
    target = tiny_lm("llama", seed=2)
    eos = early_eos(target)
    rows, hook = pass_rows(target)
    out = assert_greedy_identity(target, PROMPTS, EVERY_METHOD[name](perturbed(target, 0.2, 1)), eos=eos,
                                 max_new=MAX_NEW)
    hook.remove()
    # The prompt's pass has every row, the last pass fewer: rows left as they stopped.
    assert rows[0] == len(PROMPTS) and rows[-1] < len(PROMPTS)
    assert rows == sorted(rows, reverse=True)
    assert out.stats.new_tokens_per_row.shape == (len(PROMPTS),)
    assert all(a.shape == (len(PROMPTS),) for a in out.stats.accepted)


def test_kept_rows_are_what_hf_batched_generate_computes():
    target = tiny_lm("llama", seed=2)
    eos = early_eos(target)
    ids, mask = left_padded(PROMPTS)
    rows, hook = pass_rows(target)
    kept = specdec.generate(target, ids, max_new_tokens=MAX_NEW, attention_mask=mask, eos_token_id=eos,
                            pad_token_id=2, batching=Batching(drop_finished=False))
    hook.remove()
    assert set(rows) == {len(PROMPTS)}
    dropped = specdec.generate(target, ids, max_new_tokens=MAX_NEW, attention_mask=mask, eos_token_id=eos,
                               pad_token_id=2)
    assert torch.equal(kept.sequences, dropped.sequences)
    assert torch.equal(kept.stats.new_tokens_per_row, dropped.stats.new_tokens_per_row)
    assert kept.stats.new_tokens_per_row.min() < MAX_NEW  # some row did stop early


def test_kept_rows_that_accepted_past_the_end_still_fit():
    # Rows reach max_new_tokens inside a pass (accepted tokens past it) at different steps;
    # kept, they must not hold more cache than they emitted, or their later passes overflow.
    target = cyclic_lm("qwen2")
    method = specdec.DraftModel(perturbed(target, 0.1, seed=1), 6)
    out = assert_greedy_identity(target, PROMPTS, method, max_new=40)
    ids, mask = left_padded(PROMPTS)
    kept = specdec.generate(target, ids, max_new_tokens=40, attention_mask=mask, pad_token_id=2,
                            batching=Batching(drop_finished=False, pace=False), method=method)
    assert torch.equal(kept.sequences, out.sequences)


@pytest.mark.parametrize("name", ["draft coupled", "draft rejection sampling", "lookahead"])
def test_seeded_sampling_is_the_same_whether_rows_leave_or_not(name):
    # Each row keeps its own random numbers after the rows before it leave.
    target = tiny_lm("llama", seed=2)
    ids, mask = left_padded(PROMPTS)
    runs = []
    for drop in (True, False):
        method = METHODS[name](perturbed(target, 0.2, 1))
        runs.append(specdec.generate(target, ids, max_new_tokens=MAX_NEW, attention_mask=mask, do_sample=True,
                                     temperature=0.9, method=method, eos_token_id=[3, 7, 11], pad_token_id=2,
                                     generator=torch.Generator().manual_seed(5), batching=Batching(pace=False, drop_finished=drop)))
    assert runs[0].stats.new_tokens_per_row.min() < MAX_NEW
    assert torch.equal(runs[0].sequences, runs[1].sequences)


def test_batch_of_one_and_rows_stopping_together():
    target = tiny_lm("qwen2", seed=3)
    one = specdec.generate(target, torch.tensor([PROMPTS[0]]), max_new_tokens=6, method=specdec.PromptLookup())
    assert one.sequences[0, len(PROMPTS[0]):].tolist() == hf_greedy(target, PROMPTS[0], 6)
    ids, mask = left_padded(PROMPTS)
    # Every row stops at max_new_tokens in the same step: nobody leaves before the end.
    rows, hook = pass_rows(target)
    specdec.generate(target, ids, max_new_tokens=5, attention_mask=mask, eos_token_id=[], pad_token_id=2)
    hook.remove()
    assert set(rows) == {len(PROMPTS)}
