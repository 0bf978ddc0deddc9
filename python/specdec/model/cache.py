"""One preallocated KV cache for speculative decoding over Hugging Face models.

:class:`SpecCache` is a ``transformers`` :class:`~transformers.Cache` whose every layer holds
``keys``/``values`` of shape ``[B, Hkv, max_length, D]``, allocated once, and a per-row
``lengths`` tensor ``[B]`` (int64, on the cache's device) shared by all layers: row ``b`` has
committed positions ``0 .. lengths[b] - 1``. During a forward (see
:func:`specdec.model.forward.tree_forward`) the T new tokens' keys/values of row ``b`` are
written at ``lengths[b] .. lengths[b] + T - 1`` (rows may have different lengths) and
``lengths`` does not move; afterwards the decoder keeps what it accepted:

- :meth:`SpecCache.commit` / :meth:`SpecCache.commit_path` move the accepted entries into place
  for every layer in one ``kv_commit`` call and advance ``lengths``;
- :meth:`SpecCache.advance` keeps the first n new entries of each row as they are (a prefill, a
  chain whose first n tokens were accepted);
- :meth:`SpecCache.rollback` sets ``lengths`` back (no copy);
- :meth:`SpecCache.copy_row` fills rows from a one-row cache (a prompt prefix the rows share,
  computed once: :func:`specdec.model.prefill.prefill` with ``shared``), or from a cache of some
  rows taken with :meth:`SpecCache.rows_of` (prompts of similar lengths prefilled apart);
- :meth:`SpecCache.keep_rows` drops rows (those that finished; the others' entries are copied
  into buffers of that many rows), :meth:`SpecCache.join` appends rows (requests that take
  their places).

Nothing is reallocated per step (only when rows leave), and no method synchronises with the
device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor
from transformers import PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin

from specdec import ops

__all__ = ["SpecCache", "SpecCacheLayer"]


class SpecCacheLayer(CacheLayerMixin):
    """One layer of a :class:`SpecCache`: preallocated keys/values and the shared lengths."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, keys: Tensor, values: Tensor, lengths: Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.lengths = keys, values, lengths
        self.device = keys.device
        self.max_length = keys.shape[2]
        self.is_initialized = True
        # (rows [N], slots [N]) during a packed pass (`SpecCache.packed`): the N tokens of a
        # pass come as one sequence, token n written at slots[n] of row rows[n].
        self.packing: tuple[Tensor, Tensor] | None = None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        """Nothing to do: the tensors are allocated up front."""

    def update(
        self, key_states: Tensor, value_states: Tensor, *args, **kwargs
    ) -> tuple[Tensor, Tensor]:
        """Writes the T new entries of row b at ``lengths[b] ..``; returns the whole buffers.

        Positions past the end of the cache are clamped to its last slot (a CUDA tensor cannot
        raise without a synchronisation; :func:`~specdec.model.forward.tree_forward` checks the
        room on CPU).
        """
        B, _, T, _ = key_states.shape
        if self.packing is not None:  # one sequence [1, Hkv, N, D]: token n at its row's node slot
            rows, pos = self.packing
            self.keys[rows, :, pos] = key_states[0].transpose(0, 1).to(self.keys.dtype)
            self.values[rows, :, pos] = value_states[0].transpose(0, 1).to(self.values.dtype)
            return self.keys, self.values
        rows = torch.arange(B, device=self.device)[:, None]
        pos = (self.lengths[:, None] + torch.arange(T, device=self.device)).clamp_max(
            self.max_length - 1
        )
        # Advanced indices around a slice put the indexed dims first: [B, T, Hkv, D].
        self.keys[rows, :, pos] = key_states.transpose(1, 2).to(self.keys.dtype)
        self.values[rows, :, pos] = value_states.transpose(1, 2).to(self.values.dtype)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.max_length, 0

    def get_seq_length(self) -> Tensor:  # type: ignore[override]
        """The longest row (a 0-d tensor: rows are ragged, and an int would need a sync)."""
        return self.lengths.amax()

    def get_max_length(self) -> int:
        return self.max_length

    def reset(self) -> None:
        self.lengths.zero_()


