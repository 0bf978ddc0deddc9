"""Following vLLM's requests across the rows of its input batch, by their tokens.

A ``custom_class`` proposer sees each step the batch's rows (``token_ids_cpu[i,
:num_tokens_no_spec[i]]``) but not which request a row holds, and rows move: requests join,
finish, are preempted and come back, and vLLM condenses the batch. The per-request state of
specdec's proposers (a length policy, an n-gram pool) is therefore keyed by content: an entry
remembers the tokens it has seen, and a row continues the entry whose tokens are a prefix of
the row's. Any state that is a function of the tokens seen (the n-gram pool) is then exact
whichever entry a row continues: two requests with the same prefix have the same pool for it.
Each step the row's previous entry is tried first; entries that no row continues are released.

Example:
    >>> import numpy as np
    >>> rows = RequestRows(new_state=list)
    >>> tokens = np.array([[1, 2, 3, 0], [7, 8, 0, 0]], dtype=np.int32)
    >>> a, b = rows.step(tokens, np.array([3, 2]), 2)
    >>> (a.seen, len(a.tokens)), (b.seen, len(b.tokens))   # new requests: nothing seen before
    ((0, 3), (0, 2))
    >>> tokens = np.array([[7, 8, 9, 0], [1, 2, 3, 4]], dtype=np.int32)   # swapped, one more each
    >>> b2, a2 = rows.step(tokens, np.array([3, 4]), 2)
    >>> a2 is a, b2 is b, a2.seen, b2.seen
    (True, True, 3, 2)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

__all__ = ["RequestRows", "Tracked"]

S = TypeVar("S")


@dataclass(eq=False)
class Tracked(Generic[S]):
    """One request's entry: its tokens as of this step, how many of them it had at the previous
    step it was seen (``seen``: the tokens from there on are new), and the proposer's state."""

    state: S
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    seen: int = 0

    def continued_by(self, row: np.ndarray) -> bool:
        """Whether ``row`` begins with this entry's tokens."""
        n = len(self.tokens)
        return n <= len(row) and np.array_equal(row[:n], self.tokens)


class RequestRows(Generic[S]):
    """The entry of each row of vLLM's batch, step after step.

    ``new_state()`` makes the state of a request first seen (or whose entry was released);
    ``release(state)`` is called for entries that no row continues any more.
    """

    def __init__(self, new_state: Callable[[], S], release: Callable[[S], None] | None = None) -> None:
        self._new_state = new_state
        self._release = release
        self._rows: list[Tracked[S]] = []

    def step(self, token_ids: np.ndarray, num_tokens: np.ndarray, num_rows: int) -> list[Tracked[S]]:
        """The entries of rows ``0 .. num_rows - 1``, whose tokens are ``token_ids[i,
        :num_tokens[i]]``; each entry's ``tokens`` is updated to the row's and ``seen`` to what
        it had before."""
        free = list(self._rows)
        claimed: set[int] = set()
        entries: list[Tracked[S]] = []
        for i in range(num_rows):
            row = token_ids[i, : int(num_tokens[i])]
            entry = self._claim(row, self._rows[i] if i < len(self._rows) else None, free, claimed)
            entry.seen = len(entry.tokens)
            entry.tokens = row.copy()
            entries.append(entry)
        for entry in free:
            if id(entry) not in claimed and self._release is not None:
                self._release(entry.state)
        self._rows = entries
        return entries

    def _claim(self, row: np.ndarray, previous: Tracked[S] | None, free: list[Tracked[S]],
               claimed: set[int]) -> Tracked[S]:
        if previous is not None and id(previous) not in claimed and previous.continued_by(row):
            found = previous
        else:
            matches = [e for e in free if id(e) not in claimed and e.continued_by(row)]
            found = max(matches, key=lambda e: len(e.tokens)) if matches else Tracked(self._new_state())
        claimed.add(id(found))
        return found
