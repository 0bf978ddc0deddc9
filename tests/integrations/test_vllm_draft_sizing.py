"""How specdec's vLLM proposers size their drafts: the step prices fitted from the intervals
between ``propose`` calls, acceptance by match length and position, the batch's best lengths,
exploration. Runs without vLLM: the proposers get a stand-in for vLLM's config, a simulated
engine (drafts verified against a known output) and a simulated clock that each step advances
by what it costs (121 ms, 53 ms more with drafts, 13 ms per draft token: vLLM's CPU build); no
figure here depends on wall time."""

import itertools
from types import SimpleNamespace as NS

import numpy as np
import pytest

from specdec.integrations.vllm import prompt_lookup
from specdec.integrations.vllm.acceptance import Acceptance
from specdec.integrations.vllm.lengths import best_lengths
from specdec.integrations.vllm.step_cost import StepCost
from specdec.vllm import Lookahead, PromptLookup

K = 8
BASE, DRAFTED, PER_TOKEN = 121.0, 53.0, 13.0


def step_ms(tokens):
    return BASE + (DRAFTED + PER_TOKEN * tokens if tokens else 0.0)


@pytest.fixture(autouse=True)
def _no_vllm_needed(monkeypatch):
    """The proposers check vLLM's version when built; these tests run without vLLM."""
    monkeypatch.setattr(prompt_lookup, "check_vllm_version", lambda: None)


def config(max_model_len=4096, **options):
    return NS(speculative_config=NS(num_speculative_tokens=K),
              model_config=NS(max_model_len=max_model_len, get_vocab_size=lambda: 5000),
              additional_config={"specdec": options})


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Engine:
    """vLLM's side of the ``custom_class`` protocol, simulated: rows whose target output is
    known, each draft accepted as far as it agrees with it, the clock advanced by each step's
    price. ``trace``: (output position, draft length) per row and step."""

    def __init__(self, proposer, clock, prompts, outputs, max_model_len=4096):
        self.proposer, self.clock, self.outputs = proposer, clock, outputs
        self.rows = [list(p) + [o[0]] for p, o in zip(prompts, outputs)]  # the prefill sampled one
        self.done = [1] * len(outputs)
        self.sampled = [[o[0]] for o in outputs]
        self.max_model_len = max_model_len
        self.trace = [[] for _ in outputs]
        self.steps = 0

    def step(self):
        token_ids = np.zeros((len(self.rows), self.max_model_len), dtype=np.int32)
        num_tokens = np.array([len(r) for r in self.rows], dtype=np.int32)
        for i, row in enumerate(self.rows):
            token_ids[i, : len(row)] = row
        drafts = self.proposer.propose(self.sampled, num_tokens, token_ids)
        assert len(drafts) == len(self.rows)
        for i, (draft, out) in enumerate(zip(drafts, self.outputs)):
            assert len(draft) <= min(K, self.max_model_len - len(self.rows[i]))
            truth = out[self.done[i]:]
            accepted = next((j for j, (d, t) in enumerate(zip(draft, truth)) if d != t), min(len(draft), len(truth)))
            self.trace[i].append((self.done[i], len(draft)))
            self.sampled[i] = truth[: accepted + 1]
            self.rows[i] += self.sampled[i]
            self.done[i] += len(self.sampled[i])
        self.clock.now += step_ms(sum(map(len, drafts))) / 1000.0
        self.steps += 1

    def run(self):
        while all(d < len(o) for d, o in zip(self.done, self.outputs)):
            self.step()
        return self


def edit_text(seed=0, segments=12, decoys=3):
    """A prompt of distinct tokens and an output alternating copies of 30 prompt tokens (after
    their first 3 tokens, a 3-token match finds a right copy) with stretches of new tokens holding
    ``decoys`` pairs of consecutive prompt tokens (a 2-token match whose copy is wrong). Returns
    the prompt, the output, the positions in the output just after a decoy pair, and the
    positions 3 or more tokens into a copy with K or more left."""
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.permutation(1000)[:300]]
    fresh = itertools.count(1000)
    out, decoy_at, copy_at = [next(fresh)], [], []
    for _ in range(segments):
        j = int(rng.integers(0, len(prompt) - 30))
        copy_at += [len(out) + k for k in range(3, 30 - K + 1)]
        out += prompt[j: j + 30]
        for _ in range(decoys):
            i = int(rng.integers(0, len(prompt) - 2))
            out += [next(fresh), prompt[i], prompt[i + 1]]
            decoy_at.append(len(out))
        out.append(next(fresh))
    return prompt, out, decoy_at, copy_at


def lengths_at(trace, positions):
    positions = set(positions)
    return [n for at, n in trace if at in positions]


def ms_per_token(adaptive, proposer_type=PromptLookup, seed=0):
    clock = Clock()
    prompt, out, _, _ = edit_text(seed)
    engine = Engine(proposer_type(config(adaptive=adaptive), clock=clock), clock, [prompt], [out]).run()
    return 1000.0 * clock.now / engine.done[0], engine


