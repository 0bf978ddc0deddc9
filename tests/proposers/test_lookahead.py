"""Lookahead decoding: every node of the combined pass (window and verification branch) computes
what a plain forward over the tokens it sees computes; the window and pool follow a plain-Python
reference; greedy identity (ragged batches, EOS, tiny Llama/Qwen2 and SmolLM2); adaptive sizes;
bad arguments. The sampling distribution test is in loop/test_decoders.py (support.decoding.METHODS)."""


import pytest
import torch
from support.decoding import assert_greedy_identity, hf_greedy, PROMPTS
from support.models import cyclic_lm, tiny_lm
from support.proposers import assert_nodes_compute_what_they_see, Recorder

import specdec
from specdec.loop.cost_model import CostModel
from specdec import Context
from specdec.loop.sampling import Sampling


def run(model, prompts, method, max_new=20, eos=None):
    recorder = Recorder(method)
    out = assert_greedy_identity(model, prompts, recorder, max_new=max_new, eos=eos)
    return recorder, out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_every_node_computes_a_plain_forward_over_what_it_sees(family):
    target = tiny_lm(family, seed=21)
    recorder, _ = run(target, PROMPTS[:2], specdec.Lookahead(window=3, ngram=3, guess_set=3, adaptive=False))
    # Window levels grow over the first steps; candidates appear once the pool has n-grams.
    assert assert_nodes_compute_what_they_see(target, recorder, 12) == {"root", "window", "candidate"}
    window_nodes = [int((~p.candidates[0]).sum()) for _, p, _, _ in recorder.steps]
    assert window_nodes[:3] == [3, 6, 6]  # level 0, then 2 levels (N - 1) of 3 columns


def python_pool_reference(recorder, model, method):
    """The window and the pool replayed in plain Python: each column's new level from a plain
    forward over exactly what the column's top level sees, n-grams kept per key as the g most
    recently inserted distinct continuations."""
    N, W, g = method.ngram, method.window, method.guess_set
    rows = len(recorder.prompt_ctx)
    pools = [dict() for _ in range(rows)]

    def insert(b, gram):
        if min(gram) < 0:
            return
        keep = pools[b].setdefault(gram[0], [])
        if gram[1:] in keep:
            keep.remove(gram[1:])
        keep.append(gram[1:])
        del keep[:-g]

    levels = [[[int(t) for t in recorder.initial_levels[b, 0]]] for b in range(rows)]
    for b, ctx in enumerate(recorder.prompt_ctx):
        for end in range(N - 1, len(ctx)):
            insert(b, tuple(ctx[end - N + 1: end + 1]))
    for committed, _, _, after in recorder.steps:
        for b in range(rows):
            row, lv = committed[b], levels[b]
            new = []
            for j in range(W):
                seen = row + [lv[0][i] for i in range(j + 1)] + [lv[level][j] for level in range(1, len(lv))]
                with torch.no_grad():
                    new.append(int(model(torch.tensor([seen])).logits[0, -1].argmax()))
            if len(lv) == N - 1:
                for j in range(W):
                    insert(b, tuple(lv[level][j] for level in range(N - 1)) + (new[j],))
                levels[b] = lv[1:] + [new]
            else:
                lv.append(new)
            for end in range(len(row), len(after[b])):
                insert(b, tuple(after[b][end - N + 1: end + 1]))
    return levels, pools


def test_window_and_pool_follow_a_plain_python_reference():
    target = tiny_lm("llama", seed=22)
    method = specdec.Lookahead(window=3, ngram=3, guess_set=2, adaptive=False)
    recorder, out = run(target, PROMPTS[1:3], method, max_new=16)
    assert len(recorder.steps) > 4  # the window filled and then gave n-grams for several steps
    levels, pools = python_pool_reference(recorder, target, method)
    assert recorder.proposer.levels.tolist() == levels
    assert any(len(keys) > 0 for keys in pools)
    for key in range(96):
        cand, count = recorder.proposer.pool.lookup(torch.tensor([key, key]))
        for b, pool in enumerate(pools):
            want = [list(c) for c in reversed(pool.get(key, []))]  # most recent first
            assert cand[b, : int(count[b])].tolist() == want, (b, key)


CONFIGS = {
    "default": specdec.Lookahead(),
    "reference candidates": specdec.Lookahead(pool_from_prompt=False, max_draft_tokens=0, adaptive=False),
    "small": specdec.Lookahead(window=2, ngram=2, guess_set=1, max_draft_tokens=4, adaptive=False),
    "no guesses": specdec.Lookahead(window=4, ngram=5, guess_set=0, adaptive=False),
}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("config", CONFIGS)
def test_greedy_identity_ragged_batch(family, config, device):
    target = tiny_lm(family, seed=23).to(device)
    method = CONFIGS[config]
    out = assert_greedy_identity(target, PROMPTS, method, max_new=32)
    # Adaptive sizes follow the measured pass costs, so how much is proposed varies from run to run.
    if not method.adaptive and method.guess_set:
        assert out.stats.total_accepted > 0


