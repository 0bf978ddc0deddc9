"""The checkpoint directories vLLM loads a speculator from: ``config.json`` and
``model.safetensors``, written and read the same way for every exported method."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from specdec.proposers.files import write_atomically

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "check_made_for", "read_config", "write_checkpoint"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def write_checkpoint(out_dir: str | Path, tensors: dict[str, Tensor], config: dict[str, Any]) -> Path:
    """``tensors`` (copied to contiguous CPU tensors) and ``config`` into ``out_dir`` (created
    if needed), each file written whole before it replaces an older one. Returns the directory."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    write_atomically(out / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp)))
    write_atomically(out / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(config, indent=2) + "\n"))
    return out


def read_config(path: Path, what: str) -> dict[str, Any]:
    """``path/config.json``; FileNotFoundError naming ``what`` the directory should hold."""
    file = path / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"specdec.vllm: no {CONFIG_FILE} in {path} ({what})")
    return json.loads(file.read_text())


def check_made_for(exported: dict[str, Any], target: str | Path, what: str, noun: str) -> None:
    """Raise ValueError unless the model in directory ``target`` has the hidden size and
    vocabulary that the exported speculator's ``config.json`` (``exported``) says it was made
    for; ``what`` names it (``"the Medusa heads in DIR were"``), ``noun`` its kind (``"heads"``)."""
    target_cfg = read_config(Path(target), "target model")
    target_cfg = target_cfg.get("text_config", target_cfg)
    made_for = exported.get("specdec", {}).get("target") or "another model"
    for key in ("hidden_size", "vocab_size"):
        if exported.get(key) != target_cfg.get(key):
            raise ValueError(f"specdec.vllm: {what} made for {made_for} ({key} {exported.get(key)}); the target "
                             f"{target} has {key} {target_cfg.get(key)}: {noun} trained for another model")
