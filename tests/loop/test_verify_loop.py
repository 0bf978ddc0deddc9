"""The general verify loop: proposals with their own attention pattern and positions, nodes that
are computed but not verified, what a step hands the proposer, padding, seeded sampling,
typical acceptance, long prompts."""

from dataclasses import dataclass, field

import pytest
import torch
from support.clock import SyntheticClock
from support.decoding import assert_greedy_identity, hf_greedy, left_padded, PROMPTS
from support.models import perturbed, tiny_lm
from support.passes import visible_forward
from support.proposers import Recording

import specdec
from specdec import Context, Method, Proposal, Proposer, StepResult


@dataclass
class ProbeMethod(Method, Proposer):
    """Proposes root -> two wrong candidates, plus two nodes that are NOT candidates: node 3
    holds the target's true next token (it would be accepted if it were verified), sees only the
    root and itself, and sits at the root's position + 1; node 4 sees the root, node 3 and
    itself, at a gap position (+3). Checks in update that every node's logits equal a plain
    forward over what the node sees, at the positions given."""

    reference: torch.nn.Module  # a copy of the target (the target runs tree attention meanwhile)
    truth: list[int]
    checked: list[int] = field(default_factory=list)

    max_pass_tokens = 5
    models = ()
    needs_hidden_states = False

    def start(self, target, ctx, prompt, prompt_len, max_length, first):
        return self

    MASK = torch.tensor([[1, 0, 0, 0, 0],
                         [1, 1, 0, 0, 0],
                         [1, 1, 1, 0, 0],
                         [1, 0, 0, 1, 0],
                         [1, 0, 0, 1, 1]], dtype=torch.bool)
    OFFSETS = [0, 1, 2, 1, 3]

    def propose(self, ctx: Context) -> Proposal:
        n = int(ctx.lengths[0])
        root = int(ctx.tokens[0, n - 1])
        truth = self.truth[n - self.prompt_len] if n - self.prompt_len < len(self.truth) else 0
        wrong = (truth + 1) % 96
        tokens = torch.tensor([[root, wrong, wrong, truth, 7]])
        parents = torch.tensor([[-1, 0, 1, 0, 0]])
        positions = torch.tensor([[n - 1 + o for o in self.OFFSETS]])
        self.last = (ctx.tokens[0, : n - 1].tolist(), tokens[0].tolist(), positions[0].tolist())
        return Proposal(tokens, parents, attention_mask=self.MASK[None].clone(), position_ids=positions,
                        candidates=torch.tensor([[True, True, True, False, False]]))

    def update(self, ctx: Context, step: StepResult) -> None:
        committed, tokens, positions = self.last
        assert step.accept_len.tolist() == [0]  # the candidates are wrong, the truth not verified
        want = visible_forward(self.reference, committed, tokens, positions, self.MASK.tolist())
        # Summation order differs (fp32, ~1e-5); a wrong mask or position moves logits by O(1).
        torch.testing.assert_close(step.logits[0, :5], want, rtol=1e-4, atol=5e-5)
        self.checked.append(len(committed))


def test_custom_mask_positions_and_nodes_that_are_not_verified():
    target = tiny_lm("llama", seed=11)
    prompt = PROMPTS[0]
    truth = hf_greedy(target, prompt, 6)
    method = ProbeMethod(tiny_lm("llama", seed=11), truth)
    method.prompt_len = len(prompt)
    out = specdec.generate(target, torch.tensor([prompt]), max_new_tokens=6, method=method, eos_token_id=[])
    assert out.sequences[0, len(prompt):].tolist() == truth
    assert len(method.checked) == 5  # every step after the prefill was checked
    # Only candidates count as proposed: two per step, none accepted.
    assert [int(p) for p in out.stats.proposed] == [2] * 5
    assert out.stats.total_accepted == 0


