"""Parameters and functions that were renamed: the old names keep working for one release, with a
FutureWarning; the familiar transformers and vLLM names are accepted where they mean the same.

Example:
    >>> import warnings
    >>> class Cfg:
    ...     size = 1
    >>> cfg = Cfg()
    >>> with warnings.catch_warnings(record=True) as seen:
    ...     warnings.simplefilter("always")
    ...     take_aliases(cfg, {"old_size": 3, "unused": None}, {"old_size": "size", "unused": "size"},
    ...                  deprecated={"old_size"})
    >>> cfg.size, [str(w.message) for w in seen]
    (3, ['specdec: Cfg(old_size=...) is deprecated and will be removed in the next release; use size=...'])
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"specdec: {old} is deprecated and will be removed in the next release; use {new}",
                  FutureWarning, stacklevel=stacklevel)


def take_aliases(obj: object, given: Mapping[str, object], targets: Mapping[str, str],
                 deprecated: Collection[str] = ()) -> None:
    """Sets ``obj.<targets[name]>`` for every alias ``name`` given (not None); a deprecated one
    also warns, naming the new parameter."""
    for name, value in given.items():
        if value is None:
            continue
        if name in deprecated:
            warn_renamed(f"{type(obj).__name__}({name}=...)", f"{targets[name]}=...", stacklevel=5)
        setattr(obj, targets[name], value)
