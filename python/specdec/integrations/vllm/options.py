"""Options of specdec's vLLM proposers: vLLM's own fields, then ``additional_config["specdec"]``.

vLLM gives a ``custom_class`` proposer its ``VllmConfig``. The draft length is vLLM's
``speculative_config.num_speculative_tokens``. vLLM 0.32 sets ``prompt_lookup_min/max`` to 0 for
``custom_class`` whatever the user gave, so those, and every other option, come from the
engine's ``additional_config`` under the key ``"specdec"`` (``LLM(..., additional_config=
{"specdec": {"max_ngram": 5}})``, ``vllm serve --additional-config '{"specdec": {...}}'``); vLLM's names
``prompt_lookup_min/max`` are accepted for ``min_ngram/max_ngram``. An option that is not a
field of the proposer's options is an error that names it.

Example:
    >>> from types import SimpleNamespace as NS
    >>> cfg = NS(speculative_config=NS(num_speculative_tokens=6),
    ...          model_config=NS(max_model_len=2048, get_vocab_size=lambda: 100),
    ...          additional_config={"specdec": {"max_ngram": 5}})
    >>> opts = options_from(cfg, LookupOptions, "PromptLookup")
    >>> opts.num_speculative_tokens, opts.max_ngram, opts.min_ngram
    (6, 5, 2)
    >>> options_from(NS(**{**vars(cfg), "additional_config": {"specdec": {"ngram_max": 4}}}),
    ...              LookupOptions, "PromptLookup")
    Traceback (most recent call last):
    ...
    ValueError: specdec.vllm.PromptLookup: unknown option 'ngram_max' in additional_config['specdec']; its options are adaptive, earliest, explore_every, max_ngram, min_ngram, timed
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from specdec.loop.cost_model import EXPLORE_EVERY

__all__ = ["LookaheadOptions", "LookupOptions", "options_from"]

CONFIG_KEY = "specdec"


@dataclass(frozen=True)
class LookupOptions:
    """Prompt lookup's options (specdec's defaults: the longest suffix of 4 down to 2 tokens,
    copied from its earliest occurrence, the original being edited).

    Inside vLLM a step that carries drafts costs more than one that does not, whatever their
    length, and a copy after a single matching token is seldom right, so no copy is made after
    fewer than 2 (the measurements behind it: docs/benchmarks.md, "Inside vLLM"). Drafts are
    judged by the length of their match, and a copy that goes on where the last one was
    accepted matches 4 tokens where one found afresh matches 2, hence ``max_ngram`` 4.

    ``num_speculative_tokens``: the most draft tokens per request and step (vLLM's field,
    which vLLM requires).
    ``adaptive``: each step, of each draft only the tokens that raise the engine's expected
    tokens per ms at its measured step prices (:mod:`~specdec.integrations.vllm.lengths`);
    False: every draft whole. ``explore_every``: with ``adaptive``, every this many steps on
    which drafts were cut, none is, so that what the cut ones would have done keeps being
    measured. ``timed``: False prices the steps at ``step_cost.PRIOR`` (a fit of vLLM's CPU build)
    instead of timing them, so that the same outputs get the same drafts whatever the machine's
    load (tests, reproducing a run); the choice still follows the measured acceptance.
    ``max_model_len``, ``vocab_size``: the engine's, filled in from vLLM's model config.
    """

    num_speculative_tokens: int
    max_model_len: int
    vocab_size: int
    min_ngram: int = 2
    max_ngram: int = 4
    earliest: bool = True
    adaptive: bool = True
    explore_every: int = EXPLORE_EVERY
    timed: bool = True

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.explore_every < 2:
            raise ValueError(f"explore_every must be >= 2 (1 would never cut a draft), got {self.explore_every}")


@dataclass(frozen=True)
class LookaheadOptions(LookupOptions):
    """Lookahead's options: prompt lookup's (its copy comes first), and the n-gram pool's
    ``ngram`` (N: a key token and N - 1 continuation tokens)."""

    ngram: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ngram < 2:
            raise ValueError(f"ngram must be >= 2 (a key token and a continuation), got {self.ngram}")


_O = TypeVar("_O", bound=LookupOptions)
_FROM_VLLM = ("num_speculative_tokens", "max_model_len", "vocab_size")
# vLLM's names for the same options (its ngram method's), accepted here too.
_VLLM_NAMES = {"prompt_lookup_min": "min_ngram", "prompt_lookup_max": "max_ngram"}


def options_from(vllm_config: Any, cls: type[_O], proposer: str) -> _O:
    """``cls`` filled from ``vllm_config``: vLLM's fields, then ``additional_config["specdec"]``.
    Raises ValueError naming an unknown or invalid option."""
    spec = vllm_config.speculative_config
    model = vllm_config.model_config
    values: dict[str, Any] = {
        "num_speculative_tokens": spec.num_speculative_tokens,  # vLLM requires it
        "max_model_len": model.max_model_len,
        "vocab_size": model.get_vocab_size(),
    }
    extra = (getattr(vllm_config, "additional_config", None) or {}).get(CONFIG_KEY, {})
    if not isinstance(extra, dict):
        raise ValueError(f"specdec.vllm.{proposer}: additional_config['{CONFIG_KEY}'] must be a dict of "
                         f"options, got {type(extra).__name__}")
    known = sorted(f.name for f in dataclasses.fields(cls) if f.name not in _FROM_VLLM)
    for alias, name in _VLLM_NAMES.items():
        if alias in extra and name in extra:
            raise ValueError(f"specdec.vllm.{proposer}: both {alias!r} and {name!r} in "
                             f"additional_config['{CONFIG_KEY}']: they are the same option")
    extra = {_VLLM_NAMES.get(name, name): value for name, value in extra.items()}
    for name, value in extra.items():
        if name in _FROM_VLLM:
            raise ValueError(f"specdec.vllm.{proposer}: {name!r} in additional_config['{CONFIG_KEY}'] comes "
                             "from vLLM's own configuration (speculative_config, max_model_len), not from here")
        if name not in known:
            raise ValueError(f"specdec.vllm.{proposer}: unknown option {name!r} in "
                             f"additional_config['{CONFIG_KEY}']; its options are {', '.join(known)}")
        default = next(f.default for f in dataclasses.fields(cls) if f.name == name)
        if type(value) is not type(default) and not (type(default) is float and type(value) is int):
            raise ValueError(f"specdec.vllm.{proposer}: option {name!r} must be a "
                             f"{type(default).__name__}, got {value!r}")
        values[name] = value
    try:
        return cls(**values)
    except ValueError as e:
        raise ValueError(f"specdec.vllm.{proposer}: {e}") from None