@dataclass
class HiddenProbe(Method, Proposer):
    """A chain of the target's own greedy tokens; records the hidden states it is handed."""

    target: torch.nn.Module
    seen: list = field(default_factory=list)
    max_pass_tokens = 4
    models = ()
    needs_hidden_states = True

    def start(self, target, ctx, prompt, prompt_len, max_length, first):
        self.seen.append((ctx.tokens[:, : int(prompt_len[0])].clone(), first.proposal, first.hidden))
        return self

    def propose(self, ctx):
        n = int(ctx.lengths[0])
        tokens = torch.cat([ctx.roots(), torch.tensor([[5, 6, 7]])], 1)
        self.context = ctx.tokens[:, : n - 1].clone()
        return Proposal(tokens, torch.tensor([[-1, 0, 1, 2]]))

    def update(self, ctx, step):
        self.seen.append((self.context, step.proposal, step.hidden))


def test_hidden_states_are_the_models_own_last_layer():
    target = tiny_lm("qwen2", seed=12)
    probe = HiddenProbe(target)
    specdec.generate(target, torch.tensor([PROMPTS[2]]), max_new_tokens=5, method=probe, eos_token_id=[])
    assert len(probe.seen) >= 2
    for context, proposal, hidden in probe.seen:
        # The prefill hands the prompt's last position: its context is the whole prompt.
        nodes = proposal.tokens if proposal.width > 1 else torch.zeros(1, 0, dtype=torch.long)
        with torch.no_grad():
            full = target(torch.cat([context, nodes], 1), output_hidden_states=True).hidden_states[-1]
        want = full[:, -max(1, nodes.shape[1]):]
        assert hidden.shape == want.shape
        torch.testing.assert_close(hidden, want, rtol=1e-5, atol=1e-5)


@dataclass
class Padded(Method, Proposer):
    """PromptLookup's proposals padded with 20 trailing -1 nodes."""

    inner: specdec.PromptLookup
    widths: list[int] = field(default_factory=list)
    models = ()
    needs_hidden_states = False

    @property
    def max_pass_tokens(self):
        return self.inner.max_pass_tokens + 20

    def start(self, *args):
        self.proposer = self.inner.start(*args)
        return self

    def propose(self, ctx):
        p = self.proposer.propose(ctx)
        pad = torch.full((p.tokens.shape[0], 20), -1)
        return Proposal(torch.cat([p.tokens, pad], 1), torch.cat([p.parents, pad.clamp_min(0)], 1))

    def update(self, ctx, step):
        self.widths.append(step.proposal.width)
        self.proposer.update(ctx, step)


def test_trailing_padding_is_not_computed_on_cpu():
    target = tiny_lm("llama", seed=3)
    method = Padded(specdec.PromptLookup(adaptive=False, num_draft_tokens=4))
    assert_greedy_identity(target, PROMPTS, method)
    assert method.widths and max(method.widths) <= 1 + 4 + 2 * 4  # never the 20 padding nodes


@dataclass
class FirstRowChains(Method, Proposer):
    """Proposes three wrong candidates for row 0 and nothing for the other rows; records the
    width of every pass as run and which rows had stopped."""

    widths: list = field(default_factory=list)
    max_pass_tokens = 4
    models = ()
    needs_hidden_states = False

    def start(self, target, ctx, prompt, prompt_len, max_length, first):
        return self

    def propose(self, ctx):
        tokens = torch.full((ctx.tokens.shape[0], 4), -1)
        tokens[:, 0] = ctx.roots()[:, 0]
        tokens[0, 1:] = 95  # a chain the tiny model never takes
        return Proposal(tokens, torch.arange(-1, 3).expand_as(tokens))

    def update(self, ctx, step):
        self.widths.append((step.proposal.width, bool(ctx.finished[0])))


