"""One forward of a Hugging Face causal LM over a whole token tree (or a prompt), on a SpecCache.

:func:`enable_tree_attention` registers :func:`specdec.ops.tree_attention` as the
``transformers`` attention implementation ``"specdec_tree"`` (through the public
``AttentionInterface``) and selects it for a model. :func:`tree_forward` then runs the model
once over ``tree_tokens [B, T]``: node i of row b is placed at position
``lengths[b] + depth[b, i]``, its key/value are written at cache slot ``lengths[b] + i``, and it
attends to the row's committed positions and to its tree ancestors. The logits of every node
equal those of running its root-to-node path on its own after the same prefix.

Passing ``parents=None`` runs a chain instead (causal attention among the T tokens), which is
how a prompt is prefilled. Ragged prompts are RIGHT-padded: row b's prompt is
``tokens[b, :n_b]``; everything after it is padding that no real token attends to (it comes
later in the causal order) and that the cache drops, because only ``n_b`` entries are kept
(``cache.advance(n)``, see :func:`prefill`). The logits of the prompt's last token are
``logits[b, n_b - 1]``.

Supported: decoder-only models whose attention modules call the attention interface (Llama,
Qwen2, Mistral, Gemma, ... in transformers 5), without attention-logit soft-capping and with
any sliding window at least as long as the cache.

Requires transformers >= 5 (its ``Cache`` layers and ``cache=`` forward argument).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel

from specdec import ops
from specdec.cache import SpecCache

__all__ = ["ATTN_IMPLEMENTATION", "PASS_TOKENS", "SharedPrefix", "enable_tree_attention", "length_groups",
           "node_layout", "prefill", "prefill_from", "prefill_tokens", "prefix_donors", "prefix_offsets",
           "shared_prefixes", "tree_attention_enabled", "tree_forward"]

ATTN_IMPLEMENTATION = "specdec_tree"


def _tree_attention_interface(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    specdec_prefix_len: Tensor | None = None,
    specdec_tree_mask: Tensor | None = None,
    specdec_kv_len: int | None = None,
    specdec_slot_mask: Tensor | None = None,
    specdec_packed: list[tuple[int, int, int]] | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """The ``"specdec_tree"`` attention function: query [B, H, T, D], key/value the whole
    SpecCache buffers [B, Hkv, S, D]; returns [B, T, H, D] as transformers expects. In a packed
    pass the query is [1, H, N, D], the first nodes of each row one after the other, and
    ``specdec_packed`` lists runs ``(first row, rows, width)`` of consecutive rows with as many
    nodes: each run is one attention call over views of its rows."""
    if specdec_prefix_len is None:
        raise ValueError(
            "specdec: the 'specdec_tree' attention runs only inside specdec.tree_forward "
            "(with a SpecCache); call model.set_attn_implementation('sdpa') for plain use"
        )
    if softcap is not None:
        raise NotImplementedError("specdec: tree attention has no attention-logit soft-capping")
    if sliding_window is not None and sliding_window < key.shape[2]:
        raise NotImplementedError(
            f"specdec: the model's sliding window ({sliding_window}) is shorter than the "
            f"SpecCache ({key.shape[2]}); use max_length <= {sliding_window}"
        )
    if dropout:
        raise NotImplementedError("specdec: tree attention has no dropout (use model.eval())")
    if specdec_kv_len is not None:
        return _causal_attention(query, key, value, specdec_prefix_len, specdec_kv_len, scaling), None
    if specdec_packed is None:
        return _masked_attention(query, key, value, specdec_prefix_len, specdec_tree_mask, specdec_slot_mask,
                                 scaling), None
    H, D = query.shape[1], query.shape[3]
    outs, start = [], 0
    for first, rows, width in specdec_packed:
        q = query[0, :, start: start + rows * width].view(H, rows, width, D).transpose(0, 1)
        r = slice(first, first + rows)
        tree = None if specdec_tree_mask is None else specdec_tree_mask[r, :width, :width]
        slots = None if specdec_slot_mask is None else specdec_slot_mask[r, :width]
        outs.append(_masked_attention(q, key[r], value[r], specdec_prefix_len[r], tree, slots,
                                      scaling).reshape(rows * width, H, D))
        start += rows * width
    return torch.cat(outs)[None], None


def _masked_attention(query: Tensor, key: Tensor, value: Tensor, prefix_len: Tensor, tree_mask: Tensor | None,
                      slot_mask: Tensor | None, scaling: float | None) -> Tensor:
    """[B, T, H, D]: the queries over each row's prefix and the nodes the mask shows."""
    if slot_mask is not None:
        return _slot_attention(query, key, value, slot_mask, scaling)
    return ops.tree_attention(query, key, value, prefix_len, tree_mask, scaling).transpose(1, 2)


