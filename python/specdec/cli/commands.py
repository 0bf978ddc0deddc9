"""The ``specdec`` command: generate, bench, models."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from specdec.cli import common
from specdec.cli.common import (CACHED, DTYPES, add_model_args, at_least, eagle_drafter, encode, medusa_heads,
                                pad_token_id, prompt_text)

_branches = at_least(1, "1: a chain", "branches")            # --draft-tree
_copied_tokens = at_least(0, "0: off", "copied tokens")     # --draft-lookup


def _method(args: argparse.Namespace, target, tokenizer, draft):
    """The proposer flags' method: one of them, or several as an Ensemble (cheapest first:
    prompt lookup, lookahead, Medusa, EAGLE, draft model); None without any."""
    import specdec

    cap = {} if args.max_draft_tokens is None else {"max_draft_tokens": args.max_draft_tokens}

    members = []
    if args.prompt_lookup:
        members.append(specdec.PromptLookup(**cap))
    if args.lookahead:
        members.append(specdec.Lookahead(window=args.window, ngram=args.ngram, guess_set=args.guess_set,
                                         **cap))
    if args.medusa:
        members.append(specdec.Medusa(medusa_heads(args, target, tokenizer), tree=args.medusa_tree,
                                      **cap))
    if args.eagle:
        members.append(specdec.Eagle(eagle_drafter(args, target, tokenizer), **cap))
    if draft is not None:
        tree = {"tree": "dynamic", "top_k": args.draft_tree} if args.draft_tree > 1 else {}
        members.append(specdec.DraftModel(draft, draft_vocab_size=args.draft_vocab_size, **tree,
                                          lookup=args.draft_lookup, **cap))
    if len(members) > 1:
        return specdec.Ensemble(*members)
    return members[0] if members else None


def cmd_generate(args: argparse.Namespace) -> None:
    from transformers import TextStreamer

    import specdec

    text = prompt_text(args)  # argument errors before any model is loaded
    if args.typical is not None and not args.sample:
        sys.exit("specdec generate: --typical is a sampling mode: add --sample")
    if args.lookahead:  # its settings' errors as messages, before any model is loaded
        try:
            specdec.Lookahead(window=args.window, ngram=args.ngram, guess_set=args.guess_set)
        except ValueError as e:
            sys.exit(f"specdec generate: {e}")
    target, tokenizer, draft = common.load_models(args)
    method = _method(args, target, tokenizer, draft)
    typical = None if args.typical is None else specdec.TypicalAcceptance(args.typical, args.typical_alpha)
    input_ids = encode(tokenizer, text, args.chat)
    sample = dict(do_sample=args.sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    generator = torch.Generator().manual_seed(args.seed)

    print(f"[specdec] target alone ({args.model}, {args.dtype}) ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with torch.inference_mode():
        plain = target.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                max_new_tokens=args.max_new_tokens, **_hf_sampling(sample),
                                pad_token_id=pad_token_id(tokenizer))
    plain_s = time.perf_counter() - start
    plain_new = plain.shape[1] - input_ids.shape[1]

    print(f"[specdec] speculative ({_describe(args)}):", file=sys.stderr, flush=True)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    out = specdec.generate(target, input_ids, max_new_tokens=args.max_new_tokens, method=method,
                           streamer=streamer, generator=generator, typical=typical, **sample)
    st = out.stats
    plain_rate = plain_new / plain_s
    print()
    print(f"target alone:     {plain_new} tokens in {plain_s:.2f} s = {plain_rate:.2f} tok/s")
    print(f"speculative:      {st.new_tokens} tokens in {st.wall_time_s:.2f} s = {st.tokens_per_second:.2f} tok/s")
    print(f"speed-up:         {st.tokens_per_second / plain_rate:.2f}x")
    print(f"mean accepted length (tokens per target pass): {st.mean_accepted_length:.2f}")
    print(f"acceptance rate:  {st.acceptance_rate:.2%} ({st.total_accepted}/{st.total_proposed} candidates)")
    print(f"target passes:    {st.target_forwards}")
    if typical is not None:
        print(f"lossy: typical acceptance (posterior_threshold={typical.posterior_threshold}, "
              f"posterior_alpha={typical.posterior_alpha}): the output does not follow the "
              "target's distribution exactly")
    if not args.sample:
        same = torch.equal(out.sequences[0, : plain.shape[1]], plain[0])
        print(f"identical to the target alone: {'yes' if same else 'NO'}")


def _hf_sampling(sample: dict) -> dict:
    if not sample["do_sample"]:
        return dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    return dict(sample)


def _describe(args: argparse.Namespace) -> str:
    names = [name for name, given in (
        ("prompt lookup", args.prompt_lookup),
        (f"lookahead W={args.window} N={args.ngram} G={args.guess_set}", args.lookahead),
        (f"Medusa heads {args.medusa}", args.medusa),
        (f"EAGLE drafter {args.eagle}", args.eagle),
        (f"draft model {args.draft}" + (f", tree of {args.draft_tree} branches" if args.draft_tree > 1 else "")
         + (f", taking up to {args.draft_lookup} copied tokens per pass" if args.draft_lookup else ""),
         args.draft)) if given]
    if len(names) > 1:
        return "ensemble of " + ", ".join(names)
    return names[0] if names else "no proposer"


def cmd_models(args: argparse.Namespace) -> None:
    from specdec import models

    for status in models.available():
        state = f"cached in {status.path}" if status.cached else "not downloaded yet"
        print(f"{status.name:22s} {status.description}  [{state}]")


def cmd_bench(args: argparse.Namespace) -> None:
    from specdec.cli import bench

    bench.main(args)


def _check_data(args: argparse.Namespace) -> None:
    """Exit unless every --data file exists (before the model is loaded)."""
    missing = [p for p in args.data or () if not Path(p).is_file()]
    if missing:
        sys.exit(f"specdec {args.command}: --data: no such file: {', '.join(missing)}")


def _training_target(args: argparse.Namespace):
    """The target and tokenizer a training command learns from. Training reads the target's
    features over whole chunks of text, wide passes that need no row invariance: oneDNN's packed
    products run them fastest (docs/benchmarks.md, "EAGLE and Medusa")."""
    import specdec

    _check_data(args)
    target, tokenizer, _ = common.load_models(args, specdec.PackingConfig(kernel="onednn"))
    return target, tokenizer


def cmd_train_medusa(args: argparse.Namespace) -> None:
    from specdec.training.medusa import train_medusa

    target, tokenizer = _training_target(args)
    train_medusa(target, tokenizer, args.out, num_heads=args.heads, num_tokens=args.tokens,
                 vocab_size=args.vocab_size, data=args.data, num_layers=args.layers,
                 epochs=args.epochs, regenerate=args.regenerate, data_dtype=args.data_dtype, resume=args.resume)


def cmd_train_eagle(args: argparse.Namespace) -> None:
    from specdec.training.eagle import train_eagle

    target, tokenizer = _training_target(args)
    train_eagle(target, tokenizer, args.out, num_tokens=args.tokens, draft_vocab_size=args.draft_vocab_size,
                data=args.data, epochs=args.epochs, train_depth=args.train_depth, regenerate=args.regenerate,
                mixed_precision=args.mixed_precision, data_dtype=args.data_dtype, resume=args.resume)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


def build_parser() -> argparse.ArgumentParser:
    """The ``specdec`` command's parser; each subcommand's ``func`` runs it."""
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate with speculative decoding and compare with the target alone")
    add_model_args(g)
    proposer = g.add_argument_group("proposers (several: an Ensemble, verified in one pass)")
    proposer.add_argument("--draft", help="draft model (same tokenizer as the target)")
    proposer.add_argument("--prompt-lookup", action="store_true", help="prompt lookup decoding")
    proposer.add_argument("--lookahead", action="store_true",
                          help="lookahead decoding (Jacobi window and n-gram pool; no draft, no training)")
    proposer.add_argument("--medusa", metavar="DIR", nargs="?", const=CACHED,
                          help="Medusa heads (specdec train-medusa, or a FasterDecoding/Medusa "
                               "checkpoint); without DIR, the heads cached for --model, trained on "
                               "first use")
    proposer.add_argument("--eagle", metavar="DIR", nargs="?", const=CACHED,
                          help="an EAGLE drafter (specdec train-eagle); without DIR, the drafter cached "
                               "for --model, trained on first use")
    from specdec.proposers.lookahead import Lookahead  # its defaults are the options'

    lookahead = Lookahead()
    g.add_argument("--window", type=int, default=lookahead.window, help="--lookahead: window columns W")
    g.add_argument("--ngram", type=int, default=lookahead.ngram, help="--lookahead: n-gram length N")
    g.add_argument("--guess-set", type=int, default=lookahead.guess_set,
                   help="--lookahead: most n-grams verified per step G")
    g.add_argument("--medusa-tree", choices=("auto", "dynamic"), default="auto",
                   help="Medusa's tree: sized from the heads' accuracies and pass costs, or dynamic")
    g.add_argument("--prompt")
    g.add_argument("--prompt-file")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--max-draft-tokens", "--num-draft-tokens", dest="max_draft_tokens", type=int, default=None,
                   help="most candidates per step, every method (max_draft_tokens; the adaptive methods "
                        "choose up to this many; default: the method's own)")
    g.add_argument("--draft-vocab-size", "--draft-head-tokens", dest="draft_vocab_size", type=int, default=None,
                   help="the draft scores only token ids below N (DraftModel(draft_vocab_size=N))")
    g.add_argument("--draft-dtype", choices=DTYPES, default=None,
                   help="the draft's dtype (default: --dtype); the output stays the target's")
    g.add_argument("--draft-tree", type=_branches, default=1, metavar="K",
                   help="the draft proposes a token tree, K branches per node (DraftModel(tree=\"dynamic\", top_k=K)); "
                        "1: a chain")
    g.add_argument("--draft-lookup", type=_copied_tokens, default=None, metavar="M",
                   help="each draft pass also checks up to M tokens copied from the context and takes "
                        "those the draft agrees with (DraftModel(lookup=M), chains); 0: off; "
                        "default: 8 for one prompt's chain")
    g.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--typical", type=float, default=None, metavar="EPS",
                   help="LOSSY typical acceptance (Medusa's): accept a candidate whose target "
                        "probability exceeds min(EPS, A * exp(-entropy)); needs --sample")
    g.add_argument("--typical-alpha", type=float, default=0.3, metavar="A")
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="list the named demo models and whether they are cached")
    m.set_defaults(func=cmd_models)

    b = sub.add_parser("bench", help="our decoders vs plain and HF's assisted/prompt-lookup generation")
    add_model_args(b)
    b.add_argument("--draft", help="draft model for DraftModel and HF assisted generation")
    b.add_argument("--medusa", metavar="DIR", nargs="?", const=CACHED,
                   help="also run Medusa with these heads (without DIR: cached for --model, trained on first use)")
    b.add_argument("--eagle", metavar="DIR", nargs="?", const=CACHED,
                   help="also run EAGLE with this drafter (without DIR: cached for --model, trained on first use)")
    b.add_argument("--typical-sweep", type=lambda v: [float(x) for x in v.split(",")], default=[],
                   metavar="EPS[,EPS...]", help="with --medusa: also Medusa with LOSSY typical "
                   "acceptance at these posterior thresholds, and exact sampling, at --typical-temperature")
    b.add_argument("--typical-temperature", type=float, default=0.7)
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--draft-vocab-size", "--draft-head-tokens", dest="draft_vocab_size", type=int, default=65536,
                   help="also run DraftModel(draft_vocab_size=N); 0 leaves that run out")
    b.add_argument("--draft-dtype", choices=DTYPES, default=None,
                   help="the draft's dtype, for ours and HF assisted alike (default: --dtype)")
    b.add_argument("--draft-trees", type=lambda v: [_branches(x) for x in v.split(",")], default=[],
                   metavar="K[,K...]", help="also DraftModel(tree=\"dynamic\", top_k=K) for each K (with --draft-vocab-size)")
    b.add_argument("--plain-dtype", choices=DTYPES, default=None,
                   help="also HF plain generate with the target in this dtype (e.g. float32 next to "
                        "a bfloat16 run), prepared alike")
    b.add_argument("--prompt-file", default=None,
                   help="bench these prompts instead of the built-in sets: one per line (\\n for a "
                        "newline), or .jsonl objects {\"prompt\": ..., \"set\": ...} (docs/benchmarks.md)")
    b.add_argument("--prompts", type=int, default=None, help="use only the first N prompts of each set")
    b.add_argument("--repeats", type=int, default=1, help="runs of every method per prompt (interleaved)")
    b.add_argument("--defaults", action="store_true",
                   help="every method as a Python user calls it: its defaults (the draft's rows too: "
                        "no fixed settings, the draft's own copying), and no pass_costs profile")
    b.add_argument("--methods", nargs="+", default=None, metavar="NAME",
                   help="run only these rows (plain always runs: it is the reference), e.g. "
                        "hf_assisted specdec_draft specdec_hybrid")
    b.add_argument("--out", default="bench/results", help="folder for the JSON, markdown and PNG")
    b.set_defaults(func=cmd_bench)

    from specdec.training.medusa import TrainConfig  # its defaults are the command's

    medusa = TrainConfig()
    t = _training_parser(sub, "train-medusa", "train Medusa heads for a target on its own greedy outputs",
                         "the heads (config.json, heads.safetensors", medusa,
                         "tokens of text run through the target (the cost: one forward over them)")
    t.add_argument("--heads", type=int, default=medusa.num_heads,
                   help="number of heads (head k guesses token t+k+1)")
    t.add_argument("--layers", type=int, default=medusa.num_layers, help="residual blocks per head")
    t.add_argument("--vocab-size", type=int, default=medusa.vocab_size,
                   help="the heads score at most this many ids, the commonest of the training labels")
    t.set_defaults(func=cmd_train_medusa)

    from specdec.training.eagle import EagleTrainConfig  # its defaults are the command's

    eagle = EagleTrainConfig()
    e = _training_parser(sub, "train-eagle", "train an EAGLE drafter for a target on its own features and greedy "
                         "outputs", "the drafter (config.json, drafter.safetensors", eagle,
                         "tokens of text run through the target (a forward over them, cached: train-medusa with "
                         "the same --tokens and --data-dtype reads the same data)")
    e.add_argument("--draft-vocab-size", type=int, default=eagle.draft_vocab_size,
                   help="the drafter scores N token ids (the training labels' commonest, then the lowest others)")
    e.add_argument("--train-depth", type=int, default=eagle.train_depth,
                   help="depths trained drafting from its own features (1: teacher-forced only; each "
                        "depth costs about one more epoch's time)")
    e.add_argument("--mixed-precision", action=argparse.BooleanOptionalAction, default=eagle.mixed_precision,
                   help="the drafter's products in bfloat16 where the CPU has them (AVX512-BF16, AMX) or on CUDA; "
                        "weights and optimizer in float32")
    e.set_defaults(func=cmd_train_eagle)

    from specdec.cli.export_vllm import add_parser as add_export_vllm

    add_export_vllm(sub)
    return parser


def _training_parser(sub: argparse._SubParsersAction, name: str, help: str, writes: str, cfg,
                     tokens_help: str) -> argparse.ArgumentParser:
    """A training command's parser with the arguments every training takes (``cfg``: its
    config, whose defaults are the arguments')."""
    from specdec.training.loop import DATA_DTYPES

    p = sub.add_parser(name, help=help)
    add_model_args(p)
    p.add_argument("--out", required=True, help=f"folder for {writes}, metrics.json) and the per-epoch checkpoint")
    p.add_argument("--tokens", type=int, default=cfg.num_tokens, help=tokens_help)
    p.add_argument("--epochs", type=int, default=cfg.epochs)
    p.add_argument("--data", nargs="+", metavar="PATH", default=None,
                   help="text or .jsonl ({\"text\": ...} per line) files (default: the Python sources of "
                        "the installed packages, chat-wrapped for chat models)")
    p.add_argument("--regenerate", action=argparse.BooleanOptionalAction, default=cfg.regenerate,
                   help="learn from the target's own continuations of the data's prompts (chat requests, "
                        "else each chunk's first 32 tokens), generated once and cached; --no-regenerate: "
                        "from the data's text")
    p.add_argument("--data-dtype", choices=DATA_DTYPES, default=cfg.data_dtype,
                   help="dtype of the target's passes over the data (auto: bfloat16 for a float32 target where "
                        "the CPU has bfloat16 products, on a copy; else the target's own)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.set_defaults(draft=None, draft_dtype=None)
    return p


if __name__ == "__main__":
    main()
