"""DraftModel(draft)'s draft passes fed copies, priced as one token ("old", the pricing before
2026-12-07) or for the copies the draft is expected to take ("new"), interleaved per prompt on
the held-out prompts; "new32": new with max_draft_tokens=32; "hybrid": the default ensemble.
Every output must be identical. Run from the repository root (the installed specdec):

    HF_HUB_OFFLINE=1 .venv/bin/python bench/results/draft_copy_pricing/compare.py old,new 3

"old" is the new code with the copies' estimate pinned to one token (``expected`` -> 1.0): a
pass fed copies is then priced as adding one token, as before."""
import argparse, sys, time, collections, torch, specdec
from specdec.cli.common import load_models, encode, pad_token_id
from specdec.cli.bench import load_prompts
from specdec.loop.cost_model import AcceptanceEstimate
args = argparse.Namespace(model="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b", dtype="float32",
                          draft_dtype="bfloat16", threads=2, no_accelerate=False)
target, tok, draft = load_models(args)
pad = pad_token_id(tok)
prompts = load_prompts("bench/results/defaults_heldout/heldout_prompts.jsonl")
variants = sys.argv[1].split(",")
rounds = int(sys.argv[2])
orig_expected = AcceptanceEstimate.expected
MODE = {"old": False}
def expected(self, g):
    if MODE["old"] and self.prior == 0.5 and getattr(self, "_copy", False):
        return 1.0
    return orig_expected(self, g)
AcceptanceEstimate.expected = expected
from specdec.proposers.draft import proposer as P
oi = P._DraftProposer.__init__
def init(self, *a, **k):
    oi(self, *a, **k); self.copies_taken._copy = True
P._DraftProposer.__init__ = init
def method(v):
    MODE["old"] = v == "old"
    if v == "hybrid":
        return specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(draft))
    return specdec.DraftModel(draft, max_draft_tokens=32 if v == "new32" else 16)
ids0 = encode(tok, prompts["generation"][0], chat=True)
specdec.generate(target, ids0[:, :64], max_new_tokens=8, method=method("new"), pad_token_id=pad)
res = collections.defaultdict(lambda: [0.0, 0, 0])
for rnd in range(rounds):
    for s in ("generation", "editing"):
        for i, text in enumerate(prompts[s]):
            ids = encode(tok, text, chat=True)
            outs = {}
            order = variants if (rnd + i) % 2 == 0 else variants[::-1]
            line = []
            for v in order:
                m = method(v)
                t = time.perf_counter()
                r = specdec.generate(target, ids, max_new_tokens=128, method=m, pad_token_id=pad)
                dt = time.perf_counter() - t
                n = int((r.sequences[0, ids.shape[1]:] != pad).sum())
                outs[v] = r.sequences[0, ids.shape[1]:].tolist()
                res[(s, v)][0] += dt; res[(s, v)][1] += n; res[(s, v)][2] += r.stats.target_forwards
                line.append(f"{v} {n/dt:.2f} ({r.stats.target_forwards})")
            print(rnd, s[0], i, " | ".join(line), flush=True)
            assert all(o == outs[variants[0]] for o in outs.values()), "outputs differ"
for s in ("generation", "editing"):
    print(s, {v: (round(res[(s, v)][1] / res[(s, v)][0], 2), res[(s, v)][2]) for v in variants})
both = {v: sum(res[(s, v)][1] for s in ("generation", "editing")) / sum(res[(s, v)][0] for s in ("generation", "editing")) for v in variants}
print("both", {v: round(x, 2) for v, x in both.items()})
