"""One end-to-end decode on the GPU, checked for greedy identity with the target alone
(tools/gpu_check.sh, step f).

The model: the demo model SmolLM2-135M-Instruct (``smollm2-135m``, specdec.models; it comes from
a PyPI package, no model hub) when it is already converted in specdec's cache
(``$SPECDEC_CACHE``, default ~/.cache/specdec); otherwise, since the GPU machine may have no
network, a random-weight Llama of head size 128 (tests/support/models.tiny_lm's recipe: peaked
logits, so greedy text has clear winners) and the summary says so. ``--model NAME`` insists on a
named model (and fetches it when the network allows).

Three ragged prompts that repeat themselves are decoded greedily in float32 by
``specdec.generate`` with two methods that run every verification path of a decoder on the
device: prompt lookup proposing token trees (ngram_match, build_tree, tree_attention,
tree_verify_greedy, kv_commit) and a draft model proposing dynamic trees (the target as its own
draft: every node it proposes on its greedy path is accepted). Each row must equal the target's
own greedy decoding (transformers' ``generate``, one token at a time).
"""

from __future__ import annotations

import sys
import time

from gpu_common import Checks, device_or_exit, parser, sync

import torch
from support.models import tiny_lm

import specdec
from specdec import Batching

TEXT = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "The cat sat on the mat. The dog sat on the log. The bird sat on the",
    "1, 2, 3, 4, 5, 6, 7, 8,",
]


def load(name: str, device: torch.device):
    """(model, prompts as token lists, what it is)."""
    why = "--model random"
    if name == "auto":
        status = {s.name: s for s in specdec.models.available()}
        name = "smollm2-135m" if status["smollm2-135m"].cached else "random"
        why = "smollm2-135m is not in specdec's cache"
    if name == "random":
        model = tiny_lm("llama", seed=0, vocab=256, layers=4, hidden_size=512, intermediate_size=1024,
                        num_attention_heads=4, num_key_value_heads=2)
        model = model.to(device)
        gen = torch.Generator().manual_seed(1)
        seeds = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (7, 12, 4)]
        # Each prompt holds a seed, the model's own greedy continuation of it and the seed again (a
        # prompt that an answer copies from); prompt lookup proposes the continuation again, which
        # a random model's next pass seldom confirms (the draft model's trees are accepted).
        prompts = [s + greedy_alone(model, s, 16, None) + s for s in seeds]
        what = f"a random-weight Llama (4 layers, hidden 512, 4 heads of 128, 2 KV heads, vocab 256): {why}"
        return model, prompts, what
    model, tokenizer = specdec.models.load(name, device=device)
    prompts = [tokenizer(t)["input_ids"] for t in TEXT]
    return model, prompts, f"{name} (float32)"


def greedy_alone(model, prompt: list[int], max_new: int, eos) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         pad_token_id=0, eos_token_id=eos)
    return out[0, len(prompt):].tolist()


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="auto", help="auto (default), random, or a named demo model")
    p.add_argument("--max-new", type=int, default=48)
    args = p.parse_args()
    dev = device_or_exit(args.device)
    checks = Checks()
    model, prompts, what = load(args.model, dev)
    print(f"model: {what}; device {dev}", flush=True)
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else eos
    want = [greedy_alone(model, prompt, args.max_new, eos or None) for prompt in prompts]

    S = max(len(prompt) for prompt in prompts)
    pad = 0
    ids = torch.tensor([[pad] * (S - len(q)) + q for q in prompts], device=dev)
    mask = torch.tensor([[0] * (S - len(q)) + [1] * len(q) for q in prompts], device=dev)
    # (method, whether it must accept drafts: the target as its own draft always does)
    methods = {
        "prompt lookup (trees)": (specdec.PromptLookup(num_draft_tokens=6, side_tokens=2, adaptive=False), False),
        "draft model (dynamic trees)": (specdec.DraftModel(model, 4, tree="dynamic", top_k=2), True),
    }
    for name, (method, must_accept) in methods.items():
        def run(method=method, name=name, must_accept=must_accept) -> str | None:
            sync(dev)
            t0 = time.perf_counter()
            out = specdec.generate(model, ids, max_new_tokens=args.max_new, method=method, attention_mask=mask,
                                   eos_token_id=eos, pad_token_id=pad, batching=Batching(pace=False))
            sync(dev)
            seconds = time.perf_counter() - t0
            stats = out.stats
            print(f"{name}: {seconds:.2f} s, {stats.target_forwards} target passes, "
                  f"acceptance rate {stats.acceptance_rate:.2f}, {stats.total_accepted} tokens accepted",
                  flush=True)
            for b, w in enumerate(want):
                got = out.sequences[b, S:S + len(w)].tolist()
                if got != w:
                    i = next((i for i, (x, y) in enumerate(zip(got, w)) if x != y), len(w))
                    with torch.no_grad():
                        logits = model(torch.tensor([prompts[b] + w[:i]], device=dev)).logits[0, -1]
                    top = logits.topk(2).values
                    return (f"row {b} differs from the target's greedy output at new token {i} (the target's "
                            f"top-2 logit gap there: {float(top[0] - top[1]):.2e}; a genuine tie is < 1e-5)")
            if must_accept and stats.total_accepted == 0:
                return "no drafted token was accepted (the verification paths did not run)"
            return None

        checks.run(f"{name}: greedy output identical to the target alone", run)
    return checks.exit()


if __name__ == "__main__":
    sys.exit(main())
