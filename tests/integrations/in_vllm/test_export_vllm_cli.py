"""``specdec export-vllm``: needs neither vLLM nor the target's code, so it runs in every environment."""

import json

import pytest
import torch
from safetensors.torch import load_file

import specdec
from specdec.cli import main
from specdec.vllm import export_medusa


@pytest.fixture
def trained(tmp_path):
    """Heads saved by specdec (as train-medusa leaves them) for a tiny target saved beside them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1)).eval()
    target.save_pretrained(tmp_path / "target")
    heads = specdec.MedusaHeads.for_target(target, num_heads=2, vocab_ids=torch.tensor([3, 9, 1, 40]))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.2)
    heads.save(tmp_path / "heads")
    return heads, tmp_path


def test_the_command_writes_what_export_medusa_writes(trained, capsys):
    heads, tmp = trained
    main(["export-vllm", "--medusa", str(tmp / "heads"), "--out", str(tmp / "cli"), "--target", str(tmp / "target")])
    export_medusa(heads, tmp / "api")
    cli, api = load_file(str(tmp / "cli" / "model.safetensors")), load_file(str(tmp / "api" / "model.safetensors"))
    assert cli.keys() == api.keys() and all(torch.equal(cli[k], api[k]) for k in cli)
    assert json.loads((tmp / "cli" / "config.json").read_text())["truncated_vocab_size"] == 4
    printed = capsys.readouterr().out
    assert "vllm serve" in printed and '"method": "medusa"' in printed and "enable_weights_track" in printed


def test_the_target_must_be_known(trained, tmp_path):
    _, tmp = trained
    with pytest.raises(SystemExit, match="the target .*nowhere is not a directory: give --target DIR"):
        main(["export-vllm", "--medusa", str(tmp / "heads"), "--out", str(tmp / "o"), "--target", str(tmp / "nowhere")])
