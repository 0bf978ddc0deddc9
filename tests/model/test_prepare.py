"""pack_linear_layers and profile_passes: same logits as the plain model, via a KV cache."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing here may reach a hub

import copy
import math

import pytest
import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import specdec
from specdec.model import prepare
from specdec.model.prepare import (DotLinear, PackedLinear, PackingConfig, UpcastLinear, bf16_packable,
                                   copy_in_dtype, memory_overhead, pack_linear_layers)
from specdec.proposers.vocab import head_for_ids

OFF_CPU = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])
KS = (1, 3, 16)
LAYER = {"specdec": DotLinear, "onednn": PackedLinear}  # what each kernel makes of an nn.Linear
ONEDNN = PackingConfig(kernel="onednn")


def _tiny(arch: str, tie: bool = False, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    # sizes are multiples of 64, as in real models: oneDNN pads others (memory_overhead counts it)
    common = dict(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
    )
    model = (
        LlamaForCausalLM(LlamaConfig(**common))
        if arch == "llama"
        else Qwen2ForCausalLM(Qwen2Config(**common))
    )
    return model.to(dtype).eval()


def _passes(model: nn.Module, ks=KS, prefix_len: int = 7) -> list[torch.Tensor]:
    """Logits of a prefill, then of passes over k tokens each, all on one growing KV cache."""
    gen = torch.Generator().manual_seed(1)
    cache = DynamicCache(config=model.config)
    out = []
    with torch.inference_mode():
        for n in (prefix_len, *ks):
            ids = torch.randint(model.config.vocab_size, (2, n), generator=gen)
            out.append(model(input_ids=ids, cache=cache, use_cache=True).logits)
    return out


def _assert_same_logits(
    got: list[torch.Tensor], expected: list[torch.Tensor], rtol: float = 1e-5
) -> None:
    for g, e in zip(got, expected, strict=True):
        # relative to the logits' scale: elementwise rtol alone would fail on logits near zero
        torch.testing.assert_close(g, e, rtol=rtol, atol=rtol * e.abs().max().item())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("kernel,min_rows", [("specdec", 4), ("onednn", 1), ("onednn", 4)])
def test_same_logits_through_kv_cache(arch, kernel, min_rows):
    plain = _tiny(arch)
    expected = _passes(plain)
    model = pack_linear_layers(copy.deepcopy(plain), PackingConfig(min_rows=min_rows, kernel=kernel))
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    prepared = [m for m in model.modules() if type(m) is LAYER[kernel]]
    assert not linears and len(prepared) == 2 * 7 + 1  # q k v o gate up down per layer, lm_head
    if arch == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    _assert_same_logits(_passes(model), expected)
    _assert_same_logits(
        _passes(model, ks=(1,)), _passes(plain, ks=(1,))
    )  # batch of one row, one token


def test_untied_weights_are_replaced_not_duplicated():
    model = pack_linear_layers(_tiny("llama"), ONEDNN)
    assert memory_overhead(model) == 0
    assert all(m.weight is None for m in model.modules() if isinstance(m, PackedLinear))
    plain = _tiny("llama")
    weights = {name: m.weight for name, m in plain.named_modules() if type(m) is nn.Linear}
    dot = pack_linear_layers(plain, PackingConfig(kernel="specdec"))
    assert memory_overhead(dot) == 0
    assert all(dot.get_submodule(name).weight is w for name, w in weights.items())  # the same tensors


def test_auto_takes_specdecs_kernel_where_it_has_avx2(monkeypatch):
    for capability, layer in (("AVX2", DotLinear), ("AVX512", DotLinear), ("DEFAULT", PackedLinear)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert type(pack_linear_layers(_tiny("llama")).lm_head) is layer, capability
    with pytest.raises(ValueError, match="kernel must be 'auto', 'specdec' or 'onednn'"):
        PackingConfig(kernel="mkl")


@pytest.mark.parametrize("kernel,dtype", [("specdec", torch.float32), ("specdec", torch.bfloat16),
                                          ("onednn", torch.float32)])
@pytest.mark.parametrize("in_features", [576, 1536])
def test_a_rows_product_does_not_depend_on_the_row_count(kernel, dtype, in_features):
    """specdec's kernel sums every row one way by construction. oneDNN reduces a one-row
    product differently once in_features > 1024; padded to min_rows = 4 rows, every float32 row
    gets the same bits in a product over 1 to 64 rows. (Its bfloat16 products are not
    invariant on CPUs with AVX512-BF16/AMX: in a 4-row product, row 3 differs from the same row
    among 128, measured on a Xeon with AMX; docs/verification.md.)"""
    gen = torch.Generator().manual_seed(0)
    linear = nn.Linear(in_features, 640, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=gen) / in_features**0.5)
    layer = DotLinear(linear) if kernel == "specdec" else PackedLinear(linear, batch_hint=16)
    x = torch.randn(64, in_features, generator=gen).to(dtype)
    with torch.inference_mode():
        alone = torch.cat([layer(x[i : i + 1]) for i in range(64)])
        for m in (2, 3, 4, 5, 8, 17, 64):
            for start in (0, 64 - m):
                assert torch.equal(layer(x[start : start + m]), alone[start : start + m]), (m, start)


def test_min_rows_must_be_positive():
    with pytest.raises(ValueError, match="min_rows"):
        PackingConfig(min_rows=0)
    with pytest.raises(ValueError, match="upcast_rows"):
        PackingConfig(upcast_rows=-1)


def test_draft_bfloat16_layers_oneDNN_cannot_pack_run_wide_products_in_float32(monkeypatch):
    """Where oneDNN is the kernel asked for and cannot pack bfloat16 (an AVX2 CPU)."""
    monkeypatch.setattr(prepare, "bf16_packable", lambda: False)
    plain = _tiny("llama", tie=True, dtype=torch.bfloat16)
    # A target keeps its bf16 layers as they are: its logits must not depend on the row count.
    target = pack_linear_layers(copy.deepcopy(plain), ONEDNN)
    assert not any(isinstance(m, (PackedLinear, UpcastLinear)) for m in target.modules())

    draft_config = PackingConfig.for_draft()  # oneDNN's kernel
    draft = pack_linear_layers(copy.deepcopy(plain), draft_config)
    upcast = [m for m in draft.modules() if isinstance(m, UpcastLinear)]
    assert len(upcast) == 2 * 7 + 1 and all(m.upcast_rows == 10 for m in upcast)
    assert draft.lm_head.weight is draft.model.embed_tokens.weight  # still tied, no copy
    assert pack_linear_layers(draft, draft_config) is draft  # already prepared
    # Under 10 rows the bf16 product as before; from 10 rows, the float32 product rounded to bf16.
    layer, x = draft.model.layers[0].mlp.up_proj, torch.randn(2, 10, 128).to(torch.bfloat16)
    weight = layer.weight.float()
    assert torch.equal(layer(x[:, :4]), torch.nn.functional.linear(x[:, :4], layer.weight))
    assert torch.equal(layer(x), torch.nn.functional.linear(x.float(), weight).to(torch.bfloat16))
    _assert_same_logits(_passes(draft), _passes(plain), rtol=3e-2)
    # A reduced head made from it stays an UpcastLinear.
    reduced = head_for_ids(draft.lm_head, 40)
    assert type(reduced) is UpcastLinear and reduced.upcast_rows == 10 and reduced.out_features == 40


def test_tied_head_gets_a_packed_copy_or_is_left_alone():
    plain = _tiny("llama", tie=True)
    expected = _passes(plain)
    model = pack_linear_layers(copy.deepcopy(plain), ONEDNN)
    assert isinstance(model.lm_head, PackedLinear)
    assert memory_overhead(model) == model.model.embed_tokens.weight.nbytes
    _assert_same_logits(_passes(model), expected)

    unshared = pack_linear_layers(copy.deepcopy(plain), PackingConfig(pack_shared=False, kernel="onednn"))
    assert type(unshared.lm_head) is nn.Linear and memory_overhead(unshared) == 0
    assert unshared.lm_head.weight is unshared.model.embed_tokens.weight
    _assert_same_logits(_passes(unshared), expected)

    dot = pack_linear_layers(copy.deepcopy(plain), PackingConfig(kernel="specdec"))  # no copy needed
    assert type(dot.lm_head) is DotLinear and dot.lm_head.weight is dot.model.embed_tokens.weight
    assert memory_overhead(dot) == 0
    _assert_same_logits(_passes(dot), expected)
    # a reduced head made from it stays on specdec's kernel: its columns have the full head's bits
    reduced, x = head_for_ids(dot.lm_head, torch.tensor([3, 90, 7])), torch.randn(5, 128)
    assert type(reduced) is DotLinear and torch.equal(reduced(x), dot.lm_head(x)[:, [3, 90, 7]])


@pytest.mark.parametrize("kernel", ["specdec", "onednn", None])
@pytest.mark.parametrize("tie", [False, True])
def test_a_copy_in_another_dtype_is_plain_and_leaves_the_model_as_it_was(kernel, tie):
    plain = _tiny("qwen2", tie=tie)
    expected = _passes(plain)
    model = plain if kernel is None else pack_linear_layers(copy.deepcopy(plain), PackingConfig(kernel=kernel))
    layers = [type(m) for m in model.modules()]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    half = copy_in_dtype(model, torch.bfloat16)
    # Plain layers in bfloat16, frozen, tied weights still one tensor (a packed head keeps no plain
    # weight to share: its copy is its own), rotary tables as they were.
    assert not any(isinstance(m, (PackedLinear, DotLinear, UpcastLinear)) for m in half.modules())
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in half.parameters())
    assert (half.lm_head.weight is half.model.embed_tokens.weight) == (tie and kernel != "onednn")
    assert half.model.rotary_emb.inv_freq.dtype == torch.float32
    for name, value in plain.state_dict().items():
        torch.testing.assert_close(half.state_dict()[name], value.to(torch.bfloat16), rtol=0, atol=0)
    # The model is untouched: the same layers, the same tensors, the same logits.
    assert [type(m) for m in model.modules()] == layers
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    _assert_same_logits(_passes(model), expected)
    # The copy computes the model's function, up to bfloat16's rounding.
    with torch.inference_mode():
        ids = torch.randint(128, (1, 9), generator=torch.Generator().manual_seed(3))
        got, want = half(ids).logits.float(), plain(ids).logits
    assert (got - want).abs().max() < 0.05 * want.abs().max()


def test_greedy_generate_unchanged():
    plain = _tiny("qwen2")
    ids = torch.randint(128, (1, 5), generator=torch.Generator().manual_seed(2))
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    expected = plain.generate(ids, **kwargs)
    assert torch.equal(
        pack_linear_layers(copy.deepcopy(plain)).generate(ids, **kwargs), expected
    )


def test_memory_mapped_weights_are_released(tmp_path):
    _tiny("qwen2").save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)  # safetensors are memory-mapped
    assert not model.model.embed_tokens.weight.untyped_storage().resizable()
    expected = _passes(model)
    pack_linear_layers(model)
    assert all(t.untyped_storage().resizable() for t in [*model.parameters(), *model.buffers()])
    _assert_same_logits(_passes(model), expected)


def test_second_call_is_a_no_op():
    model = pack_linear_layers(_tiny("llama"))
    modules = dict(model.named_modules())
    assert pack_linear_layers(model, PackingConfig(batch_hint=4)) is model
    assert all(modules[name] is m for name, m in model.named_modules())


@pytest.mark.parametrize("device", OFF_CPU)
def test_models_off_cpu_are_left_alone(device):
    with torch.device(device):
        model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=96,
                hidden_size=64,
                intermediate_size=160,
                num_hidden_layers=1,
                num_attention_heads=4,
            )
        )
    before = dict(model.named_modules())
    assert pack_linear_layers(model) is model
    assert dict(model.named_modules()) == before and not any(
        isinstance(m, PackedLinear) for m in model.modules()
    )


@pytest.mark.parametrize("kernel", ["specdec", "onednn"])
def test_bfloat16_prepared_unless_excluded(kernel):
    if kernel == "onednn" and not bf16_packable():
        pytest.skip("oneDNN has no bf16 on this CPU: it packs no bf16 layer (the test above)")
    plain = _tiny("llama", dtype=torch.bfloat16)
    model = pack_linear_layers(copy.deepcopy(plain), PackingConfig(kernel=kernel))
    assert type(model.lm_head) is LAYER[kernel]
    # both round to bf16 (8 bits of mantissa) after accumulating in a different order
    _assert_same_logits(_passes(model), _passes(plain), rtol=3e-2)
    fp32_only = pack_linear_layers(plain, PackingConfig(dtypes=(torch.float32,), kernel=kernel))
    assert not any(type(m) is LAYER[kernel] for m in fp32_only.modules())


def test_packed_linear_matches_linear_for_any_rows_and_hint():
    torch.manual_seed(3)
    lin = nn.Linear(96, 80)
    for hint in (1, 16, 64):
        packed = PackedLinear(lin, batch_hint=hint)
        for shape in [(96,), (1, 96), (3, 96), (2, 5, 96), (70, 96)]:
            x = torch.randn(shape)
            with torch.no_grad():
                torch.testing.assert_close(packed(x), lin(x), rtol=1e-5, atol=1e-5)


def test_profile_passes_runs_each_k_on_the_prefix_cache():
    """What profile_passes times is a verification pass: k new tokens on a KV cache holding the
    prefix, cropped back after each pass (seen by a hook on the decoder: its input width and the
    cache length it gets). Checks the passes, not their times: one prefill of the prefix, then
    for each k one warm-up and ``repeats`` measured passes of width k, each on exactly the
    prefix; one median per k, in the order given."""
    model = pack_linear_layers(_tiny("qwen2"))
    ks, prefix_len, repeats = (1, 2, 4, 8, 16, 32), 20, 2
    seen = []

    def record(_, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5 / 4 name
        seen.append((kwargs["input_ids"].shape[1], None if cache is None else cache.get_seq_length()))

    hook = model.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
    try:
        cost = specdec.profile_passes(model, ks=ks, prefix_len=prefix_len, repeats=repeats)
    finally:
        hook.remove()
    assert seen[0] == (prefix_len, 0)
    assert seen[1:] == [(k, prefix_len) for k in ks] * (1 + repeats)
    assert list(cost) == list(ks) and all(math.isfinite(ms) and ms > 0 for ms in cost.values())


@pytest.mark.real_model
@pytest.mark.parametrize("kernel", ["specdec", "onednn"])
def test_real_smollm2_same_logits_and_greedy(kernel):
    plain, tokenizer = specdec.models.load("smollm2-135m")
    model = pack_linear_layers(copy.deepcopy(plain), PackingConfig(kernel=kernel))
    # the tied head: oneDNN's packed copy beside the embedding, specdec's kernel shares it
    assert memory_overhead(model) == (plain.lm_head.weight.nbytes if kernel == "onednn" else 0)
    # 30 layers of fp32 rounding: the plain model itself gives one row's logits 1.8e-5 (relative)
    # apart when computed alone or in a batch of two; packed vs plain measured up to 4.3e-5
    _assert_same_logits(_passes(model, prefix_len=24), _passes(plain, prefix_len=24), rtol=1e-4)
    ids = tokenizer("def quicksort(arr):\n", return_tensors="pt").input_ids
    kwargs = dict(max_new_tokens=10, do_sample=False)
    assert torch.equal(model.generate(ids, **kwargs), plain.generate(ids, **kwargs))
