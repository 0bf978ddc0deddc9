"""Exact in every dtype: on a prepared model, the logits a pass computes for a token do not depend
on how many tokens share the pass. Every node of a chain or a tree of T tokens gets, bit for bit,
the logits of one-token passes along its path (fp32 and bf16), and every decoder is then greedy
identical to one-token decoding (``method=None``) in bf16."""

import pytest
import torch
from support.decoding import left_padded, PROMPTS
from support.models import perturbed, tiny_lm
from support.ops import random_parents
from support.passes import packed_and_rectangular, path_to

import specdec
from specdec.model.cache import SpecCache
from specdec.model.attention import tree_attention_enabled
from specdec.model.forward import SDPA_MIN_CHAIN, tree_forward
from specdec.model.prefill import prefill
from specdec.model.linear_layers import DotLinear, PackedLinear

DTYPES = [torch.float32, torch.bfloat16]
SIZES = (1, 2, 3, 4, 8, 17, 64)


def prepared(model, dtype):
    model = specdec.pack_linear_layers(model.to(dtype))
    if not any(isinstance(m, (DotLinear, PackedLinear)) for m in model.modules()):
        # bf16 where the kernel is oneDNN's and it has no bf16 (a CPU without AVX2)
        pytest.skip("no prepared layer for this dtype on this CPU: plain F.linear lacks the property")
    return model


def tiny(family: str, dtype):
    # intermediate_size > 1024: the MLP's down projection is where oneDNN's one-row product
    # would round differently without padding.
    return prepared(tiny_lm(family, seed=31, intermediate_size=1088), dtype)


