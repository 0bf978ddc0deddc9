"""Proposer helpers shared by the proposer, loop and model tests: random and oracle Medusa heads,
methods wrapped to record what their proposer sees, and every method by name."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import specdec
from specdec import Context, Method, Proposal, Proposer, StepResult
from support.decoding import METHODS, PROMPTS, hf_greedy
from support.models import tiny_lm
from support.passes import visible_forward

CHOICES = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def random_heads(target, num_heads=3, seed=0, scale=0.5):
    """Heads whose blocks are random: they propose varied, partly right candidates."""
    heads = specdec.MedusaHeads.for_target(target, num_heads, torch.arange(target.config.vocab_size))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale / p.shape[-1] ** 0.5)
    return heads


class OracleHeads(torch.nn.Module):
    """Stands in for trained heads: head k proposes what the target's greedy decoding of the
    committed text will emit k + 1 tokens later (read from a precomputed greedy run), as
    rank 0, then two wrong ids. Checks the alignment of hidden states, heads and tree depths."""

    def __init__(self, target, prompt, future):
        super().__init__()
        self.target, self.prompt, self.future = target, prompt, future
        self.hidden_to_pos = {}
        self.rank_accuracy = None
        self.num_heads = 3

    def attach(self, target):
        return self

    def topk(self, hidden, k):
        # Which position is this hidden state? Match it against a plain forward of the text.
        text = self.prompt + self.future
        with torch.no_grad():
            full = self.reference(torch.tensor([text]), output_hidden_states=True).hidden_states[-1][0]
        t = int((full - hidden[0]).abs().amax(-1).argmin())
        ids = torch.full((1, 3, k), 95)
        for head in range(3):
            nxt = t + head + 2  # head k (1-based k = head + 1) predicts token t + k + 1
            ids[0, head, 0] = text[nxt] if nxt < len(text) else 95
            ids[0, head, 1:] = torch.tensor([93, 94][: k - 1])
        return ids, torch.log_softmax(torch.arange(k, 0, -1).float(), 0).expand(1, 3, k)


def oracle_setup():
    """A tiny target, a prompt, the target's next 24 greedy tokens and oracle heads for them."""
    target = tiny_lm("llama", seed=31)
    prompt = PROMPTS[0]
    future = hf_greedy(target, prompt, 24)
    oracle = OracleHeads(target, prompt, future)
    oracle.reference = tiny_lm("llama", seed=31)
    return target, prompt, future, oracle


# METHODS and the methods that need no draft's sampling check there: Medusa and adaptive prompt lookup.


EVERY_METHOD = {**METHODS, "medusa": lambda draft: specdec.Medusa(random_heads(draft), tree=CHOICES),
                "prompt lookup": lambda draft: specdec.PromptLookup()}


@dataclass


class Recording(Method, Proposer):
    """Any method, its steps recorded as its proposer sees them, and the shape it chose for each
    (`specdec.loop.shape_choice`; None where it has no choice)."""

    inner: object
    steps: list = field(default_factory=list)
    shapes: list = field(default_factory=list)

    @property
    def max_pass_tokens(self):
        return self.inner.max_pass_tokens

    @property
    def models(self):
        return self.inner.models

    @property
    def needs_hidden_states(self):
        return self.inner.needs_hidden_states

    @property
    def needs_prompt_hidden_states(self):
        return self.inner.needs_prompt_hidden_states

    def start(self, target, ctx, prompt, prompt_len, max_length, first):
        self.proposer = self.inner.start(target, ctx, prompt, prompt_len, max_length, first)
        return self

    def propose(self, ctx):
        committed = [ctx.tokens[b, : int(n)].tolist() for b, n in enumerate(ctx.lengths)]
        self.steps.append([committed, self.proposer.propose(ctx), ctx.max_nodes])
        choice = getattr(self.proposer, "shape", None)
        self.shapes.append(None if choice is None else choice.current)
        return self.steps[-1][1]

    def update(self, ctx, step):
        self.steps[-1].append(step)
        self.proposer.update(ctx, step)


@dataclass


class Recorder(Method, Proposer):
    """A Lookahead whose steps are recorded: the committed tokens of every row when the step was
    proposed, the proposal, and the logits of the pass."""

    inner: specdec.Lookahead
    steps: list = field(default_factory=list)
    models = ()
    needs_hidden_states = False

    @property
    def max_pass_tokens(self):
        return self.inner.max_pass_tokens

    def start(self, target, ctx, prompt, prompt_len, max_length, first):
        self.proposer = self.inner.start(target, ctx, prompt, prompt_len, max_length, first)
        self.initial_levels = self.proposer.levels.clone()
        self.prompt_ctx = [ctx.tokens[b, : int(n)].tolist() for b, n in enumerate(ctx.lengths)]
        return self

    def propose(self, ctx: Context) -> Proposal:
        committed = [ctx.tokens[b, : int(n)].tolist() for b, n in enumerate(ctx.lengths)]
        self.steps.append([committed, self.proposer.propose(ctx), None])
        return self.steps[-1][1]

    def update(self, ctx: Context, step: StepResult) -> None:
        self.steps[-1][2] = step.logits.clone()
        self.steps[-1].append([ctx.tokens[b, : int(n)].tolist() for b, n in enumerate(ctx.lengths)])
        self.proposer.update(ctx, step)


def assert_nodes_compute_what_they_see(model, recorder, steps, rtol=1e-4, atol=5e-5):
    """Every real node of the first ``steps`` passes against a plain forward over the committed
    tokens and the nodes its attention mask shows, at the positions the proposal gives."""
    kinds = set()
    for committed, proposal, logits, _ in recorder.steps[:steps]:
        for b, row in enumerate(committed):
            nodes = proposal.tokens[b].tolist()
            real = [i for i, token in enumerate(nodes) if token >= 0]
            want = visible_forward(model, row[:-1], nodes, proposal.position_ids[b].tolist(),
                                   proposal.attention_mask[b, real].tolist())
            # Summation orders differ (fp32, ~1e-5); a wrong mask or position moves logits by O(1).
            torch.testing.assert_close(logits[b, real], want, rtol=rtol, atol=atol)
            kinds |= {"candidate" if proposal.candidates[b, i] and i else "window" if i else "root" for i in real}
    return kinds


class CostsAtStart(specdec.PromptLookup):
    """Prompt lookup that records the target's cost points it starts with."""

    def start(self, target, ctx, *args):
        self.costs_at_start = dict(ctx.costs.target_ms)
        return super().start(target, ctx, *args)