def _causal_attention(query: Tensor, key: Tensor, value: Tensor, prefix_len: Tensor, kv_len: int,
                      scaling: float | None) -> Tensor:
    """A long chain (a prompt) after each row's prefix, through PyTorch's fused SDPA: a prompt
    needs no tree mask, and the fused kernels tile long sequences better than the tree kernel.
    ``kv_len``: the longest row's prefix + T (only those cache slots are read)."""
    T = query.shape[2]
    key, value = key[:, :, :kv_len], value[:, :, :kv_len]
    if kv_len == T:  # no row has a prefix: plain causal attention
        mask, causal = None, True
    else:  # row b's token i sees slots 0 .. prefix_len[b] + i
        last = prefix_len[:, None] + torch.arange(T, device=query.device)
        mask = (torch.arange(kv_len, device=query.device) <= last[:, :, None])[:, None]
        causal = False
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=causal,
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)


def _slot_mask(prefix_len: Tensor, mask: Tensor, kv_len: int) -> Tensor:
    """``[B, T, kv_len]`` which cache slots each of T new nodes sees, from their mask ``[B, T, S]``
    over the S entries after each row's prefix (``S - T`` pending ones, then the new nodes):
    every prefix slot, and slot ``prefix_len[b] + j`` where ``mask[b, i, j]``."""
    B, T, S = mask.shape
    rel = torch.arange(kv_len, device=mask.device) - prefix_len[:, None]  # [B, kv_len]
    seen = torch.gather(mask, 2, rel.clamp(0, S - 1)[:, None, :].expand(B, T, kv_len))
    return (rel < 0)[:, None, :] | (((rel >= 0) & (rel < S))[:, None, :] & seen)


def _slot_attention(query: Tensor, key: Tensor, value: Tensor, visible: Tensor, scaling: float | None) -> Tensor:
    """Attention of T new nodes over the cache slots ``visible [B, T, kv_len]`` marks, through
    PyTorch's SDPA (a draft's tree passes: they only propose, so they need no row-count
    invariance). The queries of each KV head are stacked (``[B, Hkv, G T, D]``), which runs
    about 2.5x faster on CPU than SDPA's own grouped-query path with a mask."""
    B, H, T, D = query.shape
    Hkv, kv_len = key.shape[1], visible.shape[-1]
    G = H // Hkv
    mask = visible[:, None].expand(B, G, T, kv_len).reshape(B, 1, G * T, kv_len)
    out = F.scaled_dot_product_attention(query.reshape(B, Hkv, G * T, D), key[:, :, :kv_len],
                                         value[:, :, :kv_len], attn_mask=mask, scale=scaling)
    return out.view(B, H, T, D).transpose(1, 2)


def enable_tree_attention(model: PreTrainedModel) -> None:
    """Registers the ``"specdec_tree"`` attention implementation (idempotent) and selects it
    for ``model``. The model then runs only through :func:`tree_forward` and :func:`prefill`
    (select another implementation, e.g. ``model.set_attn_implementation("sdpa")``, to use it
    otherwise). No mask function is registered: transformers builds no mask for it, the tree
    mask travels in the forward's keyword arguments."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, _tree_attention_interface)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)


@contextlib.contextmanager
def tree_attention_enabled(*models: PreTrainedModel) -> Iterator[None]:
    """Selects ``"specdec_tree"`` attention for ``models`` inside the block and restores each
    model's own implementation afterwards, so a decoder call leaves the models as it found them."""
    previous = [m.config._attn_implementation for m in models]
    for m in models:
        enable_tree_attention(m)
    try:
        yield
    finally:
        for m, implementation in zip(models, previous):
            m.set_attn_implementation(implementation)


