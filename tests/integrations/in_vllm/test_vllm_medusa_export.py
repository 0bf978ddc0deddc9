"""export_medusa: our heads in vLLM's Medusa layout, read back by vLLM's own config and blocks."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("vllm")

import specdec  # noqa: E402
from specdec.vllm import export_medusa, lm_head_weight, medusa_engine_args  # noqa: E402


def tiny_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1)).eval()


def trained_like(heads):
    """Random block weights and biases (fresh heads are the identity)."""
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.2)
    return heads


@pytest.fixture
def target():
    return tiny_target()


@pytest.fixture
def heads(target):
    vocab_ids = torch.tensor([5, 17, 3, 40, 22, 9, 60, 1])
    return trained_like(specdec.MedusaHeads.for_target(target, num_heads=3, vocab_ids=vocab_ids, num_layers=2))


def vllm_draft(out_dir, hidden):
    """vLLM's Medusa drafts from ``hidden [N, H]``: its blocks, the exported shared LM head rows
    scattered onto ``token_map`` (-inf elsewhere), then each head's argmax (a target id)."""
    from safetensors.torch import load_file
    from vllm.model_executor.models.medusa import ResidualBlock
    from vllm.transformers_utils.configs.medusa import MedusaConfig

    config = MedusaConfig.from_pretrained(str(out_dir))
    weights = load_file(str(out_dir / "model.safetensors"))
    drafts = []
    for i in range(config.num_heads):
        block = ResidualBlock(config, config.hidden_size, config.num_hidden_layers)
        block.load_state_dict({k.removeprefix(f"blocks.{i}."): v for k, v in weights.items()
                               if k.startswith(f"blocks.{i}.")})
        logits = torch.full((len(hidden), config.vocab_size), -torch.inf)
        logits[:, weights["token_map"]] = F.linear(block(hidden), weights["lm_heads.0.weight"])
        drafts.append(logits.argmax(-1))
    return config, torch.stack(drafts, 1)


def test_vllms_medusa_reads_our_heads_and_drafts_their_top_ones(heads, target, tmp_path):
    out = export_medusa(heads, tmp_path / "vllm")
    config, drafts = vllm_draft(out, hidden := torch.randn(6, 32))
    assert (config.num_heads, config.num_hidden_layers, config.hidden_size) == (3, 2, 32)
    assert (config.vocab_size, config.truncated_vocab_size) == (64, 8)
    assert config.original_lm_head and config.medusa_fc_bias
    ours, _ = heads.topk(hidden, k=1)  # [6, 3, 1] target ids
    assert torch.equal(drafts, ours[..., 0])


def test_heads_not_attached_export_the_same_with_the_targets_lm_head(heads, target, tmp_path):
    from safetensors.torch import load_file

    export_medusa(heads, tmp_path / "a")
    loaded = specdec.MedusaHeads.load(heads.save(tmp_path / "ours"))
    with pytest.raises(ValueError, match="attach them .* or pass lm_head="):
        export_medusa(loaded, tmp_path / "b")
    export_medusa(loaded, tmp_path / "b", lm_head=target.lm_head.weight)
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert sorted(a) == sorted([f"blocks.{i}.layers.{j}.{p}" for i in range(3) for j in range(2)
                                for p in ("weight", "bias")] + ["lm_heads.0.weight", "token_map"])


def test_heads_over_every_id_need_no_token_map(target, tmp_path):
    heads = trained_like(specdec.MedusaHeads.for_target(target, num_heads=2, vocab_ids=torch.randperm(64)))
    out = export_medusa(heads, tmp_path / "vllm")
    from safetensors.torch import load_file

    weights = load_file(str(out / "model.safetensors"))
    assert "token_map" not in weights and json.loads((out / "config.json").read_text())["truncated_vocab_size"] == 64
    assert torch.equal(weights["lm_heads.0.weight"], target.lm_head.weight)  # the target's order


def test_heads_with_their_own_output_layers_export_one_lm_head_each(heads, tmp_path):
    config = dataclasses.replace(heads.config, per_head_output=True, vocab_size=64)
    theirs = trained_like(specdec.MedusaHeads(config))
    out = export_medusa(theirs, tmp_path / "vllm")
    from safetensors.torch import load_file

    weights = load_file(str(out / "model.safetensors"))
    assert not json.loads((out / "config.json").read_text())["original_lm_head"]
    assert all(torch.equal(weights[f"lm_heads.{i}.weight"], theirs.head_weight[i]) for i in range(3))


def test_heads_for_another_model_are_refused(heads, tmp_path):
    with pytest.raises(ValueError, match=r"LM head 64 x 32\); this LM head is \(64, 48\): heads trained for another"):
        export_medusa(specdec.MedusaHeads.load(heads.save(tmp_path / "ours")), tmp_path / "x",
                      lm_head=torch.zeros(64, 48))
    out = export_medusa(heads, tmp_path / "vllm")
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 48, "vocab_size": 64}))
    with pytest.raises(ValueError, match="hidden_size 32\\); the target .* has hidden_size 48: heads trained for"):
        medusa_engine_args(out, other)


def test_the_engine_args_name_the_heads_and_draft_one_token_per_head(heads, target, tmp_path):
    target.save_pretrained(tmp_path / "target")
    out = export_medusa(heads, tmp_path / "vllm")
    assert medusa_engine_args(out, tmp_path / "target") == {
        "speculative_config": {"method": "medusa", "model": str(out), "num_speculative_tokens": 3},
        "model_loader_extra_config": {"enable_weights_track": False},  # vLLM 0.32 with a token_map
    }
    with pytest.raises(ValueError, match="num_speculative_tokens must be in 1..3"):
        medusa_engine_args(out, tmp_path / "target", num_speculative_tokens=4)
    assert torch.equal(lm_head_weight(tmp_path / "target"), target.lm_head.weight)
