"""What `generate` returns: the sequences and per-step statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from specdec.model.prompt_plan import SharedPrefix


@dataclass
class GenerateStats:
    """Per-step and total statistics of one `generate` call."""

    proposed: list[Tensor] = field(default_factory=list)  # per step: [B] candidates proposed
    accepted: list[Tensor] = field(default_factory=list)  # per step: [B] candidates accepted
    # per step: [B] bool, the rows that took part (in the batch and not stopped): rows waiting
    # in a queue, rows that left it and stopped rows kept in the batch did not.
    stepped: list[Tensor] = field(default_factory=list)
    target_forwards: int = 0     # target passes, the prefill included
    new_tokens: int = 0          # tokens generated, all rows
    wall_time_s: float = 0.0
    prefill_time_s: float = 0.0  # the prompts' passes (included in wall_time_s)
    # Groups of rows whose common leading prompt tokens were computed once (share_prefix).
    shared_prefixes: tuple[SharedPrefix, ...] = ()
    # Prompt tokens whose target cache entries rows joining the batch (max_batch_size) copied
    # from rows already in it instead of computing them (a draft model copies the same ones).
    prefix_tokens_reused: int = 0
    new_tokens_per_row: Tensor | None = None  # [B]

    @property
    def total_proposed(self) -> int:
        return int(sum(int(p.sum()) for p in self.proposed))

    @property
    def total_accepted(self) -> int:
        return int(sum(int(a.sum()) for a in self.accepted))

    @property
    def acceptance_rate(self) -> float:
        """Accepted candidates / proposed candidates."""
        return self.total_accepted / max(1, self.total_proposed)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per row per verification step (accepted + the one more), averaged over
        the steps each row took part in."""
        steps = sum(int(s.sum()) for s in self.stepped)
        return (self.total_accepted + steps) / max(1, steps)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0


@dataclass
class GenerateOutput:
    sequences: Tensor  # [B, S + new]: the input as given, then new tokens, pad after a row ends
    stats: GenerateStats