def _cache_kwarg(model: PreTrainedModel) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def node_layout(parents: Tensor | None, lengths: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The attention mask among a pass's nodes ``[B, T, T]`` and their absolute positions
    ``[B, T]``: those given, else the tree's (a node sees its ancestors and sits at
    ``lengths + depth``)."""
    if attention_mask is not None and position_ids is not None:
        return attention_mask, position_ids
    if parents is None:
        raise ValueError("specdec.tree_forward: an attention_mask needs position_ids or parents")
    tree_mask, depth, _ = ops.build_tree(parents, max_leaves=1, max_depth=0)
    if position_ids is None:
        position_ids = lengths[:, None] + depth.to(lengths.dtype)
    return (tree_mask if attention_mask is None else attention_mask), position_ids


# What one more pass costs, in prompt tokens: a short pass costs about what prefilling a few
# dozen tokens does on a CPU. A prompt prefix that rows share gets a pass of its own, and rows
# of very different prompt lengths are prefilled apart, only where that spares more than this.
PASS_TOKENS = 64

# Chains at least this long (prompts) go through fused SDPA, which tiles long sequences better
# than the tree kernel (prefill of 8000 tokens: 1.58x HF's time through the kernel, HF's time
# through SDPA); shorter ones (a draft's pending tokens) through the tree kernel, which needs
# no host read of the lengths. SDPA's logits depend on the chain's length, which exactness does
# not need: a prompt is prefilled by the same pass whatever the method (method=None included);
# the verify loop's passes always carry a mask and take the row-invariant kernel.
SDPA_MIN_CHAIN = 16


@torch.no_grad()
def tree_forward(
    model: PreTrainedModel,
    cache: SpecCache,
    tree_tokens: Tensor,
    parents: Tensor | None = None,
    keep: Tensor | None = None,
    head: Callable[[Tensor], Tensor] | None = None,
    *,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    return_hidden: bool = False,
    pending: int = 0,
    widths: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Logits of every node of a token tree (or of any attention pattern) per row, in one
    forward pass.

    Args:
        model: a causal LM with :func:`enable_tree_attention` applied.
        cache: its :class:`~specdec.cache.SpecCache`; row b's node i is written at slot
            ``cache.lengths[b] + i``; ``cache.lengths`` is not changed (commit afterwards).
        tree_tokens: ``[B, T]`` token of every node (node 0, the root, is the last emitted
            token, whose key/value are not cached yet).
        parents: ``[B, T]`` the trees (see :func:`specdec.ops.build_tree`): each node attends to
            its ancestors and sits at ``cache.lengths + depth``. ``None`` without
            ``attention_mask``: a chain of T tokens (causal; a prefill).
        keep: ``[K]`` sorted node indices whose logits are wanted (default: all). The LM head
            then runs on those K positions only (``logits_to_keep``), which matters for prompts.
        head: scores the decoder's last hidden states ``[B, K, H]`` in place of the model's own
            LM head (e.g. over part of the vocabulary: a draft's reduced head). The model's
            ``get_decoder()`` runs alone; logit scaling or soft-capping of the model is skipped.
        attention_mask: ``[B, T, T]`` bool, which of the T nodes each node attends to (itself
            included); every node also attends to the row's committed prefix. Overrides the
            mask ``parents`` would give; needs ``position_ids`` or ``parents``.
        position_ids: ``[B, T]`` absolute positions of the nodes (default: from ``parents``).
        return_hidden: also return the decoder's final hidden states (after the final norm,
            the LM head's input) ``[B, T, H]`` (``[B, K, H]`` with ``keep``), from this pass.
        pending: nodes of the same tree that earlier calls wrote after each row's committed
            entries (``cache.lengths[b] ..``) and that stay uncommitted: a tree computed level
            by level. The T new nodes are then written after them, and ``attention_mask``
            (required, with ``position_ids``) is ``[B, T, pending + T]``: which of the pending
            and new nodes each new node sees.
        widths: ``[B]``, row b computes only its first ``widths[b]`` nodes (>= 1; with
            ``parents`` or ``attention_mask``, none of them attending to a later node). The
            others are skipped: nothing is written to their cache slots, their logits (and
            hidden states) are zero. The pass is then packed: the linear layers run over the
            computed nodes only, so a batch whose rows propose different numbers of nodes pays
            for each row's own rather than for every row at the widest; attention runs per
            row as in the rectangular pass, so a node's logits do not change. One host read.

    Returns:
        ``[B, T, V]`` logits (``[B, K, V]`` with ``keep``): the model's next-token logits after
        each node; with ``return_hidden``, ``(logits, hidden)``.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> _ = torch.manual_seed(0)
        >>> cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        ...                   num_hidden_layers=2, intermediate_size=64, vocab_size=50)
        >>> model = LlamaForCausalLM(cfg).eval()
        >>> enable_tree_attention(model)
        >>> cache = SpecCache(cfg, batch_size=1, max_length=32)
        >>> _ = prefill(model, cache, torch.tensor([[1, 2, 3]]))
        >>> tree = torch.tensor([[4, 5, 6]])                    # 5 and 6 both follow 4
        >>> logits = tree_forward(model, cache, tree, torch.tensor([[-1, 0, 0]]))
        >>> alone = tree_forward(model, cache, torch.tensor([[4, 6]]))   # the path 4 -> 6
        >>> torch.allclose(logits[0, 2], alone[0, 1], atol=1e-5)
        True
    """
    if model.config._attn_implementation != ATTN_IMPLEMENTATION:
        raise ValueError(
            "specdec.tree_forward: call specdec.tree_forward.enable_tree_attention(model) first "
            f"(the model uses {model.config._attn_implementation!r} attention)"
        )
    if tree_tokens.dim() != 2:
        raise ValueError(f"specdec.tree_forward: tree_tokens must be [B, T], got {tuple(tree_tokens.shape)}")
    B, T = tree_tokens.shape
    lengths = cache.lengths
    if lengths.shape[0] != B:
        raise ValueError(f"specdec.tree_forward: tree_tokens has {B} rows, the cache {lengths.shape[0]}")
    # The longest row: read once on CPU (free there); on CUDA only for a long chain (a prompt).
    longest = int(lengths.max()) if lengths.device.type == "cpu" else None
    span = pending + T
    if longest is not None and longest + span > cache.max_length:
        raise ValueError(
            f"specdec.tree_forward: {span} more tokens do not fit the cache (max_length "
            f"{cache.max_length}, longest row {longest})"
        )
    if pending and (attention_mask is None or position_ids is None):
        raise ValueError("specdec.tree_forward: pending nodes need attention_mask and position_ids")
    if attention_mask is not None and (attention_mask.shape != (B, T, span) or attention_mask.dtype != torch.bool):
        raise ValueError(f"specdec.tree_forward: attention_mask must be bool [{B}, {T}, {span}], "
                         f"got {attention_mask.dtype} {tuple(attention_mask.shape)}")
    if position_ids is not None and position_ids.shape != (B, T):
        raise ValueError(f"specdec.tree_forward: position_ids must be [{B}, {T}], got {tuple(position_ids.shape)}")
    mask, kv_len = attention_mask, None
    if parents is None and mask is None:  # a chain
        if position_ids is None:
            position_ids = lengths[:, None] + torch.arange(T, device=lengths.device)
        if T >= SDPA_MIN_CHAIN:
            kv_len = (int(lengths.max()) if longest is None else longest) + T
    else:
        mask, position_ids = node_layout(parents, lengths, mask, position_ids)
    inputs = dict(input_ids=tree_tokens, position_ids=position_ids.to(lengths.dtype), use_cache=True,
                  specdec_prefix_len=lengths, specdec_tree_mask=mask, specdec_kv_len=kv_len)
    index = None
    if widths is not None:
        if parents is None and attention_mask is None:
            raise ValueError("specdec.tree_forward: widths need parents or attention_mask")
        if keep is not None:
            raise ValueError("specdec.tree_forward: widths and keep cannot be combined")
        index, runs = _packing(widths, B, T)
    if index is not None:
        inputs.update(input_ids=tree_tokens.flatten()[index][None],
                      position_ids=inputs["position_ids"].flatten()[index][None], specdec_packed=runs)
    if pending:  # the cache writes after the pending nodes; attention sees the slots the mask says
        # CPU: only the slots in use (a free host read); elsewhere the whole cache, no sync.
        kv_len = longest + span if longest is not None else cache.max_length
        inputs["specdec_slot_mask"] = _slot_mask(lengths, mask, kv_len)
        lengths += pending
        try:
            return _packed_forward(model, cache, inputs, index, head, return_hidden, keep, B, T)
        finally:
            lengths -= pending
    return _packed_forward(model, cache, inputs, index, head, return_hidden, keep, B, T)