def test_rows_that_stopped_propose_nothing():
    # Row 0 stops at its EOS after 3 tokens; its candidates would keep every later pass 4 wide.
    target = tiny_lm("llama", seed=3)
    eos = hf_greedy(target, PROMPTS[0], 24, eos=[])[2]
    method = FirstRowChains()
    assert_greedy_identity(target, PROMPTS[:2], method, eos=eos)
    stopped = [width for width, done in method.widths if done]
    assert method.widths[0][0] == 4 and len(stopped) > 5 and set(stopped[1:]) == {1}


def test_a_batch_prices_a_pass_by_all_its_tokens():
    from specdec.loop.cost_model import AcceptanceEstimate, CostModel

    profile = {1: 50.0, 2: 51.0, 4: 53.0, 8: 60.0, 16: 110.0, 32: 220.0}  # one row over k tokens
    likely = AcceptanceEstimate(prior=0.6)
    assert CostModel(profile).best_length(likely, 8) > 2  # one row: candidates are nearly free
    assert CostModel(profile, rows=8).best_length(likely, 8) == 0  # 8 rows: 8 tokens per candidate
    # Measured passes are kept by tokens, so one row's profile and a batch's passes combine.
    costs = CostModel(dict(profile), rows=4)
    costs.observe_target(2, 70.0)
    assert costs.target_ms[8] == pytest.approx(0.8 * 60.0 + 0.2 * 70.0) and costs.target(2) == costs.target_ms[8]


def test_costs_known_only_for_wide_passes_do_not_keep_passes_wide():
    from specdec.loop.cost_model import AcceptanceEstimate, CostModel

    # Only a 33-token pass measured so far: narrower passes are priced by their tokens (then
    # tried and measured), not as dear as the wide one, which would pick the widest forever.
    costs = CostModel({33: 330.0})
    assert costs.target(1) == pytest.approx(10.0)
    assert costs.best_length(AcceptanceEstimate(prior=0.5), 32) < 32


def test_passes_wider_than_any_measured_follow_the_trend():
    from specdec.loop.cost_model import CostModel

    # On a CPU costs keep rising past the widest profiled pass (15 ms per token from 16 to 32
    # here): nodes added to a long copy, or a batch's rows x nodes, are not free.
    cpu = {1: 400.0, 16: 570.0, 32: 810.0}
    assert CostModel(cpu).target(48) == pytest.approx(810.0 + 16 * 15.0)
    assert CostModel(cpu).target(64) > CostModel(cpu).target(48) > CostModel(cpu).target(32)
    assert CostModel(cpu, rows=8).target(5) == pytest.approx(810.0 + 8 * 15.0)  # 40 tokens
    # Flat costs (a GPU) stay flat, a falling trend (noise) is not extended down, and with one
    # known point (no trend) a pass one node wider costs as much, a wider one by its tokens.
    assert CostModel({1: 10.0, 32: 10.0}).target(100) == 10.0
    assert CostModel({1: 10.0, 16: 30.0, 32: 25.0}).target(64) == 25.0
    assert CostModel({33: 330.0}).target(34) == 330.0 and CostModel({33: 330.0}).target(66) == 660.0


SAMPLING = dict(do_sample=True, temperature=0.9, top_p=0.95)


def sample(target, prompts, method, seed, **kw):
    ids, mask = (t.to(target.device) for t in left_padded(prompts))
    return specdec.generate(target, ids, max_new_tokens=20, method=method, attention_mask=mask,
                            generator=torch.Generator().manual_seed(seed), eos_token_id=[],
                            pad_token_id=2, **SAMPLING, **kw).sequences


def test_seeded_sampling_emits_what_one_token_decoding_emits_whatever_the_method(device):
    target = tiny_lm("llama", seed=13, init=0.15)
    draft = perturbed(target, 0.2, 1).to(device)
    target = target.to(device)
    plain = sample(target, PROMPTS, None, seed=5)
    methods = [specdec.PromptLookup(), specdec.PromptLookup(adaptive=False, num_draft_tokens=7),
               specdec.DraftModel(draft, 3), specdec.DraftModel(draft, adaptive=True),
               specdec.DraftModel(draft, 3, tree="dynamic", top_k=3), specdec.DraftModel(draft, adaptive=True, tree="dynamic", top_k=2),
               specdec.DraftModel(draft, 3, lookup=3), specdec.DraftModel(draft, adaptive=True, lookup=4)]
    for method in methods:
        assert torch.equal(sample(target, PROMPTS, method, seed=5), plain), method
    assert not torch.equal(sample(target, PROMPTS, None, seed=6), plain)  # the seed matters


