"""A queue of requests (`generate(max_batch_size=...)`): at most that many rows decode at once,
waiting rows take the places of rows that stop, and every row's output is what decoding it
alone gives."""

import pytest
import torch
from support.decoding import early_eos, first_mismatch_note, hf_greedy, left_padded, pass_rows, PROMPTS
from support.models import cyclic_lm, perturbed, tiny_lm
from support.proposers import EVERY_METHOD

import specdec
from specdec import Batching, Method, Proposer

MAX_NEW = 16
# Rows that stop at different times: short and long outputs, repetitive and not.
QUEUE = PROMPTS + [[0, 7, 8, 7, 8, 7], [0, 50, 51], [0, 12, 13, 14, 12, 13, 14, 12]]


def run_queue(target, method, max_batch_size, **kw):
    ids, mask = left_padded(QUEUE)
    return specdec.generate(target, ids, max_new_tokens=MAX_NEW, method=method, attention_mask=mask,
                            pad_token_id=2, batching=Batching(max_batch_size=max_batch_size, pace=False), **kw)


@pytest.mark.parametrize("name", [None, *EVERY_METHOD])
def test_every_row_of_a_queue_is_hf_greedy(name):
    target = tiny_lm("llama", seed=2)
    eos = early_eos(target)
    draft = perturbed(target, 0.2, 1)
    S = max(len(p) for p in QUEUE)
    for max_batch_size in (1, 3):
        method = None if name is None else EVERY_METHOD[name](draft)
        rows, hook = pass_rows(target)
        out = run_queue(target, method, max_batch_size, eos_token_id=eos)
        hook.remove()
        assert max(rows) <= max_batch_size  # prompts' passes and decoding passes alike
        for b, prompt in enumerate(QUEUE):
            want = hf_greedy(target, prompt, MAX_NEW, eos)
            got = out.sequences[b, S:S + len(want)].tolist()
            assert got == want, (max_batch_size, b, first_mismatch_note(target, prompt, want, got))
            assert (out.sequences[b, S + len(want):] == 2).all()
        assert out.stats.new_tokens_per_row.shape == (len(QUEUE),)
        assert all(a.shape == (len(QUEUE),) for a in out.stats.accepted)
        assert out.stats.new_tokens == int(out.stats.new_tokens_per_row.sum())


def test_waiting_rows_take_the_places_of_rows_that_stop():
    target = tiny_lm("llama", seed=2)
    passes = []  # (rows, whether the pass is a prompt's) of every pass

    def record(_, args, kwargs):
        runs = kwargs.get("specdec_packed")
        rows = sum(n for _, n, _ in runs) if runs else kwargs["input_ids"].shape[0]
        passes.append((rows, kwargs.get("specdec_tree_mask") is None))

    hook = target.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
    out = run_queue(target, specdec.PromptLookup(), 3, eos_token_id=early_eos(target))
    hook.remove()
    decoding = [rows for rows, prompt in passes if not prompt]
    joined = [i for i, (_, prompt) in enumerate(passes) if prompt and i > 0 and not passes[i - 1][1]]
    # Rows joined between decoding passes, and every decoding pass until the queue emptied had 3
    # rows: the batch stays full while requests wait, then shrinks as its last rows stop.
    assert joined and len(decoding) == len(out.stats.accepted)
    full = len(decoding) - decoding[::-1].index(3)
    assert decoding[:full] == [3] * full and decoding[full:] == sorted(decoding[full:], reverse=True)
    assert full > joined[-1] - len([p for p in passes[:joined[-1]] if p[1]])
    assert (out.stats.new_tokens_per_row > 0).all()


