"""Prefix sharing: a batch of requests with one long system prompt and different questions.

Each row is a chat: the same system prompt (about 500 tokens: a code reviewer's instructions)
and its own question. For each method, interleaved, ``specdec.generate`` with
``share_prefix=True`` (the system prompt computed once by the target and by the draft, copied
into every row) and ``share_prefix=False`` (every row computes its whole prompt). Reported: the
target's prefill time, the draft's compute (every draft pass timed, its prefill apart), end-to-end
tokens per second; every output is checked against the rows decoded one at a time (B = 1).
With ``--queue N``: N such requests served ``--rows`` at a time (``max_batch_size``): a request
joining the batch copies the system prompt's entries from a row already in it, in the target's
cache and in the draft's (the draft's prefill is then not reported apart: only its total).
Writes ``bench/results/shared_prefix-<model>-<dtype>[-queue<N>].{json,md}``.

    python bench/shared_prefix.py --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \\
        --draft-dtype bfloat16 --rows 8
    python bench/shared_prefix.py --rows 4 --queue 16

Run it on an idle machine: the numbers are wall-clock, ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import specdec
import torch
from prepared import DTYPES, prepared_model
from specdec import models
from specdec.cli.common import pad_token_id
from specdec import Batching

SYSTEM_PROMPT = """You are a senior Python engineer reviewing and writing code for a team that \
maintains a large data-processing service. Follow these rules in every answer.

Code style:
- Write Python 3.11 that passes flake8 with a line length of 100 and is formatted as black would.
- Give every public function type hints and a docstring with one line of summary, the arguments, \
what it returns and what it raises.
- Prefer the standard library. Use third-party packages only when the question names them.
- Name things for what they hold: no single-letter names except loop indices and coordinates.
- Keep functions short; split a function that does two things into two functions.
- Raise specific exceptions (ValueError, KeyError, TypeError) with a message that says what was \
wrong and what was expected; never catch an exception only to ignore it.
- Do not use global mutable state; pass what a function needs as arguments.

Correctness:
- Handle empty inputs, None, duplicates and very large inputs explicitly, and say how.
- When the input may not fit in memory, stream it (generators, itertools) instead of building lists.
- Do not compare floats for equality; use math.isclose with a stated tolerance.
- Use pathlib for paths, context managers for files and locks, and timezone-aware datetimes.
- When order matters, say whether the result is stable.

Tests:
- After the code, give pytest tests: the usual case, the edge cases above and one error case.
- Tests must assert real behaviour: no test that cannot fail, no sleeping, no network.

Answers:
- Start with the code in one block, then at most three short sentences of explanation.
- If the question is ambiguous, state the assumption you make in one sentence before the code.
- Never invent an API: if you are not sure a function exists, use something you are sure of.
- Mention the time and memory complexity when it is not obvious from the code.
- If the request is unsafe or would lose data, say so and propose a safer way instead.

Performance:
- Measure before optimising; say what you would measure and how.
- Prefer built-in functions and comprehensions to explicit loops when they are clearer.
- Avoid quadratic algorithms on inputs that can grow; use sets and dicts for membership tests.
- Cache results only when the inputs are hashable and the function is pure.

Security:
- Never build SQL or shell commands by string formatting; use parameters and argument lists.
- Treat every input from users, files and the network as untrusted; validate it early.
- Do not log secrets, tokens or personal data."""

QUESTIONS = [
    "Write a function that merges overlapping intervals given as a list of (start, end) tuples.",
    "Write a function that returns the n most common words in a text file.",
    "Write a function that checks whether a string of brackets is balanced.",
    "Write a function that flattens an arbitrarily nested list of integers.",
    "Write a function that groups a list of dictionaries by the value of a given key.",
    "Write a function that computes the moving average of a list of numbers with window k.",
    "Write a function that parses an ISO 8601 duration such as P3DT4H5M into seconds.",
    "Write a function that returns all permutations of a string without duplicates.",
]


# A second team's system prompt: the same rules for another role (it shares only its first words
# with the first one), for batches mixing two system prompts.
SYSTEM_PROMPTS = [SYSTEM_PROMPT, SYSTEM_PROMPT.replace(
    "You are a senior Python engineer reviewing and writing code for a team that maintains a large "
    "data-processing service.", "You are a senior data engineer writing Python for analysts who build "
    "reports from a warehouse of sales records.")]


def batch(tok, rows: int, systems: int = 1,
          numbered: bool = False) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Left-padded ids and attention mask of ``rows`` chats (system prompt + one question each;
    ``systems`` system prompts taken in turn; ``numbered``: each question starts with "Request
    i:", so that no two are the same), and each row's own ids."""
    chats = [[{"role": "system", "content": SYSTEM_PROMPTS[i % systems]},
              {"role": "user", "content": (f"Request {i}: " if numbered else "") + QUESTIONS[i % len(QUESTIONS)]}]
             for i in range(rows)]
    encoded = [tok.apply_chat_template(c, add_generation_prompt=True, return_tensors="pt") for c in chats]
    own = [(e if isinstance(e, torch.Tensor) else e["input_ids"])[0] for e in encoded]
    S, pad = max(len(r) for r in own), pad_token_id(tok)
    ids = torch.stack([torch.cat([torch.full((S - len(r),), pad), r]) for r in own])
    mask = torch.stack([torch.cat([torch.zeros(S - len(r), dtype=torch.long), torch.ones(len(r), dtype=torch.long)])
                        for r in own])
    return ids, mask, own


