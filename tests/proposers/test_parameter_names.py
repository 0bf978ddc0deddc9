"""One name per idea across methods (max_draft_tokens, num_draft_tokens, adaptive,
draft_vocab_size), the transformers and vLLM names accepted where they mean the same, and the
old names working for one release with a FutureWarning."""

import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specdec


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                        num_hidden_layers=1, intermediate_size=64, vocab_size=50)).eval()


def test_adaptive_by_default_and_a_fixed_length_when_given(model):
    assert specdec.DraftModel(model).adaptive and specdec.PromptLookup().adaptive and specdec.Lookahead().adaptive
    fixed = specdec.DraftModel(model, 3)
    assert (fixed.adaptive, fixed.num_draft_tokens, fixed.depth) == (False, 3, 3)
    assert specdec.PromptLookup(num_draft_tokens=4).chain_limit == 4
    capped = specdec.DraftModel(model, num_draft_tokens=3, adaptive=True, max_draft_tokens=9)
    assert capped.depth == 9  # adaptive asked for by name: up to the cap


def test_other_libraries_names(model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these is deprecated
        assert specdec.DraftModel(model, num_assistant_tokens=4).num_draft_tokens == 4
        assert specdec.DraftModel(model, num_speculative_tokens=7).max_draft_tokens == 7
        assert specdec.PromptLookup(prompt_lookup_num_tokens=6).num_draft_tokens == 6
        assert specdec.PromptLookup(num_speculative_tokens=12).max_draft_tokens == 12
        assert specdec.Lookahead(num_speculative_tokens=5).max_draft_tokens == 5


def test_deprecated_names_warn_and_still_work(model):
    with pytest.warns(FutureWarning, match="use draft_vocab_size"):
        assert specdec.DraftModel(model, head_tokens=40).draft_vocab_size == 40
    with pytest.warns(FutureWarning, match="use max_draft_tokens"):
        assert specdec.Lookahead(copy_tokens=3).max_draft_tokens == 3
    with pytest.warns(FutureWarning, match='tree="dynamic", top_k=k'):
        tree = specdec.DraftModel(model, tree=3)
    assert (tree.tree, tree.top_k, tree.branches) == ("dynamic", 3, 3)
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="tree must be >= 1"):
        specdec.DraftModel(model, tree=0)
    with pytest.warns(FutureWarning, match="use specdec.PackingConfig"):
        config = specdec.VerificationConfig.for_draft()
    with pytest.warns(FutureWarning, match="use specdec.pack_linear_layers"):
        specdec.accelerate_verification(model, config)
    assert any(type(m).__name__ in ("DotLinear", "PackedLinear") for m in model.modules())  # prepared