def test_greedy_identity_rows_stop_at_eos():
    target = tiny_lm("qwen2", seed=24)
    eos = hf_greedy(target, PROMPTS[0], 20)[6]
    assert_greedy_identity(target, PROMPTS, specdec.Lookahead(window=3, ngram=4), eos=eos)


def test_adaptive_sizes_follow_the_pass_costs_and_the_hits():
    target = tiny_lm("llama", seed=25)
    recorder = Recorder(specdec.Lookahead(window=6, ngram=3, guess_set=2, max_draft_tokens=0))
    assert_greedy_identity(target, PROMPTS[:1], recorder, max_new=4)
    proposer = recorder.proposer
    proposer.fill, proposer.steps, proposer.hit = [2] * 6, 1, [0.0, 1.0, 1.2]

    def sizes(ms):
        ctx = Context(torch.zeros(1, 8, dtype=torch.long), torch.tensor([8]), torch.tensor([False]),
                      None, None, specdec.loop.cost_model.CostModel(ms))
        return proposer._sizes(ctx, 0)

    # Flat costs (a GPU): every guess and the whole window.
    assert sizes({1: 10.0, 64: 10.0}) == (2, 6)
    # Every token costs a one-token pass: no guesses, no window, except every 8th step one
    # column (so that the window keeps filling) and one guess more than pays (its hits measured).
    steep = {k: 10.0 * k for k in (1, 2, 4, 8, 16, 32, 64)}
    assert sizes(steep) == (0, 0)
    proposer.steps = 8
    assert sizes(steep) == (1, 1)
    proposer.steps = 1
    # Flat to 8 tokens, then rising: the window may cost half of the 1.2 tokens the guesses add,
    # 10 ms * 1.6 = 16 ms: 3 columns (11 tokens, 13.75 ms), not 4 (13 tokens, 16.25 ms).
    assert sizes({1: 10.0, 8: 10.0, 16: 20.0}) == (2, 3)


def paths(proposal, b):
    """Row ``b``'s candidate nodes as token paths from the root (the root's token left out)."""
    tokens, parents = proposal.tokens[b].tolist(), proposal.parents[b].tolist()
    candidate = proposal.candidates[b].tolist() if proposal.candidates is not None else [True] * len(tokens)
    found = set()
    for i in range(1, len(tokens)):
        if tokens[i] >= 0 and candidate[i]:
            path, j = [], i
            while j > 0:
                path.append(tokens[j])
                j = parents[j]
            found.add(tuple(reversed(path)))
    return found


def test_verifies_every_candidate_prompt_lookup_would():
    # Lookahead's verification trie holds prompt lookup's whole tree, side branches included,
    # so where the copy does the work (edited code) it verifies no less than prompt lookup.
    target = cyclic_lm("qwen2", seed=26)
    recorder, _ = run(target, PROMPTS, specdec.Lookahead(window=2, ngram=3, guess_set=2, max_draft_tokens=5,
                                                         side_tokens=2, adaptive=False), max_new=24)
    lookup = specdec.PromptLookup(num_draft_tokens=5, adaptive=False, side_tokens=2)
    branched = 0
    for committed, proposal, _, _ in recorder.steps:
        width = max(map(len, committed))
        ctx = Context(torch.tensor([row + [0] * (width - len(row)) for row in committed]),
                      torch.tensor(list(map(len, committed))), torch.zeros(len(committed), dtype=torch.bool),
                      Sampling(False), None, CostModel())
        want = lookup.start(None, ctx, ctx.tokens, ctx.lengths, 64, None).propose(ctx)
        for b in range(len(committed)):
            want_paths = paths(want, b)
            assert want_paths <= paths(proposal, b), (committed[b], want_paths)
            leaves = [p for p in want_paths if not any(q[: len(p)] == p != q for q in want_paths)]
            branched += len(leaves) > 1
    assert branched > 0  # some steps had side branches besides the copy


def test_bad_arguments():
    for kwargs, match in [(dict(window=0), "window"), (dict(ngram=1), "ngram"),
                          (dict(guess_set=-1), "guess_set"), (dict(max_draft_tokens=-1), "max_draft_tokens"),
                          (dict(side_tokens=-1), "side_tokens")]:
        with pytest.raises(ValueError, match=match):
            specdec.Lookahead(**kwargs)


@pytest.mark.real_model
def test_smollm2_nodes_and_greedy_identity():
    from specdec import models

    model, tok = models.load("smollm2-135m", dtype=torch.float32)
    text = "Write a Python function that checks whether a number is prime."
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                  return_tensors="pt")
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    recorder = Recorder(specdec.Lookahead(window=4, ngram=4, guess_set=3, adaptive=False))
    out = specdec.generate(model, ids, max_new_tokens=32, method=recorder)
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=32,
                          temperature=None, top_k=None, top_p=None)[0, ids.shape[1]:]
    assert torch.equal(out.sequences[0, ids.shape[1]: ids.shape[1] + len(want)], want)
    assert out.stats.new_tokens > out.stats.target_forwards  # more than one token per pass
    kinds = assert_nodes_compute_what_they_see(model, recorder, 3, rtol=1e-4, atol=2e-4)
    assert kinds == {"root", "window", "candidate"}