def _packing(widths: Tensor, B: int, T: int) -> tuple[Tensor | None, list[tuple[int, int, int]]]:
    """The flattened [B, T] indices of row b's first ``widths[b]`` nodes, row after row, and the
    runs ``(first row, rows, width)`` of consecutive rows as wide; None when every row is T wide."""
    if widths.shape != (B,):
        raise ValueError(f"specdec.tree_forward: widths must be [{B}], got {tuple(widths.shape)}")
    w = widths.tolist()
    if min(w) < 1 or max(w) > T:
        raise ValueError(f"specdec.tree_forward: widths must be within 1..{T}, got {w}")
    if min(w) == T:
        return None, []
    runs: list[tuple[int, int, int]] = []
    for b, n in enumerate(w):
        if runs and runs[-1][2] == n:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, n)
        else:
            runs.append((b, 1, n))
    nodes = torch.arange(T, device=widths.device)
    return (nodes < widths[:, None]).flatten().nonzero()[:, 0], runs


def _packed_forward(model: PreTrainedModel, cache: SpecCache, inputs: dict, index: Tensor | None,
                    head: Callable[[Tensor], Tensor] | None, return_hidden: bool,
                    keep: Tensor | None, B: int, T: int) -> Tensor | tuple[Tensor, Tensor]:
    """`_forward`, over the nodes ``index`` (of the flattened [B, T]) packed into one sequence
    when given; the outputs unpacked to [B, T, ...] with zeros at the nodes not computed."""
    if index is None:
        return _forward(model, cache, inputs, keep, head, return_hidden)
    with cache.packed(index // T, index % T):
        out = _forward(model, cache, inputs, None, head, return_hidden)

    def unpack(x: Tensor) -> Tensor:
        return x.new_zeros(B * T, x.shape[-1]).index_copy_(0, index, x[0]).view(B, T, -1)

    return (unpack(out[0]), unpack(out[1])) if return_hidden else unpack(out)


def _forward(model: PreTrainedModel, cache: SpecCache, inputs: dict, keep: Tensor | None,
             head: Callable[[Tensor], Tensor] | None, return_hidden: bool) -> Tensor | tuple[Tensor, Tensor]:
    if head is not None or return_hidden:
        decoder = model.get_decoder()
        hidden = decoder(**inputs, **{_cache_kwarg(decoder): cache}).last_hidden_state
        hidden = hidden if keep is None else hidden[:, keep]
        logits = (head or model.get_output_embeddings())(hidden)
        return (logits, hidden) if return_hidden else logits
    kwargs = {_cache_kwarg(model): cache}
    head_subset = keep is not None and "logits_to_keep" in inspect.signature(model.forward).parameters
    if head_subset:
        kwargs["logits_to_keep"] = keep
    logits = model(**inputs, **kwargs).logits
    return logits[:, keep] if keep is not None and not head_subset else logits


@torch.no_grad()
def prefill(
    model: PreTrainedModel,
    cache: SpecCache,
    tokens: Tensor,
    lengths: Tensor | None = None,
    head: Callable[[Tensor], Tensor] | None = None,
    return_hidden: bool = False,
    shared: Sequence[SharedPrefix] = (),
    pass_tokens: int = 0,
    cached: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Runs right-padded prompts ``tokens[b, :lengths[b]]`` after each row's cached prefix and
    commits them; returns the logits after every prompt's last token, ``[B, V]`` (and with
    ``return_hidden`` the final hidden state there, ``[B, H]``).

    Args:
        model, cache, head, return_hidden: as in :func:`tree_forward`.
        tokens: ``[B, N]`` prompts, right-padded with any token id.
        lengths: ``[B]`` prompt lengths (default: all N).
        shared: prompt prefixes that several rows have in common (a system prompt; see
            :func:`shared_prefixes`), with an empty cache: each is computed once, in a one-row
            pass, copied into its rows (:meth:`SpecCache.copy_row`), and only the rest of each
            prompt runs batched. A row's last prompt token must come after its shared prefix.
        pass_tokens: what one more pass costs, in prompt tokens (`PASS_TOKENS`); > 0: rows of
            very different lengths run in separate passes (`length_groups`), so that short
            prompts are not padded to the longest, wherever that spares more padding than the
            extra passes cost. 0: one pass over every row.
        cached: ``[B]``, the cache already holds the first ``cached[b]`` tokens of row b's
            prompt (copied from another cache, `SpecCache.copy_row`; its length set to them):
            only the rest of each prompt runs, as after a shared prefix.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> _ = torch.manual_seed(0)
        >>> cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        ...                   num_hidden_layers=2, intermediate_size=64, vocab_size=50)
        >>> model = LlamaForCausalLM(cfg).eval()
        >>> enable_tree_attention(model)
        >>> prompts = torch.tensor([[1, 2, 3, 4, 5], [7, 8, 9, 9, 0], [1, 2, 3, 9, 0]])
        >>> lengths = torch.tensor([5, 4, 4])
        >>> groups = shared_prefixes(prompts, lengths)
        >>> groups                                   # rows 0 and 2 start with 1, 2, 3
        (SharedPrefix(rows=(0, 2), length=3),)
        >>> once, apart = (SpecCache(cfg, batch_size=3, max_length=8) for _ in range(2))
        >>> shared_logits = prefill(model, once, prompts, lengths, shared=groups)
        >>> torch.allclose(shared_logits, prefill(model, apart, prompts, lengths), atol=1e-5)
        True
    """
    B, N = tokens.shape
    if lengths is None:
        lengths = torch.full((B,), N, dtype=torch.int64, device=tokens.device)
    if shared and cached is not None:
        raise ValueError("specdec.prefill: shared and cached cannot be combined")
    offsets = prefix_offsets(shared, B, tokens.device) if shared else cached
    if offsets is not None and bool((offsets >= lengths).any()):
        raise ValueError("specdec.prefill: a shared prefix (or a cached one) must end before its row's prompt does")
    for group in shared:
        n = group.length
        one = SpecCache(model.config, 1, n, cache.layers[0].keys.dtype, cache.lengths.device)
        first = tokens[group.rows[0], :n][None]
        tree_forward(model, one, first, keep=torch.tensor([n - 1], device=tokens.device), head=head)
        one.advance(torch.tensor([n]))
        cache.copy_row(one, torch.tensor(group.rows, device=cache.lengths.device))
    if offsets is not None:
        # Each row's rest, moved to the front (right-padded again).
        columns = torch.arange(N, device=tokens.device)
        tokens = torch.gather(tokens, 1, (offsets[:, None] + columns).clamp_max(N - 1))
        lengths = lengths - offsets
        N = int(lengths.max())
        tokens = tokens[:, :N]
    groups = length_groups(lengths, pass_tokens) if pass_tokens else [None]
    if len(groups) == 1:
        return _prefill_rows(model, cache, tokens, lengths, head, return_hidden)
    outs = []
    for rows in groups:  # each group in a cache of its rows, copied back into theirs
        rows = rows.to(tokens.device)
        n = int(lengths[rows].max())
        part = cache.rows_of(rows, int(cache.lengths[rows].max()) + n)
        outs.append(_prefill_rows(model, part, tokens[rows, :n], lengths[rows], head, return_hidden))
        cache.copy_row(part, rows)
    order = torch.cat(groups).to(tokens.device).argsort()  # back to the rows' own order
    if return_hidden:
        return torch.cat([o[0] for o in outs])[order], torch.cat([o[1] for o in outs])[order]
    return torch.cat(outs)[order]


@torch.no_grad()
def prefill_from(model: PreTrainedModel, cache: SpecCache, source: SpecCache, donor: Tensor, reused: Tensor,
                 tokens: Tensor, lengths: Tensor, head: Callable[[Tensor], Tensor] | None = None,
                 return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """`prefill` of right-padded prompts ``tokens [k, N]`` (``lengths``) into the empty ``cache``,
    the first ``reused[j]`` entries of row j copied from row ``donor[j]`` of ``source`` (-1: none;
    `prefix_donors` finds them) and only the rest computed, in passes grouped by length.

    Example (the second prompt starts as row 1 of a batch already prefilled):
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> _ = torch.manual_seed(0)
        >>> cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        ...                   num_hidden_layers=2, intermediate_size=64, vocab_size=50)
        >>> model = LlamaForCausalLM(cfg).eval()
        >>> enable_tree_attention(model)
        >>> running = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
        >>> batch = SpecCache(cfg, batch_size=2, max_length=16)
        >>> _ = prefill(model, batch, running)
        >>> joining = torch.tensor([[9, 9, 0], [5, 6, 7]])
        >>> donor, reused = prefix_donors(joining, torch.tensor([2, 3]), running, torch.tensor([4, 4]))
        >>> donor.tolist(), reused.tolist()
        ([-1, 1], [0, 2])
        >>> copied, computed = (SpecCache(cfg, batch_size=2, max_length=16) for _ in range(2))
        >>> logits = prefill_from(model, copied, batch, donor, reused, joining, torch.tensor([2, 3]))
        >>> torch.allclose(logits, prefill(model, computed, joining, torch.tensor([2, 3])), atol=1e-5)
        True
    """
    device = tokens.device
    rows = (donor >= 0).nonzero()[:, 0].to(device)
    if rows.numel():
        part = source.rows_of(donor[donor >= 0].to(device), min(source.max_length, cache.max_length))
        cache.copy_row(part, rows)
    reused = reused.to(device)
    cache.lengths.copy_(reused)
    return prefill(model, cache, tokens, lengths, head=head, return_hidden=return_hidden, pass_tokens=PASS_TOKENS,
                   cached=reused)


def _prefill_rows(model: PreTrainedModel, cache: SpecCache, tokens: Tensor, lengths: Tensor,
                  head: Callable[[Tensor], Tensor] | None, return_hidden: bool) -> Tensor | tuple[Tensor, Tensor]:
    """One pass over right-padded ``tokens [B, N]`` (``lengths [B]``), committed; the logits
    (and hidden states) after each row's last token."""
    B = tokens.shape[0]
    last = (lengths.to(torch.int64) - 1).clamp_min(0).to(tokens.device)
    # The LM head runs only where some row's prompt ends, not over every prompt token.
    columns = torch.unique(last)
    out = tree_forward(model, cache, tokens, keep=columns, head=head, return_hidden=return_hidden)
    cache.advance(lengths)
    rows, cols = torch.arange(B, device=tokens.device), torch.searchsorted(columns, last)
    if return_hidden:
        return out[0][rows, cols], out[1][rows, cols]
    return out[rows, cols]