@torch.no_grad()
def assert_passes_match_one_token_passes(model, prefix: torch.Tensor, sizes=SIZES, trees=True):
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    with tree_attention_enabled(model):
        cache = SpecCache.for_model(model, batch_size=1, max_length=prefix.shape[1] + 2 * max(sizes) + 2)
        prefill(model, cache, prefix)
        P = cache.lengths.clone()
        memo: dict[tuple[int, ...], torch.Tensor] = {}
        fed: list[int] = []  # the tokens the cache holds after the prefix, each from a one-token pass

        def one_token_passes(tokens: list[int]) -> torch.Tensor:
            """Logits after the last of ``tokens``, fed one pass per token after the part of them
            the cache already holds from one-token passes (every prefix's logits are kept)."""
            if tuple(tokens) not in memo:
                common = next((n for n, (a, b) in enumerate(zip(fed, tokens)) if a != b), min(len(fed), len(tokens)))
                cache.rollback(P + common)
                del fed[common:]
                for t in tokens[common:]:
                    out = tree_forward(model, cache, torch.tensor([[t]]), torch.tensor([[-1]]))
                    cache.advance(torch.ones(1, dtype=torch.long))
                    fed.append(t)
                    memo[tuple(fed)] = out[0, 0]
            return memo[tuple(tokens)]

        chain = torch.randint(vocab, (1, max(sizes)), generator=gen)
        for T in sizes:
            tokens = chain[:, :T]
            shapes = {"chain": torch.arange(-1, T - 1)[None]}
            if T < SDPA_MIN_CHAIN:  # longer prompts take fused SDPA: the same pass for every method
                shapes["prompt"] = None
            if trees and T > 2:
                shapes["tree"] = torch.tensor([random_parents(T, gen)])
            for shape, parents in shapes.items():
                nodes = torch.randint(vocab, (1, T), generator=gen) if shape == "tree" else tokens
                cache.rollback(P)
                fed.clear()
                logits = tree_forward(model, cache, nodes, parents)
                paths = {i: path_to(parents[0].tolist(), i) if shape == "tree" else list(range(i + 1)) for i in range(T)}
                for i in sorted(paths, key=lambda i: paths[i]):  # depth first: each path extends a held one
                    path = paths[i]
                    want = one_token_passes(nodes[0, path].tolist())
                    assert torch.equal(logits[0, i], want), (
                        f"{shape} of {T} tokens, node {i}: max diff {(logits[0, i] - want).abs().max():.3g}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tiny_models_every_node_equals_one_token_passes(family, dtype):
    model = tiny(family, dtype)
    # A prefix longer than one key block (128): the blocks must fall the same way.
    prefix = torch.randint(model.config.vocab_size, (1, 150), generator=torch.Generator().manual_seed(1))
    assert_passes_match_one_token_passes(model, prefix)


def decoders(target, dtype):
    draft = prepared(perturbed(tiny_lm(target.config.model_type, seed=31, intermediate_size=1088), 0.05, 7), dtype)
    heads = specdec.MedusaHeads.for_target(target, 2, torch.arange(target.config.vocab_size))
    # Fixed sizes: adaptive ones follow measured pass costs and may propose nothing in a run.
    return {
        "prompt lookup": specdec.PromptLookup(adaptive=False),
        "draft model": specdec.DraftModel(draft, 4),
        "draft model tree": specdec.DraftModel(draft, 4, tree="dynamic", top_k=3),
        "medusa": specdec.Medusa(heads, tree=[(0,), (1,), (0, 0)]),
        "lookahead": specdec.Lookahead(window=3, ngram=3, guess_set=3, adaptive=False),
    }


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_every_decoder_is_greedy_identical_to_one_token_decoding_in_bf16(family):
    target = tiny(family, torch.bfloat16)
    ids, mask = left_padded(PROMPTS)
    # Not paced: what the methods propose (and the acceptance asserted below) then does not
    # depend on measured times.
    kw = dict(max_new_tokens=32, attention_mask=mask, pad_token_id=2, eos_token_id=[], batching=specdec.Batching(pace=False))
    want = specdec.generate(target, ids, method=None, **kw).sequences
    for b in range(len(PROMPTS)):  # batch 1 too
        row = specdec.generate(target, ids[b:b + 1], method=None, **{**kw, "attention_mask": mask[b:b + 1]})
        assert torch.equal(row.sequences, want[b:b + 1])
    for name, method in decoders(target, torch.bfloat16).items():
        out = specdec.generate(target, ids, method=method, **kw)
        assert torch.equal(out.sequences, want), name
        assert out.stats.total_accepted > 0, name


@pytest.mark.real_model
@pytest.mark.parametrize("dtype", DTYPES)
def test_smollm2_every_node_equals_one_token_passes(dtype):
    from specdec import models

    model, tok = models.load("smollm2-135m", dtype=torch.float32)
    model = prepared(model, dtype)
    prefix = tok("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" * 6,
                 return_tensors="pt").input_ids
    assert_passes_match_one_token_passes(model, prefix, sizes=(1, 2, 4, 17, 64))


@pytest.mark.real_model
def test_smollm2_decoders_identical_to_one_token_decoding_in_bf16():
    from specdec import models

    model, tok = models.load("smollm2-135m", dtype=torch.float32)
    model = prepared(model, torch.bfloat16)
    texts = ["Write a Python function that checks whether a number is prime.",
             "Rename the variable x to total:\n\ndef f(items):\n    x = 0\n    for i in items:\n"
             "        x += i\n    return x\n"]
    for text in texts:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        want = specdec.generate(model, ids, max_new_tokens=40, method=None).sequences
        for method in (specdec.PromptLookup(), specdec.Lookahead()):
            assert torch.equal(specdec.generate(model, ids, max_new_tokens=40, method=method).sequences, want)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_bf16_exactness_holds_with_a_shared_prefix_and_rows_leaving(family):
    # Prefix sharing and rows leaving change how the batch is computed, not a token's logits:
    # every decoder still emits exactly what one-token decoding of the same batch emits.
    target = tiny(family, torch.bfloat16)
    system = list(range(20, 60))
    prompts = [system + p for p in PROMPTS]
    ids, mask = left_padded(prompts)
    eos = specdec.generate(target, ids[:1], max_new_tokens=8, attention_mask=mask[:1], pad_token_id=2,
                           eos_token_id=[]).sequences[0, ids.shape[1] + 5].item()  # row 0 stops early
    kw = dict(max_new_tokens=32, attention_mask=mask, pad_token_id=2, eos_token_id=eos, batching=specdec.Batching(pace=False))
    want = specdec.generate(target, ids, method=None, **kw)
    assert [g.length for g in want.stats.shared_prefixes] == [len(system) + 1]  # all prompts start with 0
    assert want.stats.new_tokens_per_row.min() < 32 == want.stats.new_tokens_per_row.max()  # row 0 left
    for name, method in decoders(target, torch.bfloat16).items():
        out = specdec.generate(target, ids, method=method, **kw)
        assert torch.equal(out.sequences, want.sequences), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_packed_pass_gives_its_nodes_the_rectangular_pass_bits(family, dtype):
    """Rows of a batch computing only their first nodes (the verify loop's passes on CPU, the
    linear layers over the packed tokens) get the same bits as in the rectangular pass, which
    the tests above tie to one-token passes."""

    model = tiny(family, dtype)
    widths = torch.tensor([5, 1, 3])
    with tree_attention_enabled(model):
        (rect, _), (packed, _) = packed_and_rectangular(model, "cpu", widths, torch.Generator().manual_seed(2))
    computed = torch.arange(7) < widths[:, None]
    assert torch.equal(packed[computed], rect[computed])

