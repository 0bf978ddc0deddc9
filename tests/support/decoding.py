"""Decoding helpers shared by the loop, model and proposer tests: prompts, HF's greedy output as
the reference, left padding, the greedy-identity check, one factory per method for the sampling
distribution check, and hooks that count a pass's rows."""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import specdec
from specdec import Batching
from support.models import perturbed, random_drafter, tiny_lm

MAX_NEW = 24


PROMPTS = [[0, 5, 17, 33, 5, 17], [0, 40], [0, 9, 9, 9, 61, 70, 71, 72, 9], [0, 3, 4]]


def hf_greedy(model, prompt: list[int], max_new: int, eos=None) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    # eos=None: the model's own EOS, as in specdec.generate (passing None would disable it).
    kw = {} if eos is None else {"eos_token_id": eos}
    out = model.generate(ids, do_sample=False, max_new_tokens=max_new, pad_token_id=2,
                         attention_mask=torch.ones_like(ids), **kw)
    return out[0, len(prompt):].tolist()


def first_mismatch_note(model, prompt, want, got) -> str:
    """Where two greedy outputs part, the target's top-2 logit gap (a genuine tie is < 1e-5)."""
    i = next(i for i, (a, b) in enumerate(zip(want, got)) if a != b)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + want[:i]], device=model.device)).logits[0, -1]
    top = logits.topk(2).values
    return f"first mismatch at new token {i}: top-2 logit gap {float(top[0] - top[1]):.2e}"