def length_groups(lengths: Tensor, pass_tokens: int) -> list[Tensor]:
    """Rows ``[B]`` of prompts of ``lengths`` split into groups prefilled in one pass each,
    padded to the group's longest: the split of the rows sorted by length that computes the
    fewest tokens, counting ``pass_tokens`` for each pass (a dynamic program; host-side).

    Example (a long prompt among short ones: padding the short ones to 300 would compute 1200
    tokens, two passes compute 300 + 3 x 40 and cost two passes):
        >>> length_groups(torch.tensor([40, 300, 35, 38]), pass_tokens=64)
        [tensor([1]), tensor([0, 3, 2])]
        >>> length_groups(torch.tensor([40, 50, 35, 38]), pass_tokens=64)
        [tensor([1, 0, 3, 2])]
    """
    order = torch.sort(lengths.cpu(), descending=True, stable=True).indices
    n = lengths.cpu()[order].tolist()
    B = len(n)
    # best[j]: least cost of the first j sorted rows; start[j]: where the last group starts.
    best, start = [0.0] + [float("inf")] * B, [0] * (B + 1)
    for j in range(1, B + 1):
        for i in range(j):  # the group of sorted rows i .. j - 1, padded to n[i]
            cost = best[i] + (j - i) * n[i] + pass_tokens
            if cost < best[j]:
                best[j], start[j] = cost, i
    groups, j = [], B
    while j > 0:
        groups.append(order[start[j]:j])
        j = start[j]
    return groups[::-1]


