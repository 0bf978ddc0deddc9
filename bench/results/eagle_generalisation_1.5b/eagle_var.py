"""train_eagle on the 1.5B with settings changed from the defaults (a scratch script kept with its
results): held-out top-1, and top-1 on every ninth training chunk scored as the held-out ones are.
Run from the repository root: python eagle_var.py NAME [key=value ...] (e.g. bs1 batch_size=1);
writes eagle_var/NAME/ (the drafter) and eagle_var/NAME.json."""
import functools, json, sys, time
import torch
import specdec.training.eagle as et
from specdec.cli.commands import build_parser, _training_target
from specdec.training.eagle_rollout import evaluate
from specdec.training.features import Features

name, *kv = sys.argv[1:]
kw = {k: float(v) if "." in v or "e-" in v else int(v) for k, v in (a.split("=") for a in kv)}
cfg_only = {k: kw.pop(k) for k in list(kw) if k in ("depth_decay", "token_weight", "feature_weight", "grad_clip")}
if cfg_only:
    et.EagleTrainConfig = functools.partial(et.EagleTrainConfig, **cfg_only)
captured = {}
orig = et.training_data
def capture(*a, **k):
    r = orig(*a, **k); captured["r"] = r; return r
et.training_data = capture
out = f"eagle_var/{name}"
args = build_parser().parse_args(["train-eagle", "--model", "qwen2.5-coder-1.5b", "--out", out])
target, tok = _training_target(args)
t = time.perf_counter()
drafter = et.train_eagle(target, tok, out, **kw)
chunks, _, f, _ = captured["r"]
ids = torch.tensor([i for c in chunks for i in c.ids])
train_idx = [c for c in range(len(f.heldout)) if not f.heldout[c]][::9]
mask = torch.zeros_like(f.heldout); mask[train_idx] = True
head = et._head(target, drafter.vocab_ids, drafter.dtype)
acc, n = evaluate(drafter, ids, Features(f.hidden, f.labels, f.offsets, mask), 5, head=head)
res = {"name": name, "kw": kw, "cfg": cfg_only, "heldout_top1": drafter.metrics["top1"],
       "train_top1": acc[:, 0].tolist(), "train_positions": n, "train_seconds": drafter.metrics["train_seconds"],
       "total": time.perf_counter() - t}
print(json.dumps(res))
open(f"eagle_var/{name}.json", "w").write(json.dumps(res, indent=1))
