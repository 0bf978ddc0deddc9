"""Training text for a drafter, as chunks of token ids, about ``num_tokens`` in all.

A drafter learns what the target emits after a context (:mod:`specdec.training.features`), so
any text the target handles serves. By default: Python sources of the installed packages (the
standard library and site-packages), code being what specdec's methods are tuned for and there
on any machine; one window of ``chunk_tokens`` tokens from each of many files. For chat models
(the tokenizer has a chat template) the code is the assistant's answer to "Write the Python
module <name>.", and only answer tokens are learned (``Chunk.start``). Else text files and
JSONL files (``{"text": ...}`` per line), used as they are.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MIN_CHUNK_TOKENS", "Chunk", "DataFiles", "build_chunks"]

MIN_CHUNK_TOKENS = 32  # shorter windows teach little and cost a forward each

# Text or JSONL files; None: the installed packages' Python sources.
DataFiles = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None


@dataclass(frozen=True)
class Chunk:
    """One forward's tokens; ``start`` is the first token to learn (the answer's first token
    in a chat-wrapped chunk, else 0)."""

    ids: tuple[int, ...]
    start: int = 0


def build_chunks(tokenizer: Any, data: DataFiles, *, num_tokens: int, chunk_tokens: int,
                 seed: int = 0) -> tuple[list[Chunk], str]:
    """The chunks of ``data`` to run through the target (about ``num_tokens`` tokens, at most
    ``chunk_tokens`` each; ``seed`` picks the default data's files and windows) and a
    description of where they come from. At least two: one to learn from, one held out.

    Example (a one-id-per-character tokenizer):
        >>> import pathlib, tempfile
        >>> from types import SimpleNamespace
        >>> class Chars:
        ...     chat_template = None
        ...     def __call__(self, text):
        ...         return SimpleNamespace(input_ids=[ord(c) for c in text])
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = pathlib.Path(tmp.name) / "text.txt"
        >>> _ = path.write_text("abcd" * 50)
        >>> chunks, source = build_chunks(Chars(), path, num_tokens=160, chunk_tokens=64)
        >>> [len(c.ids) for c in chunks], source == str(path)  # the last one cut at num_tokens
        ([64, 64, 32], True)
        >>> tmp.cleanup()
    """
    if data is None:
        chat = bool(getattr(tokenizer, "chat_template", None))
        chunks = _take(_source_chunks(tokenizer, chunk_tokens, seed, chat), num_tokens)
        source = "Python sources of the installed packages" + (" (chat-wrapped)" if chat else "")
    else:
        paths = [Path(data)] if isinstance(data, (str, os.PathLike)) else [Path(p) for p in data]
        chunks = _take(_text_chunks(tokenizer, chunk_tokens, paths), num_tokens)
        source = ", ".join(str(p) for p in paths)
    if len(chunks) < 2:
        raise ValueError(f"training data: {source} gave {len(chunks)} chunk(s) of at least "
                         f"{MIN_CHUNK_TOKENS} tokens; a training and a held-out chunk are needed")
    return chunks, source


def _take(chunks: Iterator[Chunk], num_tokens: int) -> list[Chunk]:
    """The first chunks, up to ``num_tokens`` tokens (the last one cut), skipping those with
    fewer than ``MIN_CHUNK_TOKENS`` tokens to learn."""
    taken, total = [], 0
    for chunk in chunks:
        room = num_tokens - total
        if room - chunk.start < MIN_CHUNK_TOKENS:  # no room left for a useful chunk
            break
        chunk = Chunk(chunk.ids[:room], chunk.start)
        if len(chunk.ids) - chunk.start >= MIN_CHUNK_TOKENS:
            taken.append(chunk)
            total += len(chunk.ids)
    return taken


def _source_files(seed: int) -> Iterator[tuple[str, Path]]:
    """(module name, path) of the installed Python sources, in a seeded order that mixes
    packages (a hash of the path relative to its root, so the same on any machine)."""
    roots = sorted({Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "purelib", "platlib")})
    seen, files = set(), []
    for root in roots:
        for path in root.rglob("*.py"):
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p not in ("site-packages", "dist-packages", "__init__")]
            order = hashlib.sha256(f"{seed}:{rel.as_posix()}".encode()).hexdigest()
            files.append((order, ".".join(parts), path))
    for _, name, path in sorted(files):
        yield name, path


def _source_chunks(tokenizer: Any, chunk_tokens: int, seed: int, chat: bool) -> Iterator[Chunk]:
    # A window of each file, starting at a seeded line: file heads (licences, imports) would
    # otherwise be over-represented.
    window_chars = chunk_tokens * 6  # code runs 3-4 characters a token: enough text for a chunk
    for name, path in _source_files(seed):
        try:
            if not 2_000 <= path.stat().st_size <= 1_000_000:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lines = text.splitlines(keepends=True)
        starts, remaining = 0, len(text)  # lines from which a whole window of text follows
        for line in lines:
            if remaining < window_chars:
                break
            starts, remaining = starts + 1, remaining - len(line)
        first = random.Random(f"{seed}:{name}").randrange(max(starts, 1))
        code = "".join(lines[first:])[:window_chars]
        if chat:
            yield _chat_chunk(tokenizer, f"Write the Python module {name}.", code, chunk_tokens)
        else:
            yield Chunk(tuple(tokenizer(code).input_ids[:chunk_tokens]))


def _chat_chunk(tokenizer: Any, request: str, answer: str, length: int) -> Chunk:
    user = [{"role": "user", "content": request}]
    prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": answer}], tokenize=False)
    ids = tokenizer(full, add_special_tokens=False).input_ids[:length]
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    start = 0  # where the answer starts: the shared prefix of the two encodings
    while start < min(len(ids), len(prompt_ids)) and ids[start] == prompt_ids[start]:
        start += 1
    return Chunk(tuple(ids), start)


def _text_chunks(tokenizer: Any, chunk_tokens: int, paths: list[Path]) -> Iterator[Chunk]:
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"training data: file {path} not found")
        for text in _documents(path):
            ids = tokenizer(text).input_ids
            for i in range(0, len(ids), chunk_tokens):
                yield Chunk(tuple(ids[i: i + chunk_tokens]))


def _documents(path: Path) -> Iterator[str]:
    if path.suffix != ".jsonl":
        yield path.read_text(encoding="utf-8")
        return
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"training data: {path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f'training data: {path}:{n}: expected an object {{"text": "..."}}')
            yield record["text"]
