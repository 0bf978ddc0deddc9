"""export_eagle: specdec's EAGLE drafters in the checkpoint layout of vLLM's ``eagle`` method.

Runs without vLLM (the export needs safetensors only); vLLM reading and serving the files is
tested in in_vllm/test_vllm_eagle.py.
"""

import json

import pytest
import torch
from safetensors.torch import load_file
from support.models import tiny_lm

from specdec.cli import main
from specdec.proposers.eagle.drafter import EagleDrafter
from specdec.vllm import eagle_engine_args, export_eagle

LAYER = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
         "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
QKV_BIAS = ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]


def drafter_for(target, seed=0):
    """A drafter for ``target`` with noise on every weight (a fresh one copies the last layer)."""
    drafter = EagleDrafter.for_target(target, draft_vocab_size=40)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return drafter


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_files_hold_what_vllms_eagle_llama_loads(family, tmp_path):
    target = tiny_lm(family, seed=3)
    drafter = drafter_for(target)
    out = export_eagle(drafter, tmp_path / "vllm")
    config = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))

    assert config["architectures"] == ["EagleLlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["vocab_size"] == 96  # the target's, not draft_vocab_size
    assert (config["hidden_size"], config["intermediate_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"]) == (64, 128, 4, 2, 16)
    assert config["rms_norm_eps"] == target.config.rms_norm_eps
    assert config["rope_parameters"]["rope_theta"] == target.config.rope_parameters["rope_theta"]
    assert config["torch_dtype"] == "float32" and config["specdec"]["draft_vocab_size"] == 40
    # Qwen2: biases on q, k, v only, which vLLM's Llama layer gives from qkv_bias (attention_bias would
    # put one on o_proj as well).
    assert config.get("qkv_bias", False) is (family == "qwen2") and config["attention_bias"] is False
    names = ["fc.weight"] + [f"layers.0.{n}" for n in LAYER + (QKV_BIAS if family == "qwen2" else [])]
    assert sorted(weights) == sorted(names)
    assert weights["fc.weight"].shape == (64, 128)
    assert weights["layers.0.self_attn.k_proj.weight"].shape == (32, 64)
    assert all(torch.equal(weights[k], v) for k, v in drafter.weights().items())


def test_a_llama_layer_built_from_the_config_computes_the_drafters_features(tmp_path):
    """The config's sizes, rope and eps rebuild the drafter's layer (transformers' Llama layer,
    its input norm the identity, as vLLM's EagleLlamaForCausalLM has it)."""
    from transformers import LlamaConfig, LlamaModel

    target = tiny_lm("llama", seed=4, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    drafter = drafter_for(target)
    out = export_eagle(drafter, tmp_path / "vllm")
    config = LlamaConfig.from_pretrained(str(out))
    model = LlamaModel(config).eval()
    model.layers[0].input_layernorm = torch.nn.Identity()
    model.norm = torch.nn.Identity()
    weights = load_file(str(out / "model.safetensors"))
    model.layers[0].load_state_dict({k.removeprefix("layers.0."): v for k, v in weights.items()
                                     if k.startswith("layers.0.")})
    ids, features = torch.tensor([[5, 7, 9, 11, 3]]), torch.randn(1, 5, 64)
    embedded = target.get_input_embeddings()(ids)
    inputs = torch.nn.functional.linear(torch.cat([embedded, features], -1), weights["fc.weight"])
    with torch.no_grad():
        ours = drafter(ids, features)
        rebuilt = model(inputs_embeds=inputs).last_hidden_state
    torch.testing.assert_close(rebuilt, ours)


def test_a_saved_drafter_exports_the_same_files(tmp_path):
    drafter = drafter_for(tiny_lm("qwen2", seed=5))
    export_eagle(drafter, tmp_path / "a")
    export_eagle(drafter.save(tmp_path / "saved"), tmp_path / "b")
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "a" / "config.json").read_text() == (tmp_path / "b" / "config.json").read_text()


def test_engine_args_check_the_target(tmp_path):
    target, other = tiny_lm("llama", seed=6), tiny_lm("llama", seed=6, vocab=128)
    target.save_pretrained(tmp_path / "target")
    other.save_pretrained(tmp_path / "other")
    out = export_eagle(drafter_for(target), tmp_path / "vllm")
    assert eagle_engine_args(out, tmp_path / "target", num_speculative_tokens=4) == {
        "speculative_config": {"method": "eagle", "model": str(out), "num_speculative_tokens": 4}}
    with pytest.raises(ValueError, match="vocab_size 96.*has vocab_size 128: a drafter trained for another model"):
        eagle_engine_args(out, tmp_path / "other")
    with pytest.raises(ValueError, match="num_speculative_tokens must be an int >= 1"):
        eagle_engine_args(out, tmp_path / "target", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="holds no EAGLE drafter for vLLM"):
        eagle_engine_args(tmp_path / "target", tmp_path / "target")


def test_unsupported_architectures_and_missing_files_are_refused(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    qwen3 = Qwen3ForCausalLM(Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)).eval()
    with pytest.raises(ValueError, match="'qwen3' model.*only the Llama and Qwen2 families.*'llama' or 'qwen2'"):
        export_eagle(EagleDrafter.for_target(qwen3), tmp_path / "q3")
    with pytest.raises(FileNotFoundError, match="no config.json in"):
        export_eagle(tmp_path / "nowhere", tmp_path / "o")
    saved = drafter_for(tiny_lm("llama", seed=7)).save(tmp_path / "saved")
    (saved / "drafter.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no drafter.safetensors in"):
        export_eagle(saved, tmp_path / "o")


def test_the_command_writes_what_export_eagle_writes(tmp_path, capsys):
    target = tiny_lm("qwen2", seed=8)
    target.save_pretrained(tmp_path / "target")
    drafter = drafter_for(target)
    drafter.save(tmp_path / "drafter")
    main(["export-vllm", "--eagle", str(tmp_path / "drafter"), "--out", str(tmp_path / "cli"),
          "--target", str(tmp_path / "target"), "--num-speculative-tokens", "4"])
    export_eagle(drafter, tmp_path / "api")
    cli, api = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("cli", "api"))
    assert cli.keys() == api.keys() and all(torch.equal(cli[k], api[k]) for k in cli)
    printed = capsys.readouterr().out
    assert "vllm serve" in printed and '"method": "eagle"' in printed and '"num_speculative_tokens": 4' in printed
    other = tiny_lm("qwen2", seed=8, hidden_size=32, intermediate_size=64)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(SystemExit, match="hidden_size 64.*has hidden_size 32"):
        main(["export-vllm", "--eagle", str(tmp_path / "drafter"), "--out", str(tmp_path / "o"),
              "--target", str(tmp_path / "other")])
    with pytest.raises(SystemExit):  # argparse: exactly one of --medusa, --eagle
        main(["export-vllm", "--eagle", str(tmp_path / "drafter"), "--medusa", str(tmp_path / "drafter"),
              "--out", str(tmp_path / "o")])