def test_rejection_sampled_drafts_reproduce_with_the_same_seed():
    target = tiny_lm("llama", seed=14, init=0.15)
    method = specdec.DraftModel(perturbed(target, 0.3, 2), 3, coupled=False)
    assert torch.equal(sample(target, PROMPTS[:2], method, 3), sample(target, PROMPTS[:2], method, 3))


def test_typical_acceptance_is_lossy_and_accepts_more():
    target = tiny_lm("llama", seed=15, init=0.15)
    ids = torch.tensor([PROMPTS[2]])
    method = specdec.PromptLookup(adaptive=False, num_draft_tokens=4)
    gen = lambda **kw: specdec.generate(target, ids, max_new_tokens=40, method=method, eos_token_id=[],
                                        generator=torch.Generator().manual_seed(0), **SAMPLING, **kw)
    exact = gen()
    lossy = gen(typical=specdec.TypicalAcceptance(posterior_threshold=0.01, posterior_alpha=0.01))
    assert lossy.stats.acceptance_rate > exact.stats.acceptance_rate
    with pytest.raises(ValueError, match="do_sample"):
        specdec.generate(target, ids, max_new_tokens=4, typical=specdec.TypicalAcceptance())
    # eos_token_id=[] and a seed: a first token drawn as EOS (about 1 unseeded run in 130) would
    # end the row before any step drafts, and the check is made on the drafted step.
    with pytest.raises(ValueError, match="deterministic"):
        specdec.generate(target, ids, max_new_tokens=4, method=specdec.DraftModel(target, 2, coupled=False),
                         typical=specdec.TypicalAcceptance(), eos_token_id=[],
                         generator=torch.Generator().manual_seed(0), **SAMPLING)


def test_long_prompts_with_a_prefix_and_ragged_rows():
    # Chains of 16+ tokens go through fused SDPA: a first chunk, then a second after it.
    from specdec.model.attention import tree_attention_enabled
    from specdec.model.prefill import prefill

    target = tiny_lm("qwen2", seed=16)
    gen = torch.Generator().manual_seed(0)
    first = torch.randint(3, 96, (2, 20), generator=gen)
    second = torch.randint(3, 96, (2, 18), generator=gen)
    with torch.no_grad(), tree_attention_enabled(target):
        cache = specdec.SpecCache.for_model(target, 2, 64)
        prefill(target, cache, first, torch.tensor([20, 17]))
        got = prefill(target, cache, second, torch.tensor([18, 16]))
    target.set_attn_implementation("sdpa")
    for b, (n1, n2) in enumerate([(20, 18), (17, 16)]):
        with torch.no_grad():
            want = target(torch.cat([first[b:b + 1, :n1], second[b:b + 1, :n2]], 1)).logits[0, -1]
        torch.testing.assert_close(got[b], want, rtol=1e-5, atol=1e-5)


def test_default_prompt_lookup_and_long_prompts_greedy_identity():
    target = tiny_lm("llama", seed=17)
    gen = torch.Generator().manual_seed(1)
    long = torch.randint(3, 96, (40,), generator=gen).tolist()
    prompts = [long + long[:10], PROMPTS[0], long[:25]]
    out = assert_greedy_identity(target, prompts, specdec.PromptLookup())
    assert out.stats.total_accepted > 0