class PassTimer:
    """Times every pass of a model's decoder (forward hooks): the draft's compute in `generate`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.ms: list[float] = []
        decoder = model.get_decoder()
        decoder.register_forward_pre_hook(self._start)
        decoder.register_forward_hook(self._stop)

    def _start(self, *_) -> None:
        self._t = time.perf_counter()

    def _stop(self, *_) -> None:
        self.ms.append((time.perf_counter() - self._t) * 1e3)

    def reset(self) -> list[float]:
        """The passes timed since the last reset (ms each)."""
        ms, self.ms = self.ms, []
        return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--draft-dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--draft-head-tokens", type=int, default=65536)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--system-prompts", type=int, choices=(1, 2), default=1,
                        help="system prompts taken in turn by the rows")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--queue", type=int, default=None, help="this many requests served --rows at a time")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    model, tok = prepared_model(args)
    draft = models.load(args.draft, dtype=DTYPES[args.draft_dtype])[0]
    specdec.pack_linear_layers(draft)
    timer = PassTimer(draft)
    pad = pad_token_id(tok)
    methods = {"one_token": lambda: None,
               "draft": lambda: specdec.DraftModel(draft, num_draft_tokens=8, adaptive=True,
                                                   draft_vocab_size=args.draft_head_tokens or None)}
    ids, mask, own = batch(tok, args.queue or args.rows, args.system_prompts, numbered=bool(args.queue))
    at_once = args.rows if args.queue else None
    N = args.new_tokens
    # Warm-up (kernels, the reduced draft head): a short run of each method, both ways.
    for make in methods.values():
        for share in (True, False):
            specdec.generate(model, ids[:2], attention_mask=mask[:2], max_new_tokens=2, method=make(),
                             pad_token_id=pad, batching=Batching(share_prefix=share))
    timer.reset()
    # The reference: each row alone (B = 1), one token per pass.
    apart = [specdec.generate(model, r[None], max_new_tokens=N, pad_token_id=pad).sequences[0, len(r):]
             for r in own]
    results = []
    for name, make in methods.items():
        for share in (True, False):
            out = specdec.generate(model, ids, attention_mask=mask, max_new_tokens=N, method=make(),
                                   pad_token_id=pad, batching=Batching(share_prefix=share, max_batch_size=at_once))
            st, passes = out.stats, timer.reset()
            S = ids.shape[1]
            same = all(torch.equal(out.sequences[b, S:S + len(a)], a) for b, a in enumerate(apart))
            # The draft's prompt passes come first: one per shared prefix, then the rows' own parts.
            prompt_passes = 1 + len(st.shared_prefixes)
            results.append({
                "method": name, "share_prefix": share, "shared": [[len(g.rows), g.length] for g in st.shared_prefixes],
                "prompt_tokens": int(mask.sum()), "new_tokens": st.new_tokens, "seconds": st.wall_time_s,
                "tok/s": st.tokens_per_second, "target_prefill_s": st.prefill_time_s,
                "draft_prefill_s": sum(passes[:prompt_passes]) / 1e3 if passes and not args.queue else None,
                "prefix_tokens_reused": st.prefix_tokens_reused,
                "draft_total_s": sum(passes) / 1e3 if passes else None,
                "target_passes": st.target_forwards, "= rows apart": same})
            print(results[-1], flush=True)
    _write(args, results)


def _table(rows: list[dict]) -> str:
    lines = ["| method | shared prefix | target prefill s | draft prefill s | draft total s | seconds "
             "| tok/s | target passes | = rows apart |", "|---|---|---|---|---|---|---|---|---|"]
    def f(x):
        return "" if x is None else f"{x:.2f}"
    for r in rows:
        shared = ", ".join(f"{k} rows x {n}" for k, n in r["shared"]) or "none"
        if r.get("prefix_tokens_reused"):
            shared += f"; {r['prefix_tokens_reused']} copied by joining rows"
        lines.append(f"| {r['method']} | {shared if r['share_prefix'] else 'off'} "
                     f"| {f(r['target_prefill_s'])} | {f(r['draft_prefill_s'])} | {f(r['draft_total_s'])} "
                     f"| {r['seconds']:.1f} | {r['tok/s']:.2f} | {r['target_passes']} "
                     f"| {'yes' if r['= rows apart'] else 'NO'} |")
    return "\n".join(lines)


def _write(args, rows: list[dict]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"shared_prefix-{Path(args.model).name}-{args.dtype}" + (
        f"-{args.system_prompts}systems" if args.system_prompts > 1 else "") + (
        f"-queue{args.queue}" if args.queue else "")
    meta = {"model": args.model, "dtype": args.dtype, "draft": args.draft, "draft_dtype": args.draft_dtype,
            "draft_head_tokens": args.draft_head_tokens, "rows": args.rows, "new_tokens": args.new_tokens,
            "system_prompts": args.system_prompts, "queue": args.queue,
            "threads": torch.get_num_threads()}
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / f"{stem}.md").write_text(_table(rows) + "\n")
    print(_table(rows))


if __name__ == "__main__":
    main()