class SpecCache(Cache):
    """Preallocated KV cache with ragged per-row lengths, shared by every specdec decoder.

    Args:
        config: the model's config (its text decoder's is used): layers, KV heads, head size.
        batch_size: rows B.
        max_length: positions per row (prompt + generated + the largest tree verified at once).
        dtype, device: of the keys/values (the model's).

    Example:
        >>> from transformers import LlamaConfig
        >>> cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        ...                   num_hidden_layers=2, intermediate_size=64, vocab_size=50)
        >>> cache = SpecCache(cfg, batch_size=2, max_length=16)
        >>> len(cache), tuple(cache.layers[0].keys.shape), cache.lengths.tolist()
        (2, (2, 2, 16, 8), [0, 0])
        >>> cache.advance(torch.tensor([5, 3]))                  # e.g. after a prefill
        >>> cache.commit_path(torch.tensor([[0, 2, -1], [0, -1, -1]]), torch.tensor([1, 0]))
        >>> cache.lengths.tolist()                               # root + accepted nodes
        [7, 4]
    """

    def __init__(
        self,
        config: PretrainedConfig,
        batch_size: int,
        max_length: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        cfg = config.get_text_config(decoder=True)
        n_layers = cfg.num_hidden_layers
        n_heads = cfg.num_attention_heads
        n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
        for kind in getattr(cfg, "layer_types", None) or []:
            if kind not in ("full_attention", "sliding_attention"):
                raise NotImplementedError(
                    f"specdec.SpecCache: layers of type {kind!r} are not supported"
                )
        shape = (batch_size, n_kv, max_length, head_dim)
        self._hold(torch.zeros(batch_size, dtype=torch.int64, device=device),
                   [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                    for _ in range(n_layers)])

    def _hold(self, lengths: Tensor, layers: list[tuple[Tensor, Tensor]]) -> None:
        """Takes ``lengths [B]`` and each layer's (keys, values) ``[B, Hkv, max_length, D]``."""
        self.lengths = lengths
        super().__init__(layers=[SpecCacheLayer(keys, values, lengths) for keys, values in layers])
        self.max_length = layers[0][0].shape[2]

    @classmethod
    def for_model(cls, model: PreTrainedModel, batch_size: int, max_length: int) -> SpecCache:
        """A cache for ``model``, in its dtype and on its device."""
        return cls(model.config, batch_size, max_length, model.dtype, model.device)

    @property
    def key_caches(self) -> list[Tensor]:
        return [layer.keys for layer in self.layers]

    @property
    def value_caches(self) -> list[Tensor]:
        return [layer.values for layer in self.layers]

    def commit(self, src_pos: Tensor, accept_len: Tensor) -> None:
        """Moves ``src_pos[b, :accept_len[b]]`` (absolute positions) to ``lengths[b] ..`` in
        every layer and advances ``lengths`` (one :func:`specdec.ops.kv_commit`)."""
        ops.kv_commit(
            self.key_caches,
            self.value_caches,
            self.lengths,
            src_pos.to(self.lengths.dtype),
            accept_len.to(self.lengths.dtype),
        )

    def commit_path(self, accept_path: Tensor, accept_len: Tensor) -> None:
        """Keeps a verified tree's root and accepted nodes, as the tree verification ops return
        them (``accept_path[b] = [0, n1, .., n_k, -1, ..]``, ``accept_len[b] = k``); the tree's
        node i was written at ``lengths[b] + i`` by the verification forward."""
        src = self.lengths[:, None] + accept_path.to(self.lengths.dtype).clamp_min(0)
        self.commit(src, accept_len.to(self.lengths.dtype) + 1)

    def copy_row(self, src: SpecCache, rows: Tensor | None = None) -> None:
        """Makes ``rows`` (default: every row) copies of ``src``'s one row (its entries and
        length): a prompt prefix those rows share, computed once. From a ``src`` of as many rows
        as ``rows``, copies row i into ``rows[i]`` instead (rows prefilled apart, `rows_of`).
        Later writes go to each row's own slots."""
        k = src.lengths.shape[0]
        wanted = self.lengths.shape[0] if rows is None else rows.numel()
        if k not in (1, wanted) or len(src.layers) != len(self.layers) or src.max_length > self.max_length:
            raise ValueError("SpecCache.copy_row: src must be a cache of the same model with one row or "
                             f"one per row copied into, at most {self.max_length} long")
        rows = slice(None) if rows is None else rows
        n = src.max_length
        for layer, one in zip(self.layers, src.layers):
            layer.keys[rows, :, :n] = one.keys
            layer.values[rows, :, :n] = one.values
        self.lengths[rows] = src.lengths

    def rows_of(self, rows: Tensor, max_length: int) -> SpecCache:
        """A new cache of ``rows`` (indices) holding their first ``max_length`` entries and
        their lengths: a pass over some rows only, copied back with `copy_row`."""
        out = SpecCache.__new__(SpecCache)
        out._hold(self.lengths[rows], [(layer.keys[rows, :, :max_length], layer.values[rows, :, :max_length])
                                       for layer in self.layers])
        return out

    @contextlib.contextmanager
    def packed(self, rows: Tensor, nodes: Tensor) -> Iterator[None]:
        """Inside the block the model's passes are packed: their N tokens come as one sequence,
        token n being node ``nodes[n]`` of row ``rows[n]``, written at slot
        ``lengths[rows[n]] + nodes[n]`` (where the rectangular pass would write it)."""
        slots = (self.lengths[rows] + nodes).clamp_max(self.max_length - 1)  # once for every layer
        for layer in self.layers:
            layer.packing = (rows, slots)
        try:
            yield
        finally:
            for layer in self.layers:
                layer.packing = None

    def keep_rows(self, rows: Tensor) -> None:
        """The batch keeps only ``rows`` (indices into it, in their new order): their entries
        are copied into buffers of that many rows (rows that have finished stop costing)."""
        self.lengths = self.lengths[rows]
        for layer in self.layers:
            layer.keys, layer.values, layer.lengths = layer.keys[rows], layer.values[rows], self.lengths

    def join(self, other: SpecCache) -> None:
        """Appends ``other``'s rows (a cache of the same model: rows that join the batch) after
        this cache's; both are copied into buffers of that many rows, as long as the longer."""
        if len(other.layers) != len(self.layers):
            raise ValueError("SpecCache.join: other must be a cache of the same model")
        n = max(self.max_length, other.max_length)

        def cat(a: Tensor, b: Tensor) -> Tensor:
            out = a.new_zeros(a.shape[0] + b.shape[0], *a.shape[1:2], n, *a.shape[3:])
            out[: a.shape[0], :, : a.shape[2]] = a
            out[a.shape[0]:, :, : b.shape[2]] = b
            return out

        self._hold(torch.cat([self.lengths, other.lengths]),
                   [(cat(a.keys, b.keys), cat(a.values, b.values)) for a, b in zip(self.layers, other.layers)])

    def advance(self, counts: Tensor) -> None:
        """Keeps the first ``counts[b]`` entries written after ``lengths[b]``, where they are."""
        self.lengths += counts.to(self.lengths)

    def rollback(self, lengths: Tensor) -> None:
        """Sets the committed lengths (shorter ones drop entries; nothing is copied)."""
        self.lengths.copy_(lengths)