def test_bad_inputs_get_clear_errors():
    target = tiny_lm("llama")
    with pytest.raises(ValueError, match="attention_mask"):
        specdec.generate(target, torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 2))
    small = tiny_lm("llama", vocab=64)
    with pytest.raises(ValueError, match="64 token ids, the target 96"):
        specdec.generate(target, torch.tensor([[1, 2, 3]]), method=specdec.DraftModel(small))
    other_eos = tiny_lm("llama")
    other_eos.config.eos_token_id = 5
    with pytest.raises(ValueError, match="eos_token_id"):
        specdec.generate(target, torch.tensor([[1, 2, 3]]), method=specdec.DraftModel(other_eos))
    # Padding rows past a shared tokenizer are fine when said so; the draft then stays below it.
    bigger = tiny_lm("llama", vocab=100)
    out = specdec.generate(target, torch.tensor([[1, 2, 3]]), max_new_tokens=5,
                           method=specdec.DraftModel(bigger, shared_vocab=90))
    assert torch.equal(out.sequences[0, 3:], torch.tensor(hf_greedy(target, [1, 2, 3], 5)))


def test_a_batch_falls_back_to_one_token_passes_while_they_are_faster(monkeypatch):
    """A draft that never agrees: its steps advance the slowest row 1 token, like a one-token
    step, and cost its 4 draft passes and a wider target pass on top (synthetic costs: about 29
    ms against 12). After measuring both kinds of step, the batch takes one-token steps and
    proposes only on the steps that keep that estimate current (one in EXPLORE_EVERY). One row
    is never paced: its methods size themselves from the pass costs."""
    from specdec.loop.cost_model import EXPLORE_EVERY

    target = tiny_lm("llama", seed=3)
    for rows, max_new in ((2, 48), (1, 24)):
        draft = tiny_lm("llama", seed=123)
        clock = SyntheticClock(target, [draft]).install(monkeypatch)
        stranger = Recording(specdec.DraftModel(draft, 4))
        try:
            out = assert_greedy_identity(target, PROMPTS[:rows], stranger, max_new=max_new, pace=True)
        finally:
            clock.remove()
        budgets = [budget for _, _, budget, _ in stranger.steps]
        if rows == 1:
            assert all(budget is None for budget in budgets)
            continue
        assert budgets[:2] == [None, None]  # measured first
        later = budgets[16:]
        assert len(later) > 20 and later.count(None) <= -(-len(later) // EXPLORE_EVERY)
        assert out.stats.total_proposed > 0  # and it keeps trying now and then


def test_slow_spells_do_not_take_a_width_out_of_use():
    from specdec.loop.cost_model import OUTLIER, AcceptanceEstimate, CostModel

    # Estimates seen after one slow spell of the VM (ms; profile 59-60 up to 4 tokens).
    profile = {1: 59.0, 2: 59.0, 4: 59.0, 8: 73.0, 16: 109.0, 32: 152.0}
    costs = CostModel(dict(profile), draft_ms_per_token=10.0)
    likely = AcceptanceEstimate(prior=0.95)
    before = costs.best_length(likely, 8)
    for k, ms in ((2, 125.0), (4, 88.0), (5, 103.0)):
        costs.observe_target(k, ms)
    # One slow pass moves an estimate by at most its clipped share, and never above a wider pass.
    assert costs.target_ms[2] == pytest.approx(0.8 * 59.0 + 0.2 * OUTLIER * 59.0)
    assert costs.target(5) <= costs.target(8) == 73.0
    assert all(costs.target(k) <= costs.target(k + 1) for k in range(1, 40))
    assert costs.best_length(likely, 8) == before
    # A chain extended draft by draft still goes past 3 drafts (a 5-token pass priced at the
    # 103 ms measured would stop it there, though 7 drafts pay best).
    assert all(costs.extend_pays(d, likely.expected(d), 0.95 ** (d + 1)) for d in range(1, 7))
    # The draft's cost too.
    costs.observe_draft(200.0)
    assert costs.draft_ms_per_token == pytest.approx(0.8 * 10.0 + 0.2 * OUTLIER * 10.0)
