"""A synthetic clock for the loop's timing-driven policies, so that tests do not depend on the
machine or its load."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace

import torch

# The modules whose ``time.perf_counter`` sizes passes or paces batches.
TIMED_MODULES = ("specdec.loop.run", "specdec.loop.shape_choice", "specdec.proposers.draft.proposer",
                 "specdec.proposers.draft.lookup", "specdec.proposers.ensemble", "specdec.proposers.eagle.proposer")


class SyntheticClock:
    """Stands in for ``time.perf_counter`` in the timed modules: it advances only by the
    synthetic costs of the passes that run: ``target_ms(tokens)`` for a target pass over that
    many tokens (every row's nodes), ``draft_ms`` for a draft pass."""

    def __init__(self, target: torch.nn.Module, drafts: Sequence[torch.nn.Module] = (),
                 target_ms: Callable[[int], float] = lambda tokens: 10.0 + tokens, draft_ms: float = 3.0) -> None:
        self.now = 0.0
        # On the decoder: a pass that hands over hidden states runs it without the LM's forward.
        self.hooks = [target.get_decoder().register_forward_pre_hook(
            lambda _, args, kw: self.advance(target_ms(_tokens(args, kw))), with_kwargs=True)]
        self.hooks += [d.register_forward_pre_hook(lambda *_: self.advance(draft_ms)) for d in drafts]

    def advance(self, ms: float) -> None:
        self.now += ms / 1e3

    def perf_counter(self) -> float:
        return self.now

    def install(self, monkeypatch) -> SyntheticClock:
        """Replaces ``time`` in the timed modules for the test (``monkeypatch`` undoes it)."""
        import importlib

        for name in TIMED_MODULES:
            monkeypatch.setattr(importlib.import_module(name), "time", SimpleNamespace(perf_counter=self.perf_counter))
        return self

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()


def _tokens(args: tuple, kw: dict) -> int:
    """Tokens of a decoder call: its ``input_ids``, else its ``inputs_embeds``, else its first
    positional argument (``[B, n]`` or ``[B, n, H]``)."""
    x = kw.get("input_ids")
    x = kw.get("inputs_embeds") if x is None else x
    x = args[0] if x is None else x
    return x.shape[0] * x.shape[1]