def prefill_tokens(lengths: Tensor, pass_tokens: int) -> int:
    """Prompt tokens the passes of :func:`prefill` compute for prompts of ``lengths`` (after any
    shared prefix), padding included: each `length_groups` group padded to its longest.

    Example:
        >>> prefill_tokens(torch.tensor([40, 300, 35, 38]), pass_tokens=64)   # 300 + 3 x 40
        420
    """
    lengths = lengths.cpu()
    return sum(len(g) * int(lengths[g].max()) for g in length_groups(lengths, pass_tokens))


@dataclass(frozen=True)
class SharedPrefix:
    """The first ``length`` prompt tokens of ``rows`` (batch indices) are the same."""

    rows: tuple[int, ...]
    length: int


def shared_prefixes(tokens: Tensor, lengths: Tensor, min_saved: int = 0) -> tuple[SharedPrefix, ...]:
    """Groups of rows of right-padded prompts ``tokens [B, N]`` that start alike, chosen to spare
    the most prefill: a group of k rows sharing n tokens spares (k - 1) n and is formed only when
    that is more than ``min_saved`` (what its pass of its own costs, in tokens). The rows are
    sorted by their prompts and split into runs (a dynamic program over the neighbours' common
    lengths); a group's prefix stops one token before its shortest prompt ends (each row keeps
    its last token for its own pass). Host-side, O(B^2) plus the sort."""
    B = tokens.shape[0]
    rows = [tokens[b, : int(n)].tolist() for b, n in enumerate(lengths)]
    order = sorted(range(B), key=rows.__getitem__)

    def common(a: list[int], b: list[int]) -> int:
        n = min(len(a), len(b)) - 1
        return next((i for i in range(n) if a[i] != b[i]), max(n, 0))

    near = [common(rows[a], rows[b]) for a, b in zip(order, order[1:])]
    # best[j]: most tokens spared (net of min_saved per group) by the first j sorted rows;
    # start[j]: where the run ending at sorted row j - 1 starts.
    best, start = [0] * (B + 1), list(range(-1, B))
    for j in range(1, B + 1):
        best[j], start[j], n = best[j - 1], j - 1, None
        for i in range(j - 1, 0, -1):  # the run of sorted rows i - 1 .. j - 1
            n = near[i - 1] if n is None else min(n, near[i - 1])
            if n == 0:
                break
            if best[i - 1] + (j - i) * n - min_saved > best[j]:
                best[j], start[j] = best[i - 1] + (j - i) * n - min_saved, i - 1
    groups, j = [], B
    while j > 0:
        i = start[j]
        if j - i > 1:
            groups.append(SharedPrefix(tuple(sorted(order[i:j])), min(near[i:j - 1])))
        j = i
    return tuple(sorted(groups, key=lambda g: g.rows))


