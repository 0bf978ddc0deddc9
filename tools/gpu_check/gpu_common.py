"""What the GPU check's Python steps share (tools/gpu_check.sh runs them; docs/cuda_kernels.md).

Each step prints ``OK: ...`` or ``FAIL: ...`` per check (the shell script's summary quotes the
``FAIL`` lines) and exits non-zero when a check failed. They run from the source tree: the
repository's ``python/`` (specdec with the freshly built extension) and ``tests/`` (the tests'
input helpers) go first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT / "tests", ROOT / "python"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch  # noqa: E402


def parser(description: str) -> argparse.ArgumentParser:
    """The arguments every step takes: the device (``cpu`` runs the step's CPU-runnable path,
    to check the script itself on a machine without a GPU) and a seed."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu to check the script")
    p.add_argument("--seed", type=int, default=0)
    return p


def device_or_exit(name: str) -> torch.device:
    """The device asked for; exits with a FAIL line when it is CUDA and none is usable."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"FAIL: device {name}: torch {torch.__version__} sees no CUDA device")
        sys.exit(2)
    if device.type == "cuda":
        if device.index is None:  # set_device wants an index (torch 2.11 refuses a bare "cuda")
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


class Checks:
    """Records and prints each check; ``exit()`` returns 1 when any failed."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed = 0

    def check(self, ok: bool, what: str, detail: str = "") -> bool:
        if ok:
            self.passed += 1
            print(f"OK: {what}", flush=True)
        else:
            self.failed.append(what)
            print(f"FAIL: {what}{': ' + detail if detail else ''}", flush=True)
        return ok

    def run(self, what: str, fn) -> None:
        """Runs ``fn()`` (which returns None, or a failure detail string); an exception is a
        failure of this check, and the next checks still run."""
        try:
            detail = fn()
        except Exception as e:  # noqa: BLE001 (every error is reported, then the next check runs)
            detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.check(not detail, what, detail or "")

    def exit(self) -> int:
        print(f"{self.passed} passed, {len(self.failed)} failed", flush=True)
        return 1 if self.failed else 0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
