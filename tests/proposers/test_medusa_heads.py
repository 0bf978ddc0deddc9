"""MedusaHeads: shapes, alignment, the untrained identity, files (ours and FasterDecoding's),
errors, and attaching to a prepared target."""

import copy
import doctest
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
from support.models import tiny_lm

import specdec
import specdec.proposers.medusa.heads
from specdec.model.linear_layers import DotLinear, PackedLinear
from specdec.proposers.medusa.heads import MedusaConfig, MedusaHeads


def test_docstring_examples():
    result = doctest.testmod(specdec.proposers.medusa.heads, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def _hidden(model, ids):
    with torch.no_grad():
        return model.get_decoder()(input_ids=ids).last_hidden_state


def _randomise(heads, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return heads


def test_untrained_heads_score_as_the_target_lm_head_on_its_rows():
    model = tiny_lm(vocab=96)
    vocab_ids = torch.randperm(96, generator=torch.Generator().manual_seed(1))[:40]
    heads = MedusaHeads.for_target(model, num_heads=3, vocab_ids=vocab_ids, num_layers=2)
    h = _hidden(model, torch.tensor([[0, 5, 9, 33, 4], [0, 7, 7, 7, 2]]))
    logits = heads(h)
    assert logits.shape == (2, 5, 3, 40)
    reference = model.lm_head(h)[..., vocab_ids]
    for k in range(3):
        torch.testing.assert_close(logits[:, :, k], reference, rtol=1e-5, atol=1e-5)


def test_topk_gives_target_ids_and_log_softmax_over_the_heads_vocabulary():
    model = tiny_lm(vocab=96)
    vocab_ids = torch.arange(95, 15, -1)  # 80 ids, not in id order
    heads = _randomise(MedusaHeads.for_target(model, num_heads=2, vocab_ids=vocab_ids))
    h = _hidden(model, torch.tensor([[0, 5, 9, 33]]))[:, -2:].reshape(2, -1)
    ids, logprobs = heads.topk(h, k=5)
    assert ids.shape == logprobs.shape == (2, 2, 5) and ids.dtype == torch.int64
    full = torch.log_softmax(heads(h).float(), -1)  # [2, K, 80]
    top, index = full.topk(5, -1)
    torch.testing.assert_close(logprobs, top)
    assert torch.equal(ids, vocab_ids[index])
    assert bool((ids >= 16).all()) and bool((logprobs.diff(dim=-1) <= 0).all())
    with pytest.raises(ValueError, match="k must be in 1..80"):
        heads.topk(h, k=81)


def test_head_k_is_stored_at_index_k_minus_1_and_guesses_token_t_plus_k_plus_1(tmp_path):
    # Hand-made: the "text" counts 0, 1, 2, ... and the hidden state at t is one-hot of token t.
    # Head k's output layer (FasterDecoding's key {k-1}.1.weight) shifts by k + 1, so head 1
    # must name token t + 2, head 2 token t + 3: loaded heads keep their order and alignment.
    size, heads_n = 16, 3
    state = {}
    for i in range(heads_n):
        state[f"{i}.0.linear.weight"] = torch.zeros(size, size)
        state[f"{i}.0.linear.bias"] = torch.zeros(size)
        state[f"{i}.1.weight"] = torch.roll(torch.eye(size), shifts=i + 2, dims=0) * 10
    save_file(state, str(tmp_path / "medusa_lm_head.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": heads_n, "medusa_num_layers": 1}))
    heads = MedusaHeads.load(tmp_path)
    t = torch.arange(8)
    ids, _ = heads.topk(F.one_hot(t, size).float(), k=1)
    for k in range(1, heads_n + 1):
        assert ids[:, k - 1, 0].tolist() == (t + k + 1).tolist()


def test_save_and_load_ours_round_trip(tmp_path):
    model = tiny_lm(vocab=96)
    heads = _randomise(MedusaHeads.for_target(model, num_heads=3, vocab_ids=torch.arange(50, 10, -1), num_layers=2))
    heads.rank_accuracy = torch.rand(3, 10)
    heads.metrics = {"top1": [0.5, 0.3, 0.2]}
    heads.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["format"] == "specdec-medusa-heads" and config["hidden_size"] == 64
    assert config["target_vocab_size"] == 96 and config["vocab_size"] == 40 and config["num_layers"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "heads.safetensors"]

    again = MedusaHeads.load(tmp_path)
    assert again.config == heads.config and again.metrics == heads.metrics
    torch.testing.assert_close(again.rank_accuracy, heads.rank_accuracy)
    assert again.shared_weight is None  # the LM head rows are not in the file
    with pytest.raises(RuntimeError, match="attach"):
        again(torch.zeros(64))
    h = _hidden(model, torch.tensor([[0, 5, 9]]))
    assert torch.equal(again.attach(model)(h), heads(h))


def _their_state(heads_n, layers, size, vocab, seed=0, shared_blocks=False):
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(heads_n):
        for j in range(layers):
            src = 0 if shared_blocks else j  # their `[ResBlock(h)] * n`: one module n times
            if shared_blocks and j > 0:
                state[f"{i}.{j}.linear.weight"] = state[f"{i}.{src}.linear.weight"]
                state[f"{i}.{j}.linear.bias"] = state[f"{i}.{src}.linear.bias"]
                continue
            state[f"{i}.{j}.linear.weight"] = torch.randn(size, size, generator=gen) * 0.2
            state[f"{i}.{j}.linear.bias"] = torch.randn(size, generator=gen) * 0.2
        state[f"{i}.{layers}.weight"] = torch.randn(vocab, size, generator=gen)
    return state


def _their_reference(state, heads_n, layers, x):
    out = []
    for i in range(heads_n):
        y = x
        for j in range(layers):
            y = y + F.silu(y @ state[f"{i}.{j}.linear.weight"].T + state[f"{i}.{j}.linear.bias"])
        out.append(y @ state[f"{i}.{layers}.weight"].T)
    return torch.stack(out, -2)


@pytest.mark.parametrize("suffix", ["safetensors", "pt"])
def test_loads_the_faster_decoding_layout(tmp_path, suffix):
    state = _their_state(heads_n=2, layers=1, size=16, vocab=24)
    if suffix == "safetensors":
        save_file(state, str(tmp_path / "medusa_lm_head.safetensors"))
    else:
        torch.save(state, tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(json.dumps(
        {"medusa_num_heads": 2, "medusa_num_layers": 1, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    heads = MedusaHeads.load(tmp_path)
    assert heads.config == MedusaConfig(hidden_size=16, num_heads=2, num_layers=1, target_vocab_size=24,
                                        vocab_size=24, per_head_output=True, target="lmsys/vicuna-7b-v1.3")
    assert torch.equal(heads.vocab_ids, torch.arange(24))
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(heads(x), _their_reference(state, 2, 1, x), rtol=1e-5, atol=1e-5)


def test_loads_their_shared_block_bug_and_extra_heads_as_stored(tmp_path):
    # Two layers written by one module object (the same tensors twice), and a file holding
    # more heads than its config declares: computed as their model computes it, all heads.
    state = _their_state(heads_n=3, layers=2, size=8, vocab=12, shared_blocks=True)
    torch.save(state, tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 2}))
    with pytest.warns(UserWarning, match="holds 3 heads"):
        heads = MedusaHeads.load(tmp_path)
    assert heads.config.num_heads == 3
    assert heads.heads[0][0].linear.weight.data_ptr() != heads.heads[0][1].linear.weight.data_ptr()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(heads(x), _their_reference(state, 3, 2, x), rtol=1e-5, atol=1e-5)
    heads.save(tmp_path / "ours")  # their own output layers travel with our format
    torch.testing.assert_close(MedusaHeads.load(tmp_path / "ours")(x), heads(x))


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        MedusaHeads.load(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        MedusaHeads.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="unknown layout"):
        MedusaHeads.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    with pytest.raises(FileNotFoundError, match="medusa_lm_head.safetensors nor medusa_lm_head.pt"):
        MedusaHeads.load(tmp_path)
    state = _their_state(heads_n=2, layers=1, size=8, vocab=12)
    del state["1.0.linear.bias"]
    state["medusa_head.extra"] = torch.zeros(1)
    save_file(state, str(tmp_path / "medusa_lm_head.safetensors"))
    with pytest.raises(ValueError, match=r"unknown layout .*1\.0\.linear\.bias.*medusa_head\.extra"):
        MedusaHeads.load(tmp_path)
    torch.save({"0.1.weight": torch.zeros(12, 8)}, tmp_path / "medusa_lm_head.pt")
    (tmp_path / "medusa_lm_head.safetensors").unlink()
    with pytest.raises(ValueError, match="output layers .* for 1 heads; config.json declares 2"):
        MedusaHeads.load(tmp_path)
    torch.save({"0.1.weight": [1, 2]}, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match="not a state dict of tensors"):
        MedusaHeads.load(tmp_path)

    ours = tmp_path / "ours"
    MedusaHeads(MedusaConfig(8, 1, 1, 12, 3), vocab_ids=torch.tensor([0, 1, 2])).save(ours)
    (ours / "heads.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no heads.safetensors"):
        MedusaHeads.load(ours)


def test_heads_for_another_model_are_refused():
    heads = MedusaHeads.for_target(tiny_lm(vocab=96), num_heads=2, vocab_ids=torch.arange(10))
    with pytest.raises(ValueError, match="hidden size 64; this target's is 32"):
        heads.attach(LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=1, num_attention_heads=2)))
    with pytest.raises(ValueError, match="96 token ids; this target scores 128"):
        heads.attach(tiny_lm(vocab=128))


def test_bad_vocab_ids_are_refused():
    model = tiny_lm(vocab=96)
    with pytest.raises(ValueError, match=r"vocab_ids must lie in 0\.\.95"):
        MedusaHeads.for_target(model, num_heads=2, vocab_ids=torch.tensor([3, 96]))
    with pytest.raises(ValueError, match="must not repeat"):
        MedusaHeads.for_target(model, num_heads=2, vocab_ids=torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="hidden states of size 32"):
        MedusaHeads.for_target(model, num_heads=2, vocab_ids=torch.arange(5))(torch.zeros(32))


@pytest.mark.parametrize("kernel", ["specdec", "onednn"])
def test_attach_to_a_prepared_target_equals_the_plain_one(kernel):
    if kernel == "onednn" and not torch.backends.mkldnn.is_available():
        pytest.skip("torch without oneDNN: nothing is packed")
    plain = tiny_lm(vocab=96)
    prepared = specdec.pack_linear_layers(copy.deepcopy(plain), specdec.PackingConfig(kernel=kernel))
    if kernel == "onednn":
        assert isinstance(prepared.lm_head, PackedLinear)
        assert prepared.lm_head.weight is None  # only the packed copy is left to read
    else:
        assert isinstance(prepared.lm_head, DotLinear)
    vocab_ids = torch.arange(90, 0, -3)
    heads = _randomise(MedusaHeads.for_target(plain, num_heads=2, vocab_ids=vocab_ids))
    other = MedusaHeads(heads.config, vocab_ids)
    other.load_state_dict(heads.state_dict())
    other.attach(prepared)
    assert torch.equal(other.shared_weight, heads.shared_weight)
    weight = other.shared_weight
    assert other.attach(prepared).shared_weight is weight  # idempotent: nothing copied again
