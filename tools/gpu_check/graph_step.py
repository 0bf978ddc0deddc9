"""One verification step captured in a CUDA graph and replayed, against the same step run eagerly
(tools/gpu_check.sh, step d).

The step, on fixed shapes (B rows, a T-node token tree whose first A nodes form a chain, L layers
of a [B, Hkv, S, D] bf16 cache, the target's logits over V tokens as an input), calls every
verification op through its out-arguments, as an engine that captures graphs would:

  build_tree -> tree_attention over each row's prefix and the tree (several key splits, so the
  merge kernel and its temporaries are captured too) -> softmax of the logits ->
  tree_verify_greedy (at most A accepted), tree_speculative_sampling (lossless with draft
  probabilities, and typical acceptance), chain_greedy_verify and chain_speculative_sampling on
  the first chain -> kv_commit of the greedy path (root included) into every layer.

Checks: the capture succeeds; a replay gives the eager step's outputs bit for bit (caches and
lengths included); a replay after new inputs are copied into the captured buffers gives the eager
step's outputs on those inputs (the graph reads its buffers, it baked in no values). Then the
step's time, eager and replayed. ``--device cpu`` runs the eager step twice, on smaller shapes,
and compares (the step's construction; there is no graph on CPU).
"""

from __future__ import annotations

import sys

from gpu_common import Checks, device_or_exit, parser, sync

import torch
from support.ops import random_parents

from specdec.ops import TypicalAcceptance

_ops = torch.ops.specdec