# -- the step prices ---------------------------------------------------------------------------

def test_the_step_prices_are_recovered_from_intervals_despite_an_outlier():
    rng = np.random.default_rng(1)
    cost = StepCost()
    for step in range(120):
        tokens = int(rng.choice([0, 0, 1, 3, 5, 8]))
        ms = step_ms(tokens) * rng.uniform(0.98, 1.02)
        cost.observe(tokens, 20 * ms if step == 60 else ms)  # the machine paused once
    assert cost.base == pytest.approx(BASE, rel=0.03)
    assert cost.drafted == pytest.approx(DRAFTED, rel=0.1)
    assert cost.per_token == pytest.approx(PER_TOKEN, rel=0.1)


def test_the_step_prices_follow_a_machine_that_slows_down():
    cost = StepCost()
    for tokens in (0, 2, 8) * 20:
        cost.observe(tokens, step_ms(tokens))
    for tokens in (0, 2, 8) * 30:
        cost.observe(tokens, 2 * step_ms(tokens))  # each step at most OUTLIER times its price counts
    assert cost.ms(0) == pytest.approx(2 * BASE, rel=0.05) and cost.ms(8) == pytest.approx(2 * step_ms(8), rel=0.05)


def test_steps_that_always_carry_drafts_still_price_every_kind_of_step():
    cost = StepCost()
    for tokens in (4, 8) * 30:
        cost.observe(tokens, step_ms(tokens))
    # base and drafted are not told apart by such steps: the prior splits them, the sum is measured
    assert cost.ms(4) == pytest.approx(step_ms(4), rel=0.01) and cost.ms(8) == pytest.approx(step_ms(8), rel=0.01)
    assert 0 < cost.ms(0) < cost.ms(4)


# -- acceptance and the batch's lengths --------------------------------------------------------

def test_a_longer_match_is_trusted_more_and_a_request_leans_on_the_others_until_it_has_its_own():
    shared = Acceptance(keys=4, positions=K, decay=0.98)
    for _ in range(20):
        shared.observe(key=3, proposed=K, accepted=K)
        shared.observe(key=2, proposed=K, accepted=0)
    new = Acceptance(keys=4, positions=K, decay=0.9)
    assert new.gains(3, shared, K)[-1] > 0.8 and new.gains(2, shared, K)[0] < 0.2
    for _ in range(10):  # this request's 2-token matches are right
        new.observe(key=2, proposed=K, accepted=K)
    assert new.gains(2, shared, K)[0] > 0.7


def test_the_best_lengths_are_the_best_of_every_choice():
    rng = np.random.default_rng(2)
    cost = StepCost()
    for tokens in (0, 3, 8) * 10:
        cost.observe(tokens, step_ms(tokens))
    for _ in range(200):
        rows = int(rng.integers(1, 4))
        gains = [np.cumprod(rng.uniform(0.2, 1.0, size=int(rng.integers(0, 5)))) for _ in range(rows)]
        best = best_lengths(gains, rows, cost)

        def rate(lengths):
            return (rows + sum(g[:n].sum() for g, n in zip(gains, lengths))) / cost.ms(sum(lengths))

        every = itertools.product(*(range(len(g) + 1) for g in gains))
        assert rate(best) == pytest.approx(max(map(rate, every)))
        assert all(0 <= n <= len(g) for n, g in zip(best, gains))


# -- the proposers in a simulated engine -------------------------------------------------------

def test_doubtful_drafts_are_dropped_and_long_accurate_copies_kept():
    clock = Clock()
    prompt, out, decoy_at, copy_at = edit_text()
    engine = Engine(PromptLookup(config(), clock=clock), clock, [prompt], [out]).run()
    half = len(out) // 2  # after the proposer has learnt
    decoys = lengths_at(engine.trace[0], [p for p in decoy_at if p > half])
    copies = lengths_at(engine.trace[0], [p for p in copy_at if p > half])
    assert len(decoys) >= 15 and len(copies) >= 10
    assert np.mean([n > 0 for n in decoys]) <= 0.25  # proposed only to keep measuring
    assert np.mean([n == K for n in copies]) >= 0.9


@pytest.mark.parametrize("proposer_type", [PromptLookup, Lookahead])
def test_sized_drafts_emit_more_tokens_per_ms_than_whole_ones(proposer_type):
    for seed in (0, 1):
        sized, _ = ms_per_token(True, proposer_type, seed)
        whole, _ = ms_per_token(False, proposer_type, seed)
        assert sized < 0.97 * whole


