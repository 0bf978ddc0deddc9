"""Reduced vocabularies: the check that a draft model's vocabulary is the target's, the check of
a list of kept ids, and the target's LM head restricted to some ids
(``DraftModel(draft_vocab_size=N)``: ids ``0 .. N-1``; Medusa heads and EAGLE drafters: their
``vocab_ids``)."""

from __future__ import annotations

import torch

from specdec.model.linear_layers import DotLinear, PackedLinear, UpcastLinear, dense_weight
from specdec.model.prepare import PackingConfig

__all__ = ["check_vocab_ids", "check_vocabulary", "head_for_ids", "head_rows", "vocab_size"]


def vocab_size(model: torch.nn.Module) -> int:
    """The number of token ids ``model``'s LM head scores."""
    return model.get_output_embeddings().out_features


def check_vocabulary(draft: torch.nn.Module, target: torch.nn.Module, shared_vocab: int | None = None) -> int:
    """The target's vocabulary size, after checking that the draft's ids mean the same tokens
    (a mismatch would decode correctly but never speed anything up). ``shared_vocab``: the two
    heads may differ past this many ids (padding rows past the tokenizer)."""
    vocab = (vocab_size(draft), vocab_size(target))
    for name in ("eos_token_id", "bos_token_id"):
        ids = [_setting(m, name) for m in (draft, target)]
        if None not in ids and ids[0] != ids[1]:
            raise ValueError(f"DraftModel: the draft's {name} is {ids[0]}, the target's {ids[1]}: "
                             "the draft must use the target's tokenizer")
    if vocab[0] != vocab[1] and (shared_vocab is None or min(vocab) < shared_vocab):
        hint = ("" if shared_vocab is not None else
                "; if they differ only by padding rows past the tokenizer, pass "
                "DraftModel(..., shared_vocab=len(tokenizer))")
        raise ValueError(f"DraftModel: the draft scores {vocab[0]} token ids, the target {vocab[1]}{hint}")
    return vocab[1]


def check_vocab_ids(vocab_ids: torch.Tensor, target_vocab_size: int, who: str) -> None:
    """Raise ValueError (starting with ``who``) unless ``vocab_ids`` is a reduced vocabulary of a
    target scoring ``target_vocab_size`` ids: a non-empty 1-D tensor of distinct ids in range."""
    if vocab_ids.dim() != 1 or len(vocab_ids) == 0:
        raise ValueError(f"{who}: vocab_ids must be a non-empty 1-D tensor, got shape {tuple(vocab_ids.shape)}")
    if int(vocab_ids.min()) < 0 or int(vocab_ids.max()) >= target_vocab_size:
        raise ValueError(f"{who}: vocab_ids must lie in 0..{target_vocab_size - 1}")
    if len(torch.unique(vocab_ids)) != len(vocab_ids):
        raise ValueError(f"{who}: vocab_ids must not repeat an id")


def head_rows(lm_head: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight rows and bias entries (None without a bias) of an LM head (``nn.Linear``, or
    prepared: ``PackedLinear``) for ``ids``, dense and in its dtype and device: new tensors.

    Example:
        >>> head = torch.nn.Linear(8, 100)
        >>> weight, bias = head_rows(head, torch.tensor([4, 90]))
        >>> torch.equal(weight, head.weight[[4, 90]]), torch.equal(bias, head.bias[[4, 90]])
        (True, True)
    """
    try:
        weight = dense_weight(lm_head)
    except ValueError as e:
        raise ValueError(f"a reduced vocabulary needs a linear LM head: {e}") from None
    rows = ids.to(weight.device)
    bias = getattr(lm_head, "bias", None)
    return weight.index_select(0, rows), None if bias is None else bias.index_select(0, rows)


def head_for_ids(lm_head: torch.nn.Module, ids: int | torch.Tensor) -> torch.nn.Module:
    """A copy of an LM head (``nn.Linear``, or prepared: ``DotLinear``, ``PackedLinear``) scoring only ``ids``
    (a 1-D tensor of ids, its columns in that order; an int n: ids 0 .. n-1).

    Example:
        >>> head = torch.nn.Linear(8, 100)
        >>> x = torch.randn(2, 8)
        >>> lowest, some = head_for_ids(head, 10), head_for_ids(head, torch.tensor([4, 7, 90]))
        >>> lowest.out_features, torch.allclose(lowest(x), head(x)[:, :10])
        (10, True)
        >>> torch.allclose(some(x), head(x)[:, [4, 7, 90]])
        True
    """
    if isinstance(ids, int):
        ids = torch.arange(min(ids, getattr(lm_head, "out_features", ids)))
    weight, bias = head_rows(lm_head, ids)
    sub = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                          device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        sub.weight.copy_(weight)
        if bias is not None:
            sub.bias.copy_(bias)
    # A prepared head stays prepared: packed products are faster on CPU, one-row ones too
    # (docs/benchmarks.md). Not padded: a draft's logits need no row-count invariance
    # (PackingConfig.for_draft).
    if isinstance(lm_head, UpcastLinear):
        return UpcastLinear(sub, lm_head.upcast_rows)
    if isinstance(lm_head, DotLinear):
        return DotLinear(sub)
    config = PackingConfig.for_draft()
    return (PackedLinear(sub, config.batch_hint, min_rows=config.min_rows) if isinstance(lm_head, PackedLinear)
            else sub)


def _setting(model: torch.nn.Module, name: str):
    value = getattr(model.config, name, None)
    return tuple(value) if isinstance(value, list) else value