@pytest.mark.parametrize("name", ["draft coupled", "draft rejection sampling", "prompt lookup tree", "lookahead"])
def test_seeded_sampling_gives_each_row_its_tokens_however_rows_are_batched(name):
    target = tiny_lm("llama", seed=2)
    draft = perturbed(target, 0.2, 1)
    outs = [run_queue(target, EVERY_METHOD[name](draft), size, do_sample=True, temperature=1.5,
                      generator=torch.Generator().manual_seed(9)).sequences for size in (None, 2, 5)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_rows_that_start_together_share_their_prompt_prefix():
    target = tiny_lm("qwen2", seed=4)
    systems = [[(7 * i) % 90 + 3 for i in range(80)], [(11 * i) % 90 + 5 for i in range(80)]]
    prompts = [systems[b >= 2] + [10 + b, 20 + b] for b in range(5)]
    ids = torch.tensor(prompts)
    out = specdec.generate(target, ids, max_new_tokens=6, batching=Batching(max_batch_size=2), pad_token_id=2, eos_token_id=[])
    # Rows 0-1 start together; 2 and 3 (another system prompt) join when both stop (a token a
    # pass) and share theirs; then 4 alone, copying it from row 2 or 3 as they leave.
    assert [g.rows for g in out.stats.shared_prefixes] == [(0, 1), (2, 3)]
    assert out.stats.prefix_tokens_reused == 80
    for b, prompt in enumerate(prompts):
        assert out.sequences[b, 82:].tolist() == hf_greedy(target, prompt, 6, eos=[])


def test_joining_rows_copy_the_prompt_prefix_of_rows_leaving_as_they_join():
    target = tiny_lm("qwen2", seed=4)
    draft = perturbed(target, 0.2, 1)
    system = [(7 * i) % 90 + 3 for i in range(80)]
    prompts = [system + [10 + b, 20 + b] for b in range(5)]
    for method in (None, specdec.DraftModel(draft, 3)):
        passes = {m: [] for m in (target, draft)}
        hooks = [m.get_decoder().register_forward_pre_hook(
            lambda _, args, kwargs, m=m: passes[m].append(kwargs["input_ids"].shape[1]), with_kwargs=True)
            for m in passes]
        out = specdec.generate(target, torch.tensor(prompts), max_new_tokens=6, batching=Batching(max_batch_size=2), pad_token_id=2,
                               eos_token_id=[], method=method)
        for hook in hooks:
            hook.remove()
        # Rows 0-1 share the system prompt; every later row copies it from the rows it replaces
        # (those rows stop at the step before and leave as it joins), in both models' caches.
        assert [g.rows for g in out.stats.shared_prefixes] == [(0, 1)]
        assert out.stats.prefix_tokens_reused == 3 * 80
        for model in (target, draft) if method else (target,):
            assert max(passes[model]) == 80 and passes[model].count(80) == 1
        for b, prompt in enumerate(prompts):
            assert out.sequences[b, 82:].tolist() == hf_greedy(target, prompt, 6, eos=[])


def test_rows_that_stop_at_their_first_token_make_room_at_once():
    target = tiny_lm("llama", seed=2)
    ids, mask = left_padded(QUEUE)
    out = specdec.generate(target, ids, max_new_tokens=1, attention_mask=mask, pad_token_id=2, batching=Batching(max_batch_size=2),
                           method=specdec.PromptLookup())
    for b, prompt in enumerate(QUEUE):
        assert out.sequences[b, -1].item() == hf_greedy(target, prompt, 1)[0]
    assert out.stats.target_forwards == len(QUEUE) // 2 + len(QUEUE) % 2  # prompt passes only


class _Stays(Method, Proposer):
    """A method whose proposers can drop rows but not take new ones."""

    max_pass_tokens, models, needs_hidden_states = 1, (), False

    def start(self, target, ctx, prompt, prompt_len, max_length, first):
        return self

    def propose(self, ctx):
        return specdec.Proposal.root_only(ctx.roots())

    def update(self, ctx, step):
        pass

    def keep_rows(self, rows):
        pass


def test_bad_arguments():
    target = tiny_lm("llama", seed=2)
    ids, mask = left_padded(QUEUE)
    with pytest.raises(ValueError, match="max_batch_size must be >= 1"):
        specdec.generate(target, ids, attention_mask=mask, batching=Batching(max_batch_size=0))
    with pytest.raises(ValueError, match="drop_finished=True"):
        specdec.generate(target, ids, attention_mask=mask, batching=Batching(max_batch_size=2, drop_finished=False))
    with pytest.raises(ValueError, match="_Stays's do not"):
        specdec.generate(target, ids, attention_mask=mask, batching=Batching(max_batch_size=2), method=_Stays())
    # As many rows at once as there are: nothing waits, nothing needs to join.
    out = specdec.generate(target, ids, attention_mask=mask, batching=Batching(max_batch_size=len(QUEUE)), method=_Stays(),
                           max_new_tokens=3, pad_token_id=2)
    assert out.sequences.shape == (len(QUEUE), ids.shape[1] + 3)


def test_a_joining_row_copies_the_prompt_prefix_of_a_row_in_the_batch():
    target = tiny_lm("qwen2", seed=4)
    system = [(7 * i) % 90 + 3 for i in range(80)]
    prompts = [system + [10 + b, 20 + b] for b in range(3)]
    eos = hf_greedy(target, prompts[0], 4, eos=[])[2]  # row 0 stops after 3 tokens, row 1 goes on
    passes = []
    hook = target.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: passes.append(kwargs["input_ids"].numel()), with_kwargs=True)
    out = specdec.generate(target, torch.tensor(prompts), max_new_tokens=8, batching=Batching(max_batch_size=2), pad_token_id=2,
                           eos_token_id=eos)
    hook.remove()
    # Rows 0 and 1 share the system prompt (computed once); row 2 joins while row 1 runs and
    # copies its 80 cached tokens: its prompt pass computes its last 2 tokens only.
    assert [g.rows for g in out.stats.shared_prefixes] == [(0, 1)]
    assert out.stats.prefix_tokens_reused == 80
    assert 2 in passes and passes.count(80) == 1
    for b, prompt in enumerate(prompts):
        want = hf_greedy(target, prompt, 8, eos)
        assert out.sequences[b, 82: 82 + len(want)].tolist() == want