@pytest.mark.parametrize("chunked", [False, True])
def test_the_proposer_prices_steps_from_its_own_intervals_and_skips_prefills(chunked):
    clock = Clock()
    prompt, out, _, _ = edit_text()
    proposer = PromptLookup(config(), clock=clock)
    engine = Engine(proposer, clock, [prompt], [out])
    for _ in range(40):
        engine.step()
    cost = proposer.sizer.cost
    assert cost.ms(0) == pytest.approx(BASE, rel=0.05) and cost.ms(K) == pytest.approx(step_ms(K), rel=0.05)
    observed = cost.count
    # A request joins; its prefill (5 s more) runs in the next step, which is not priced.
    engine.outputs.append(out)
    engine.trace.append([])
    if chunked:  # vLLM prefills it in two chunks: the first step samples nothing for it
        engine.rows.append(list(prompt))
        engine.done.append(0)
        engine.sampled.append([])
        engine.step()
        assert engine.trace[1][0][1] == 0  # a row that sampled nothing gets no draft
    else:
        engine.rows.append(list(prompt) + [out[0]])
        engine.done.append(1)
        engine.sampled.append([out[0]])
    clock.now += 5.0
    engine.step()
    engine.step()
    assert cost.count == observed + 1 and cost.ms(0) == pytest.approx(BASE, rel=0.05)


class LoadedEngine(Engine):
    """An engine on a machine whose load slows each step by a random factor between 1 and 4."""

    def __init__(self, *args, seed=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.load = np.random.default_rng(seed)

    def step(self):
        start = self.clock.now
        super().step()
        self.clock.now = start + (self.clock.now - start) * self.load.uniform(1.0, 4.0)


@pytest.mark.parametrize("proposer_type", [PromptLookup, Lookahead])
def test_untimed_drafts_follow_the_text_alone_whatever_the_load(proposer_type):
    prompt, out, decoy_at, _ = edit_text()

    def trace(timed, engine_type, **kwargs):
        clock = Clock()
        engine = engine_type(proposer_type(config(timed=timed), clock=clock), clock, [prompt], [out], **kwargs)
        engine.run()
        assert (engine.proposer.sizer.cost.count == 0) == (not timed)
        return engine.trace[0]

    idle, timed_idle = trace(False, Engine), trace(True, Engine)
    assert all(trace(False, LoadedEngine, seed=seed) == idle for seed in (0, 1))
    assert any(trace(True, LoadedEngine, seed=seed) != timed_idle for seed in (0, 1))  # timed: they move
    if proposer_type is PromptLookup:  # still sized, at the prior's prices
        decoys = lengths_at(idle, [p for p in decoy_at if p > len(out) // 2])
        assert len(decoys) >= 15 and np.mean([n > 0 for n in decoys]) <= 0.25


def test_a_proposer_whose_drafts_fail_keeps_trying_every_explore_every_cut_steps():
    clock = Clock()
    prompt, out, decoy_at, _ = edit_text(segments=6, decoys=40)
    proposer = PromptLookup(config(explore_every=5), clock=clock)
    engine = Engine(proposer, clock, [prompt], [out]).run()
    tried = lengths_at(engine.trace[0], decoy_at[len(decoy_at) // 2:])
    proposed = sum(n > 0 for n in tried)
    assert len(tried) >= 100 and len(tried) / 5 - 3 <= proposed <= len(tried) / 5 + 3


def test_drafts_stay_within_the_limits_and_fixed_lengths_are_whole():
    clock = Clock()
    prompt, out, _, _ = edit_text(segments=3)
    for proposer_type, adaptive in itertools.product((PromptLookup, Lookahead), (True, False)):
        # the model length ends the run: the engine checks every draft against the room left
        room = len(prompt) + 60
        engine = Engine(proposer_type(config(max_model_len=room, adaptive=adaptive), clock=clock), clock,
                        [prompt], [out[:60]], max_model_len=room).run()
        assert engine.done[0] == 60
    whole = Engine(PromptLookup(config(adaptive=False), clock=clock), clock, [prompt], [out]).run()
    assert all(n == len(prompt_lookup_draft(prompt + out[:at])) for at, n in whole.trace[0])


def prompt_lookup_draft(tokens, n_max=4, n_min=2):
    """What the copy after the longest matching suffix (earliest occurrence) holds, up to K."""
    for n in range(n_max, n_min - 1, -1):
        suffix = tokens[-n:]
        for p in range(len(tokens) - n):
            if tokens[p: p + n] == suffix:
                return tokens[p + n: p + n + K]
    return []


@pytest.mark.parametrize("options, message", [
    ({"explore_every": 1}, "explore_every must be >= 2"),
    ({"explore_every": "8"}, "option 'explore_every' must be a int"),
    ({"min_gain": 0.2}, "unknown option 'min_gain'"),
])
def test_a_bad_sizing_option_is_named(options, message):
    with pytest.raises(ValueError, match=f"specdec.vllm.PromptLookup: {message}"):
        PromptLookup(config(**options))


def test_bad_estimator_settings_are_refused():
    with pytest.raises(ValueError, match="forget must be in"):
        StepCost(forget=0.0)
    with pytest.raises(ValueError, match="prior_weight must be > 0"):
        StepCost(prior_weight=0.0)
    with pytest.raises(ValueError, match="decay must be in"):
        Acceptance(keys=2, positions=K, decay=1.5)


@pytest.mark.parametrize("module", ["acceptance", "lengths", "step_cost"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"specdec.integrations.vllm.{module}"))
    assert result.attempted > 0 and result.failed == 0