class Step:
    """Fixed input buffers, preallocated outputs, and the step itself."""

    def __init__(self, device: torch.device, B=4, T=16, H=8, Hkv=2, D=128, S=2048, L=2, V=4096, A=8):
        self.shape = dict(B=B, T=T, H=H, Hkv=Hkv, D=D, S=S, L=L, V=V, A=A)
        idx = dict(dtype=torch.int64, device=device)
        self.inputs = {
            "parents": torch.empty(B, T, **idx),
            "tokens": torch.empty(B, T, **idx),
            "q": torch.empty(B, H, T, D, dtype=torch.bfloat16, device=device),
            "logits": torch.empty(B, T, V, device=device),
            "draft_probs": torch.empty(B, T, V, device=device),
            "uniform": torch.empty(B, T, device=device),
            "lengths": torch.empty(B, **idx),
        }
        self.caches = [torch.empty(B, Hkv, S, D, dtype=torch.bfloat16, device=device) for _ in range(2 * L)]
        self.outputs = {
            "tree_mask": torch.empty(B, T, T, dtype=torch.bool, device=device),
            "depth": torch.empty(B, T, **idx),
            "paths": torch.empty(B, T, T, **idx),
            "attn": torch.empty(B, H, T, D, dtype=torch.bfloat16, device=device),
            "greedy_path": torch.empty(B, A + 1, **idx),
            "greedy_len": torch.empty(B, **idx),
            "greedy_next": torch.empty(B, **idx),
            "sampled_path": torch.empty(B, T, **idx),
            "sampled_len": torch.empty(B, **idx),
            "sampled_next": torch.empty(B, **idx),
            "typical_path": torch.empty(B, T, **idx),
            "typical_len": torch.empty(B, **idx),
            "typical_next": torch.empty(B, **idx),
            "chain_greedy_ids": torch.empty(B, A + 1, **idx),
            "chain_greedy_len": torch.empty(B, **idx),
            "chain_ids": torch.empty(B, A + 1, **idx),
            "chain_len": torch.empty(B, **idx),
        }

    def fill(self, seed: int) -> dict[str, torch.Tensor]:
        """New random inputs (built on CPU) copied into the fixed buffers; returns the state the
        step changes (lengths, caches), for ``restore``."""
        s = self.shape
        B, T, V, S, A = s["B"], s["T"], s["V"], s["S"], s["A"]
        gen = torch.Generator().manual_seed(seed)
        # Nodes 1..A form a chain (node i under node i - 1); the others branch off anywhere.
        parents = torch.tensor([list(range(-1, A)) + random_parents(T, gen)[A + 1:] for _ in range(B)])
        logits = torch.randn(B, T, V, generator=gen) * 4
        tokens = torch.randint(0, V, (B, T), generator=gen)
        # Half of the nodes carry the target's greedy token at their parent, so paths are accepted.
        greedy_at_parent = logits.argmax(-1).gather(1, parents.clamp_min(0))
        tokens = torch.where(torch.rand(B, T, generator=gen) < 0.5, greedy_at_parent, tokens)
        new = {
            "parents": parents,
            "tokens": tokens,
            "q": torch.randn(B, s["H"], T, s["D"], generator=gen),
            "logits": logits,
            "draft_probs": torch.softmax(torch.randn(B, T, V, generator=gen) * 3, -1),
            "uniform": torch.rand(B, T, generator=gen),
            "lengths": torch.randint(S // 2, S - 2 * T, (B,), generator=gen),
        }
        for name, value in new.items():
            self.inputs[name].copy_(value)
        for cache in self.caches:
            cache.copy_(torch.randn(cache.shape, generator=gen))
        return self.state()

    def state(self) -> dict[str, torch.Tensor]:
        caches = {f"cache{i}": c.clone() for i, c in enumerate(self.caches)}
        return {"lengths": self.inputs["lengths"].clone(), **caches}

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        self.inputs["lengths"].copy_(saved["lengths"])
        for i, cache in enumerate(self.caches):
            cache.copy_(saved[f"cache{i}"])

    def run(self) -> None:
        s, x, o = self.shape, self.inputs, self.outputs
        L, A = s["L"], s["A"]
        ks, vs = self.caches[:L], self.caches[L:]
        _ops.build_tree(x["parents"], tree_mask=o["tree_mask"], depth=o["depth"], paths=o["paths"])
        # The tree's own keys and values sit after each row's prefix (the model wrote them there).
        _ops.tree_attention(x["q"], ks[0], vs[0], x["lengths"], o["tree_mask"], None, out=o["attn"])
        probs = torch.softmax(x["logits"], -1)
        _ops.tree_verify_greedy(x["tokens"], x["parents"], x["logits"], accept_path=o["greedy_path"],
                                accept_len=o["greedy_len"], next_token=o["greedy_next"])
        _ops.tree_speculative_sampling(x["tokens"], x["parents"], probs, x["uniform"], x["draft_probs"], None, 0.3,
                                       accept_path=o["sampled_path"], accept_len=o["sampled_len"],
                                       next_token=o["sampled_next"])
        typical = TypicalAcceptance()
        _ops.tree_speculative_sampling(x["tokens"], x["parents"], probs, x["uniform"], None,
                                       typical.posterior_threshold, typical.posterior_alpha,
                                       accept_path=o["typical_path"], accept_len=o["typical_len"],
                                       next_token=o["typical_next"])
        chain = x["tokens"][:, 1:A + 1]
        _ops.chain_greedy_verify(chain, x["logits"][:, :A + 1], out_ids=o["chain_greedy_ids"],
                                 accept_len=o["chain_greedy_len"])
        _ops.chain_speculative_sampling(x["draft_probs"][:, 1:A + 1], chain, probs[:, :A + 1], x["uniform"][:, :A + 1],
                                        out_ids=o["chain_ids"], accept_len=o["chain_len"])
        # SpecCache.commit_path: sources lengths + path (padding -1 columns lie past accept_len).
        src = x["lengths"][:, None] + o["greedy_path"].clamp_min(0)
        _ops.kv_commit(ks, vs, x["lengths"], src, o["greedy_len"] + 1)

    def results(self) -> dict[str, torch.Tensor]:
        return {**{k: v.clone() for k, v in self.outputs.items()}, **self.state()}


def compare(checks: Checks, what: str, got: dict, want: dict) -> None:
    bad = [k for k in want if not torch.equal(got[k], want[k])]
    checks.check(not bad, what, f"differ: {', '.join(bad)}")


def main() -> int:
    args = parser(__doc__.splitlines()[0]).parse_args()
    dev = device_or_exit(args.device)
    checks = Checks()
    step = Step(dev) if dev.type == "cuda" else Step(dev, S=256, V=512)

    def eager(seed: int) -> dict:
        saved = step.fill(seed)
        step.run()
        sync(dev)
        out = step.results()
        step.restore(saved)
        return out

    first = eager(args.seed)
    print("eager step: accepted per row (tree greedy / tree sampled / chain sampled): "
          f"{first['greedy_len'].tolist()} / {first['sampled_len'].tolist()} / {first['chain_len'].tolist()}",
          flush=True)
    if dev.type != "cuda":
        compare(checks, "eager step run twice gives the same outputs (cpu: no graph)", eager(args.seed), first)
        return checks.exit()

    # Warm-up on a side stream (allocator, lazily loaded kernels), then the capture.
    saved = step.fill(args.seed)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step.restore(saved)
            step.run()
    torch.cuda.current_stream().wait_stream(side)
    step.restore(saved)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step.run()
    except Exception as e:  # noqa: BLE001 (reported as the failed check)
        checks.check(False, "capture of the verification step", f"{type(e).__name__}: {e}")
        return checks.exit()
    checks.check(True, "capture of the verification step")

    for seed, what in ((args.seed, "replay equals eager"), (args.seed + 1, "replay on new inputs equals eager")):
        want = first if seed == args.seed else eager(seed)
        saved = step.fill(seed)
        graph.replay()
        sync(dev)
        compare(checks, what, step.results(), want)
        step.restore(saved)

    # The step's time, eager and replayed (each run first resets the lengths that kv_commit moved).
    lengths = step.inputs["lengths"].clone()
    times = {}
    for name, fn in (("eager", step.run), ("graph replay", graph.replay)):
        def once(fn=fn):
            step.inputs["lengths"].copy_(lengths)
            fn()
        for _ in range(3):
            once()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            once()
        end.record()
        sync(dev)
        times[name] = start.elapsed_time(end) / 20 * 1000
    print("verification step (B=4, T=16, V=4096, S=2048, 2 layers): "
          + ", ".join(f"{k} {v:.1f} us" for k, v in times.items()), flush=True)
    return checks.exit()


if __name__ == "__main__":
    sys.exit(main())
