"""One forward over a token tree equals running every root-to-node path on its own."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
from support.ops import DEVICES
from support.passes import packed_and_rectangular, path_to, random_tree

from specdec.model.cache import SpecCache  # noqa: E402
from specdec.model.attention import enable_tree_attention
from specdec.model.forward import tree_forward
from specdec.model.prefill import prefill
from specdec import models

SMALL = dict(
    vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL),
    "qwen2": lambda: transformers.Qwen2Config(**SMALL),
    "mistral": lambda: transformers.MistralConfig(**SMALL, sliding_window=None),
    "gemma": lambda: transformers.GemmaConfig(**SMALL, head_dim=16),
}


def build(name: str, device: str):
    torch.manual_seed(0)
    cfg = CONFIGS[name]()
    cfg._attn_implementation = "sdpa"
    plain = transformers.AutoModelForCausalLM.from_config(cfg).eval().to(device)
    tree_model = copy.deepcopy(plain)
    enable_tree_attention(tree_model)
    return plain, tree_model


@torch.no_grad()
def check_tree(plain, model, cache, prompts, tree, parents, atol):
    """Tree logits of every node vs the plain model over prompt + the node's path."""
    logits = tree_forward(model, cache, tree, parents)
    for b in range(tree.shape[0]):
        par = parents[b].tolist()
        for node in range(tree.shape[1]):
            seq = torch.cat([prompts[b], tree[b, path_to(par, node)]])[None]
            want = plain(input_ids=seq).logits[0, -1]
            torch.testing.assert_close(logits[b, node], want, atol=atol, rtol=0)
    return logits


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tree_logits_equal_path_logits(device, name):
    plain, model = build(name, device)
    gen = torch.Generator().manual_seed(3)
    lens = [11, 6]  # ragged prompts, right-padded
    prompts = [torch.randint(0, 101, (n,), generator=gen).to(device) for n in lens]
    padded = torch.zeros(2, max(lens), dtype=torch.long, device=device)
    for b, p in enumerate(prompts):
        padded[b, : len(p)] = p
    cache = SpecCache(model.config, 2, 64, device=device)
    with torch.no_grad():
        last = prefill(model, cache, padded, torch.tensor(lens, device=device))
        for b, p in enumerate(prompts):
            torch.testing.assert_close(last[b], plain(input_ids=p[None]).logits[0, -1], atol=1e-4, rtol=0)

    # Two verification steps: the second one after committing an accepted path.
    tree = torch.randint(0, 101, (2, 9), generator=gen).to(device)
    parents = random_tree(2, 9, gen).to(device)
    check_tree(plain, model, cache, prompts, tree, parents, 1e-4)
    paths = [path_to(parents[b].tolist(), 8) for b in range(2)]
    width = max(len(p) for p in paths)
    accept_path = torch.tensor([p + [-1] * (width - len(p)) for p in paths], device=device)
    accept_len = torch.tensor([len(p) - 1 for p in paths], device=device)
    cache.commit_path(accept_path, accept_len)
    prompts = [torch.cat([prompts[b], tree[b, paths[b]]]) for b in range(2)]
    tree2 = torch.randint(0, 101, (2, 6), generator=gen).to(device)
    check_tree(plain, model, cache, prompts, tree2, random_tree(2, 6, gen).to(device), 1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_keep_selects_the_logits_of_some_nodes(device):
    _, model = build("qwen2", device)
    gen = torch.Generator().manual_seed(5)
    tree = torch.randint(0, 101, (2, 7), generator=gen).to(device)
    parents = random_tree(2, 7, gen).to(device)
    keep = torch.tensor([0, 3, 6], device=device)
    with torch.no_grad():
        cache = SpecCache(model.config, 2, 32, device=device)
        full = tree_forward(model, cache, tree, parents)
        some = tree_forward(model, cache, tree, parents, keep=keep)
    assert some.shape == (2, 3, 101)
    torch.testing.assert_close(some, full[:, keep], atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_pass_computes_each_rows_first_nodes_as_the_rectangular_pass(device, name):
    _, model = build(name, device)
    gen = torch.Generator().manual_seed(11)
    widths = torch.tensor([7, 1, 4], device=device)
    ((logits, hidden), rect_cache), ((packed, packed_hidden), cache) = packed_and_rectangular(
        model, device, widths, gen, hidden=True)
    computed = torch.arange(7, device=device) < widths[:, None]
    torch.testing.assert_close(packed[computed], logits[computed], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed_hidden[computed], hidden[computed], atol=1e-5, rtol=0)
    assert not packed[~computed].any() and not packed_hidden[~computed].any()
    # Each computed node's key at its row's slot; the skipped nodes' slots untouched.
    for layer, rect in zip(cache.layers, rect_cache.layers):
        for b, n in enumerate(widths.tolist()):
            at = int(cache.lengths[b])
            torch.testing.assert_close(layer.keys[b, :, at: at + n], rect.keys[b, :, at: at + n], atol=1e-5, rtol=0)
            assert (layer.keys[b, :, at + n: at + 7] == 7.0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_packed_pass_errors(device):
    _, model = build("llama", device)
    cache = SpecCache(model.config, 2, 16, device=device)
    tokens = torch.tensor([[1, 2], [3, 4]], device=device)
    parents = torch.tensor([[-1, 0], [-1, 0]], device=device)
    with pytest.raises(ValueError, match="widths need parents"):
        tree_forward(model, cache, tokens, widths=torch.tensor([2, 1], device=device))
    with pytest.raises(ValueError, match=r"widths must be within 1..2"):
        tree_forward(model, cache, tokens, parents, widths=torch.tensor([0, 2], device=device))
    with pytest.raises(ValueError, match=r"widths must be within 1..2"):
        tree_forward(model, cache, tokens, parents, widths=torch.tensor([3, 2], device=device))
    with pytest.raises(ValueError, match=r"widths must be \[2\]"):
        tree_forward(model, cache, tokens, parents, widths=torch.tensor([2], device=device))
    with pytest.raises(ValueError, match="cannot be combined"):
        tree_forward(model, cache, tokens, parents, keep=torch.tensor([1], device=device),
                     widths=torch.tensor([2, 1], device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    plain, model = build("llama", device)
    cache = SpecCache(model.config, 1, 16, device=device)
    with pytest.raises(ValueError, match="enable_tree_attention"):
        tree_forward(plain, cache, torch.tensor([[1, 2]], device=device))
    with pytest.raises(ValueError, match="only inside specdec.tree_forward"):
        model(input_ids=torch.tensor([[1, 2]], device=device))
    with pytest.raises(ValueError, match="rows"):
        tree_forward(model, cache, torch.tensor([[1], [2]], device=device))


@pytest.mark.real_model
def test_smollm2_tree_logits_equal_path_logits():
    """The same check on a real model: SmolLM2-135M (specdec.models; converted once, cached)."""
    plain, tokenizer = models.load("smollm2-135m")
    model = copy.deepcopy(plain)
    enable_tree_attention(model)
    prompt = tokenizer("def quicksort(items):", return_tensors="pt").input_ids
    cache = SpecCache(model.config, 1, 64)
    with torch.no_grad():
        prefill(model, cache, prompt)
    gen = torch.Generator().manual_seed(0)
    tree = torch.randint(0, plain.config.vocab_size, (1, 8), generator=gen)
    check_tree(plain, model, cache, [prompt[0]], tree, random_tree(1, 8, gen), 1e-3)
