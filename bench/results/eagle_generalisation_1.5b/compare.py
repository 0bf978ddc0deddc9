"""Decoding with two EAGLE drafters of the 1.5B beside one-token decoding, interleaved per prompt
on the held-out prompts as `specdec bench --defaults` runs them (fp32 target prepared, 128
tokens, chat template, 2 threads; every output checked against one-token decoding's). From the
repository root:

    HF_HUB_OFFLINE=1 python bench/results/eagle_generalisation_1.5b/compare.py A_DIR B_DIR out.json [ROUNDS]
"""
import json, sys, time
import torch
import specdec
from specdec.cli.commands import build_parser
from specdec.cli.common import load_models, encode, pad_token_id
from specdec.cli.bench import load_prompts

a_dir, b_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 1
args = build_parser().parse_args(["bench", "--model", "qwen2.5-coder-1.5b", "--threads", "2"])
target, tok, _ = load_models(args)
pad = pad_token_id(tok)
methods = {"one_token": None,
           "eagle_a": specdec.Eagle(specdec.EagleDrafter.load(a_dir)),
           "eagle_b": specdec.Eagle(specdec.EagleDrafter.load(b_dir))}
sets = load_prompts("bench/results/defaults_heldout/heldout_prompts.jsonl")
warm = encode(tok, max((p for ps in sets.values() for p in ps), key=len), chat=True)
for m in methods.values():
    specdec.generate(target, warm, max_new_tokens=8, method=m, pad_token_id=pad)
rows = []
for set_name, prompts in sets.items():
    for i, text in enumerate(prompts):
        ids = encode(tok, text, chat=True)
        for r in range(repeats):
            ref = None
            for name, m in methods.items():
                t = time.perf_counter()
                res = specdec.generate(target, ids, max_new_tokens=128, method=m, pad_token_id=pad)
                secs = time.perf_counter() - t
                seq = res.sequences[0, ids.shape[1]:]
                ref = seq if ref is None else ref
                row = dict(set=set_name, prompt=i, round=r, method=name, tokens=len(seq), secs=secs,
                           passes=res.stats.target_forwards, same=bool(torch.equal(seq, ref)))
                rows.append(row)
                print(json.dumps(row), flush=True)
json.dump(rows, open(out, "w"), indent=1)
