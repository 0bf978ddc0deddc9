"""Training data for the drafter trainings' tests: a one-id-per-character tokenizer and a
repeating text (a pattern a drafter can learn)."""

from __future__ import annotations

from types import SimpleNamespace


class CharTokenizer:
    """One id per character, within the tiny models' 96 ids; BOS is 0."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return SimpleNamespace(input_ids=([0] if add_special_tokens else []) + [self.id(c) for c in text])

    @staticmethod
    def id(c):
        return 3 + ord(c) % 90


def repeating_text(folder, repeats=250):
    """A text file in ``folder``: 16 letters repeated ``repeats`` times."""
    path = folder / "corpus.txt"
    path.write_text("abcdefghijklmnop" * repeats)
    return path