def test_a_joining_prompt_equal_to_one_in_the_batch_keeps_its_last_token_for_its_own_pass():
    from specdec.model.prompt_plan import prefix_donors

    prompts = torch.tensor([[4, 5, 6, 7], [8, 9, 0, 0]])
    donor, length = prefix_donors(prompts, torch.tensor([4, 2]), prompts[:1], torch.tensor([4]))
    assert donor.tolist() == [0, -1] and length.tolist() == [3, 0]
    # Identical requests in a queue (rows 2 and 3 repeat rows 0 and 1) decode as HF does.
    target = tiny_lm("llama", seed=2)
    queue = [[0] + [5, 17, 33] * 7, [0] + [9, 61, 70, 71] * 5] * 2
    ids, mask = left_padded(queue)
    out = specdec.generate(target, ids, max_new_tokens=MAX_NEW, attention_mask=mask, pad_token_id=2,
                           batching=Batching(max_batch_size=3), eos_token_id=hf_greedy(target, queue[0], 6)[4])
    assert torch.equal(out.sequences[2:], out.sequences[:2])
    assert out.stats.prefix_tokens_reused == len(queue[1]) - 1  # row 3 copies row 1's prompt



def test_a_joining_rows_draft_copies_the_prefix_from_the_batchs_draft_cache():
    from specdec.loop.cost_model import CostModel
    from specdec.proposers.draft.proposer import draft_proposer
    from specdec.loop.protocol import Context
    from specdec.loop.sampling import Sampling
    from specdec.model.attention import tree_attention_enabled
    from specdec.model.prompt_plan import prefix_donors

    target = tiny_lm("qwen2", seed=4)
    draft = perturbed(target, 0.2, 1)
    system = [(7 * i) % 90 + 3 for i in range(40)]
    batch = torch.tensor([[5] * 20 + [12, 13] + [0] * 20, system + [10, 11]])
    batch_len = torch.tensor([22, 42])
    # Row 0 starts like no row of the batch, row 1 with the batch's row 1 (4 tokens).
    joining = torch.tensor([[6, 6, 6, 6, 0, 0], system[:4] + [70, 71]])
    joining_len = torch.tensor([4, 6])
    donor, reused = prefix_donors(joining, joining_len, batch, batch_len)
    assert donor.tolist() == [-1, 1] and reused.tolist() == [0, 4]
    method = specdec.DraftModel(draft, 3)

    def same_entries(cache, rows, alone):
        for mine, want in zip(cache.layers, alone.layers):
            for row, b in zip(rows, range(2)):
                n = int(joining_len[b])
                torch.testing.assert_close(mine.keys[row, :, :n], want.keys[b, :, :n], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(mine.values[row, :, :n], want.values[b, :, :n], atol=1e-5, rtol=1e-5)

    passes = []
    with torch.inference_mode(), tree_attention_enabled(target, draft):
        running = draft_proposer([method], target, batch, batch_len, 64)
        whole = draft_proposer([method], target, joining, joining_len, 64)
        hook = draft.get_decoder().register_forward_pre_hook(
            lambda _, args, kwargs: passes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
        waiting = draft_proposer([method], target, joining, joining_len, 64, donors=(donor, reused))
        assert passes == []  # nothing computed until the rows join
        running.join(waiting)
        hook.remove()
        # Started with donors but never joined: its rows are prefilled whole when it first proposes.
        unjoined = draft_proposer([method], target, joining, joining_len, 64, donors=(donor, reused))
        tokens = torch.cat([joining, torch.zeros(2, 8, dtype=torch.long)], 1)
        tokens[0, 4] = tokens[1, 6] = 9  # each row's first emitted token
        unjoined.propose(Context(tokens, joining_len + 1, torch.zeros(2, dtype=torch.bool), Sampling(), None,
                                 CostModel()))
    # The joining rows computed what the copy leaves: row 0's 4 tokens, row 1's last 2.
    assert passes == [(2, 4)]
    assert running.cache.lengths.tolist() == [22, 42, 4, 6]
    same_entries(running.cache, [2, 3], whole.cache)
    same_entries(unjoined.cache, [0, 1], whole.cache)


def test_a_queue_with_a_draft_copies_prefixes_for_the_draft_too():
    target = tiny_lm("qwen2", seed=4)
    draft = perturbed(target, 0.2, 1)
    system = [(7 * i) % 90 + 3 for i in range(80)]
    prompts = [system + [10 + b, 20 + b] for b in range(3)]
    eos = hf_greedy(target, prompts[0], 4, eos=[])[2]  # row 0 stops after 3 tokens, row 1 goes on
    passes = []
    hook = draft.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: passes.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    out = specdec.generate(target, torch.tensor(prompts), max_new_tokens=8, batching=Batching(max_batch_size=2), pad_token_id=2,
                           eos_token_id=eos, method=specdec.DraftModel(draft, 3))
    hook.remove()
    # The draft computes the system prompt once (rows 0 and 1 share it); row 2 copies it from
    # row 1's draft cache when it joins.
    assert out.stats.prefix_tokens_reused == 80
    assert max(passes) == 80 and passes.count(80) == 1
    for b, prompt in enumerate(prompts):
        want = hf_greedy(target, prompt, 8, eos)
        assert out.sequences[b, 82: 82 + len(want)].tolist() == want


def test_mean_accepted_length_counts_only_the_steps_a_row_took():
    # The same prompt decoded alone, twice as a queue served one row at a time, and twice in a
    # static batch: every row emits the same tokens in the same steps, so the tokens per pass
    # are the same. Rows waiting in the queue, rows that left it, and stopped rows kept in a
    # batch (drop_finished=False) take no step and must not count as one-token steps.
    target = cyclic_lm()
    prompt = [0, 12, 13, 14, 12, 13, 14, 12]
    method = specdec.PromptLookup(adaptive=False)
    alone = specdec.generate(target, torch.tensor([prompt]), max_new_tokens=MAX_NEW, method=method, batching=Batching(pace=False))
    per_pass = alone.stats.mean_accepted_length
    assert per_pass > 1.5  # the repetitive prompt is copied: several tokens per pass
    twice = torch.tensor([prompt, prompt])
    queue = specdec.generate(target, twice, max_new_tokens=MAX_NEW, method=method, batching=Batching(max_batch_size=1, pace=False))
    assert queue.stats.mean_accepted_length == pytest.approx(per_pass)
    assert sum(int(s.sum()) for s in queue.stats.stepped) == 2 * len(alone.stats.stepped)
    # A static batch whose rows stop at different steps: its figure is the two rows' own, pooled.
    other = specdec.generate(target, torch.tensor([prompt[:-1]]), max_new_tokens=MAX_NEW, method=method, batching=Batching(pace=False))
    rows = (alone.stats, other.stats)
    steps = sum(len(s.stepped) for s in rows)
    assert len(alone.stats.stepped) != len(other.stats.stepped)
    pooled = (sum(s.total_accepted for s in rows) + steps) / steps
    short = torch.tensor([prompt, [2] + prompt[:-1]])
    for drop in (True, False):
        batch = specdec.generate(target, short, attention_mask=(short != 2).long(), max_new_tokens=MAX_NEW,
                                 method=method, batching=Batching(pace=False, drop_finished=drop), pad_token_id=2)
        assert batch.stats.mean_accepted_length == pytest.approx(pooled)