def prefix_donors(tokens: Tensor, lengths: Tensor, donor_tokens: Tensor, donor_lengths: Tensor,
                  min_tokens: int = 1) -> tuple[Tensor, Tensor]:
    """For rows of prompts ``tokens [k, N]`` (right-padded, ``lengths [k]``) joining a batch whose
    rows have the prompts ``donor_tokens [R, M]`` (``donor_lengths [R]``): ``(donor [k], length
    [k])``, the batch row whose prompt starts with the longest common prefix and that prefix's
    length (stopping one token before the joining prompt ends; 0 and donor -1 below
    ``min_tokens``). Its cache entries can be copied instead of computed.

    Example:
        >>> donor, n = prefix_donors(torch.tensor([[5, 6, 7, 8], [9, 9, 0, 0]]), torch.tensor([4, 2]),
        ...                          torch.tensor([[1, 2, 3], [5, 6, 7]]), torch.tensor([3, 3]))
        >>> donor.tolist(), n.tolist()
        ([1, -1], [3, 0])
    """
    k, R = tokens.shape[0], donor_tokens.shape[0]
    if R == 0:
        return torch.full((k,), -1, dtype=torch.int64), torch.zeros(k, dtype=torch.int64)
    width = min(tokens.shape[1], donor_tokens.shape[1])
    columns = torch.arange(width, device=tokens.device)
    same = tokens[:, None, :width] == donor_tokens[None, :, :width].to(tokens.device)
    within = (columns < (lengths[:, None, None] - 1)) & (columns < donor_lengths.to(tokens.device)[None, :, None])
    common = (same & within).long().cumprod(2).sum(2)  # [k, R]
    length, donor = common.max(1)
    use = length >= min_tokens
    return torch.where(use, donor, -1).cpu(), torch.where(use, length, 0).cpu()


def prefix_offsets(groups: Sequence[SharedPrefix], batch: int, device: torch.device | str = "cpu") -> Tensor:
    """``[batch]`` int64: each row's shared prefix length (0 for rows in no group)."""
    offsets = torch.zeros(batch, dtype=torch.int64)
    for group in groups:
        offsets[list(group.rows)] = group.length
    return offsets.to(device)