def left_padded(prompts: list[list[int]], pad: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts left-padded (as for batched generation) into ``[B, S]`` ids and attention mask."""
    S = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (S - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (S - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def assert_greedy_identity(model, prompts, method, max_new=MAX_NEW, eos=None, pace=False):
    """specdec.generate on the model's device against HF's generate of the same model. Batches
    are not paced by default: what a method proposes then does not depend on measured times."""
    B, S = len(prompts), max(len(p) for p in prompts)
    ids, mask = (t.to(model.device) for t in left_padded(prompts))
    out = specdec.generate(model, ids, max_new_tokens=max_new, method=method, attention_mask=mask,
                           eos_token_id=eos, pad_token_id=2, batching=Batching(pace=pace))
    assert out.sequences.shape == (B, S + max_new)
    assert torch.equal(out.sequences[:, :S], ids)
    for b, p in enumerate(prompts):
        want = hf_greedy(model, p, max_new, eos)
        got = out.sequences[b, S:S + len(want)].tolist()
        assert got == want, first_mismatch_note(model, p, want, got)
        assert (out.sequences[b, S + len(want):] == 2).all()  # padded after the row stopped
    return out


# Every sampling-capable method, built around a draft (ignored by the methods that need none).


METHODS = {
    "draft coupled": lambda draft: specdec.DraftModel(draft, 3),
    "draft adaptive, reduced head": lambda draft: specdec.DraftModel(draft, 3, adaptive=True, draft_vocab_size=8),
    "draft tree": lambda draft: specdec.DraftModel(draft, 3, tree="dynamic", top_k=3),
    "draft taking copies": lambda draft: specdec.DraftModel(draft, 3, adaptive=True, lookup=3),
    "draft tree adaptive, reduced head": lambda draft: specdec.DraftModel(draft, 3, adaptive=True, tree="dynamic", top_k=2,
                                                                          draft_vocab_size=8),
    "draft rejection sampling": lambda draft: specdec.DraftModel(draft, 3, coupled=False),
    "draft rejection sampling, reduced head": lambda draft: specdec.DraftModel(draft, 3, coupled=False,
                                                                               draft_vocab_size=8),
    "prompt lookup tree": lambda draft: specdec.PromptLookup(adaptive=False, num_draft_tokens=3, side_tokens=2),
    "lookahead": lambda draft: specdec.Lookahead(window=3, ngram=3, guess_set=3, max_draft_tokens=3, adaptive=False),
    "ensemble union": lambda draft: specdec.Ensemble(
        specdec.PromptLookup(adaptive=False, num_draft_tokens=3, side_tokens=2), specdec.DraftModel(draft, 3),
        specdec.Lookahead(window=2, ngram=3, guess_set=2, max_draft_tokens=0, adaptive=False), adaptive=False),
    "eagle tree": lambda draft: specdec.Eagle(random_drafter(draft), top_k=3, max_draft_tokens=3, adaptive=False,
                                              tree_nodes=8),
    "eagle chain adaptive, reduced vocabulary": lambda draft: specdec.Eagle(  # every third id: scattered columns
        random_drafter(draft, vocab_ids=torch.arange(1, draft.config.vocab_size, 3)), tree=None, max_draft_tokens=3),
    "ensemble average": lambda draft: specdec.Ensemble(
        specdec.DraftModel(draft, 3), specdec.DraftModel(perturbed(draft, 0.5, seed=10), 3), mix="average"),
    "ensemble average, rejection sampling": lambda draft: specdec.Ensemble(
        specdec.DraftModel(draft, 3, coupled=False), specdec.DraftModel(perturbed(draft, 0.5, seed=10), 3,
                                                                        coupled=False), mix="average"),
}


def assert_sampling_follows_the_target_distribution(make_method) -> None:
    """Sampling with ``make_method(draft)`` is lossless: 4000 rows of one prompt, two new tokens
    each; the first token's distribution and the second's given the most frequent first tokens
    match the target's own, as transformers' warpers define it (TV < 3 / sqrt(n)). Drafts agree
    partly; with a reduced draft head (ids 0-7 and the prompt's) the target still draws tokens
    the draft never can; the prompt repeats and holds the likeliest first tokens, so prompt
    lookup proposes a tree and lookahead's pool has n-grams after them."""
    vocab, N = 16, 4000
    target = tiny_lm("llama", seed=4, vocab=vocab, init=0.6)
    draft = perturbed(target, 0.5, seed=9)
    settings = dict(temperature=0.8, top_k=10, top_p=0.95)
    warp = LogitsProcessorList([TemperatureLogitsWarper(0.8), TopKLogitsWarper(10), TopPLogitsWarper(0.95)])
    prompt = torch.tensor([[0, 5, 7, 4, 8, 15, 3, 5, 7]])
    P = prompt.shape[1]
    gen = torch.Generator().manual_seed(0)
    # Flat pass costs (as on a GPU; two points: one alone prices wider passes by their tokens):
    # adaptive drafts then draft more than one token per row even in a batch of 4000; not paced,
    # so both tokens are verified against candidates.
    out = specdec.generate(target, prompt.expand(N, P), max_new_tokens=2, do_sample=True, **settings,
                           method=make_method(draft), generator=gen, eos_token_id=[],
                           pass_costs={1: 1.0, 1 << 16: 1.0}, batching=Batching(pace=False))
    assert out.stats.total_proposed > N  # the method proposed, and its candidates were verified
    first, second = out.sequences[:, P], out.sequences[:, P + 1]

    def exact(prefix):
        with torch.no_grad():
            logits = target(prefix).logits[:, -1]
        return warp(prefix, logits).softmax(-1)[0]

    def tv(samples, probs):
        freq = torch.bincount(samples, minlength=vocab).double() / len(samples)
        return 0.5 * float((freq - probs.double()).abs().sum())

    p1 = exact(prompt)
    assert tv(first, p1) < 3 / N ** 0.5
    for x in p1.argsort(descending=True)[:2].tolist():
        rows = first == x
        p2 = exact(torch.cat([prompt, torch.tensor([[x]])], 1))
        assert tv(second[rows], p2) < 3 / int(rows.sum()) ** 0.5


def pass_rows(model) -> tuple[list[int], object]:
    """The batch size of every pass of ``model``'s decoder (a packed pass's rows counted in its
    runs), and the hook to remove."""
    rows = []

    def count(_, args, kwargs):
        runs = kwargs.get("specdec_packed")
        rows.append(sum(n for _, n, _ in runs) if runs else kwargs["input_ids"].shape[0])

    hook = model.get_decoder().register_forward_pre_hook(count, with_kwargs=True)
    return rows, hook


def early_eos(target) -> int:
    """An EOS id that row 0's greedy output reaches after 5 tokens and the others later or never."""
    return hf_greedy(target, PROMPTS[0], MAX_NEW)[5]
