"""Files a proposer's trained weights are saved in."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` a file beside ``path``, then rename it to ``path``: a reader never sees
    half a file, and an interrupted save leaves the old one."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)
