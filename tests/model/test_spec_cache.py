"""SpecCache's commit and rollback (kv_commit under a model) on a tiny Llama; needs transformers."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from support.ops import DEVICES

from specdec.model.cache import SpecCache  # noqa: E402
from specdec.model.attention import enable_tree_attention
from specdec.model.forward import tree_forward
from specdec.model.prefill import prefill


def tiny_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    enable_tree_attention(model)
    return model


@pytest.mark.parametrize("device", DEVICES)
def test_commit_equals_cache_of_accepted_tokens(device):
    model = tiny_llama().to(device)
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 97, (2, 9), generator=gen).to(device)
    prompt_len = torch.tensor([9, 6], device=device)
    tree = torch.randint(0, 97, (2, 7), generator=gen).to(device)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3, 3], [-1, 0, 1, 0, 3, 4, 2]], device=device)
    accept_path = torch.tensor([[0, 2, 4, -1], [0, 3, 4, 5]], device=device)
    accept_len = torch.tensor([2, 3], device=device)

    cache = SpecCache(model.config, 2, 32, device=device)
    with torch.no_grad():
        prefill(model, cache, prompts, prompt_len)
        tree_forward(model, cache, tree, parents)
        cache.commit_path(accept_path, accept_len)

        # A cache that only ever saw each row's prompt then its root and accepted tokens.
        fresh = SpecCache(model.config, 2, 32, device=device)
        seqs = [torch.cat([prompts[b, : int(prompt_len[b])], tree[b, accept_path[b, : int(accept_len[b]) + 1]]]) for b in range(2)]
        n = torch.tensor([len(s) for s in seqs], device=device)
        padded = torch.zeros(2, int(n.max()), dtype=torch.long, device=device)
        for b, s in enumerate(seqs):
            padded[b, : len(s)] = s
        prefill(model, fresh, padded, n)
    assert torch.equal(cache.lengths, fresh.lengths)
    for got, want in zip(cache.key_caches + cache.value_caches, fresh.key_caches + fresh.value_caches):
        for b in range(2):
            torch.testing.assert_close(got[b, :, : int(n[b])], want[b, :, : int(n[b])], atol=1e-5, rtol=0)


def test_rollback_and_capacity():
    model = tiny_llama()
    cache = SpecCache.for_model(model, 1, 8)
    with torch.no_grad():
        prefill(model, cache, torch.tensor([[1, 2, 3, 4, 5]]))
        cache.rollback(torch.tensor([2]))
        assert cache.lengths.tolist() == [2]
        tree_forward(model, cache, torch.tensor([[7, 8, 9, 10, 11, 12]]))  # exactly fills it
        with pytest.raises(ValueError, match="do not fit the cache"):
            tree_forward(model, cache, torch.tensor([[7] * 7]))
