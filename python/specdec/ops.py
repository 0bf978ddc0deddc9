"""Typed Python wrappers over the compiled ops (``torch.ops.specdec.*``), and their fake kernels.

The compiled ops take their outputs as preallocated out-arguments (``Tensor(a!)``), so engines
can reuse buffers and capture CUDA graphs; the functions here allocate them and return them.
Every op checks shapes, dtypes and devices and raises a ``ValueError``/``TypeError`` naming the
argument; the fake kernels make the same checks, so torch.compile raises them while tracing.
Values (token ids in the vocabulary, ``parents`` being a tree) are checked on CPU tensors; CUDA
kernels cannot raise without a host synchronisation, so there an invalid value is handled
safely instead (never read or written out of bounds; see docs/ops.md).

Index tensors may be int64 or int32; all index tensors of one call share a dtype, and the
outputs use it. Probabilities may be float32, float16 or bfloat16 (computed in float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec import _C  # noqa: F401  (loads the library that registers the ops)

__all__ = [
    "TypicalAcceptance",
    "build_tree",
    "chain_greedy_verify",
    "chain_speculative_sampling",
    "kv_commit",
    "ngram_match",
    "ngram_pool_insert",
    "ngram_pool_lookup",
    "tree_attention",
    "tree_speculative_sampling",
    "tree_verify_greedy",
]

_ops = torch.ops.specdec


def _size(t: Tensor, dim: int) -> int:
    # Output shapes come from the inputs; when an input has the wrong rank the op itself reports
    # it (naming the argument), so any placeholder size will do here.
    return t.shape[dim] if t.dim() > dim else 1


@dataclass(frozen=True)
class TypicalAcceptance:
    """Medusa's typical acceptance: a LOSSY verification mode, used only when asked for.

    A draft token is accepted when the target gives it more probability than
    ``min(posterior_threshold, posterior_alpha * exp(-entropy))`` of the target's distribution
    at that position. Outputs no longer follow the target's distribution exactly.
    """

    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3


# ---- chain and tree verification ----------------------------------------------------------------
def chain_speculative_sampling(
    draft_probs: Tensor | None, draft_ids: Tensor, target_probs: Tensor, uniform: Tensor
) -> tuple[Tensor, Tensor]:
    """Lossless verification of a chain of K drafted tokens per row (speculative sampling).

    Draft ``i`` is accepted while ``uniform[:, i] * q_i(x_i) < p_i(x_i)``. At the first rejection
    the next token is drawn from ``norm(max(0, p_i - q_i))``; when all K are accepted, from
    ``p_K``. The draw uses ``uniform[:, K]``. The emitted tokens are distributed exactly as
    sampling from the target.

    Args:
        draft_probs: ``[B, K, V]`` draft distributions the drafts were sampled from, or ``None``
            for deterministic drafts (q = 1: n-gram, Medusa, greedy drafters).
        draft_ids: ``[B, K]`` drafted token ids (int64 or int32).
        target_probs: ``[B, K + 1, V]`` target distributions (rows sum to 1) at each position.
        uniform: ``[B, K + 1]`` float32 samples from U[0, 1).

    Returns:
        ``(out_ids [B, K + 1], accept_len [B])``: each row holds its ``accept_len`` accepted
        drafts, one sampled token, then -1.

    Example:
        >>> p = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
        >>> out, n = chain_speculative_sampling(None, torch.tensor([[1, 2]]), p,
        ...                                     torch.full((1, 3), 0.5))
        >>> out.tolist(), n.tolist()
        ([[1, 2, 0]], [2])
    """
    B, K = _size(draft_ids, 0), _size(draft_ids, 1)
    out_ids = draft_ids.new_empty((B, K + 1))
    accept_len = draft_ids.new_empty((B,))
    _ops.chain_speculative_sampling(
        draft_probs, draft_ids, target_probs, uniform, out_ids=out_ids, accept_len=accept_len
    )
    return out_ids, accept_len


def chain_greedy_verify(draft_ids: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy verification of a chain of K drafted tokens per row.

    Args:
        draft_ids: ``[B, K]`` drafted token ids: in ``[0, V)`` with logits, ``>= 0`` with
            token ids (on CUDA an invalid one is never accepted instead of raising).
        target: the target's greedy tokens ``[B, K + 1]`` (same dtype as ``draft_ids``, each
            ``>= 0``), or its logits ``[B, K + 1, V]`` (the argmax is taken inside, with torch's
            conventions).

    Returns:
        ``(out_ids [B, K + 1], accept_len [B])``: the drafts that equal the target's tokens, the
        target's token at the first mismatch (or after the last draft), then -1.

    Example:
        >>> out, n = chain_greedy_verify(torch.tensor([[5, 7, 9]]), torch.tensor([[5, 7, 2, 4]]))
        >>> out.tolist(), n.tolist()
        ([[5, 7, 2, -1]], [2])
    """
    B, K = _size(draft_ids, 0), _size(draft_ids, 1)
    out_ids = draft_ids.new_empty((B, K + 1))
    accept_len = draft_ids.new_empty((B,))
    _ops.chain_greedy_verify(draft_ids, target, out_ids=out_ids, accept_len=accept_len)
    return out_ids, accept_len


def build_tree(
    parents: Tensor, max_leaves: int | None = None, max_depth: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Attention mask, depths and root-to-leaf paths of token trees.

    Args:
        parents: ``[B, T]``: ``parents[b, 0] == -1`` (node 0 is the root, the last committed
            token) and ``0 <= parents[b, i] < i`` for the other nodes.
        max_leaves, max_depth: size of ``paths`` (default T and T - 1, always enough). Smaller
            values cut: the first ``max_leaves`` leaves, the first ``max_depth + 1`` nodes of a
            path.

    Returns:
        ``(tree_mask [B, T, T] bool, depth [B, T], paths [B, max_leaves, max_depth + 1])``:
        ``tree_mask[b, i, j]`` is true when node j is node i or one of its ancestors; leaves are
        listed in node order, each path from the root, padded with -1 (rows of missing leaves
        are all -1).

    Example:
        >>> mask, depth, paths = build_tree(torch.tensor([[-1, 0, 0, 1]]))
        >>> depth.tolist(), paths.tolist()
        ([[0, 1, 1, 2]], [[[0, 2, -1, -1], [0, 1, 3, -1], [-1, -1, -1, -1], [-1, -1, -1, -1]]])
        >>> mask[0, 3].tolist()
        [True, True, False, True]
    """
    B, T = _size(parents, 0), _size(parents, 1)
    leaves = T if max_leaves is None else max_leaves
    width = T if max_depth is None else max_depth + 1
    tree_mask = torch.empty((B, T, T), dtype=torch.bool, device=parents.device)
    depth = parents.new_empty((B, T))
    paths = parents.new_empty((B, leaves, width))
    _ops.build_tree(parents, tree_mask=tree_mask, depth=depth, paths=paths)
    return tree_mask, depth, paths


def tree_verify_greedy(
    tree_tokens: Tensor, parents: Tensor, target: Tensor, max_accept: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy verification of a token tree per row.

    Accepts the longest root-to-node path whose every token equals the target's greedy token
    at its parent (the lowest node index wins among equally long paths).

    Args:
        tree_tokens: ``[B, T]`` token of every node (node 0, the root, is the last committed
            token and is not checked): in ``[0, V)`` with logits, ``>= 0`` with token ids, or
            -1 for a padding node, which is never accepted.
        parents: ``[B, T]`` the tree (see :func:`build_tree`).
        target: the target's greedy token after every node ``[B, T]`` (each ``>= 0``), or its
            logits ``[B, T, V]``.
        max_accept: most accepted nodes to return (default T - 1, always enough); a longer
            path is cut and its next node's token becomes ``next_token``.

    Returns:
        ``(accept_path [B, max_accept + 1], accept_len [B], next_token [B])``:
        ``accept_path[b, 0] == 0`` (the root), then the accepted nodes in order, then -1. A step
        emits ``tree_tokens[b, accept_path[b, 1:accept_len + 1]]`` followed by ``next_token``.

    Example:
        >>> tokens = torch.tensor([[0, 11, 12, 13]])        # root; 11 and 12 under it; 13 under 11
        >>> parents = torch.tensor([[-1, 0, 0, 1]])
        >>> target = torch.tensor([[11, 13, 40, 50]])       # the target's token after each node
        >>> path, n, nxt = tree_verify_greedy(tokens, parents, target)
        >>> path.tolist(), n.tolist(), nxt.tolist()
        ([[0, 1, 3, -1]], [2], [50])
    """
    B, T = _size(tree_tokens, 0), _size(tree_tokens, 1)
    width = T if max_accept is None else max_accept + 1
    accept_path = tree_tokens.new_empty((B, width))
    accept_len = tree_tokens.new_empty((B,))
    next_token = tree_tokens.new_empty((B,))
    _ops.tree_verify_greedy(
        tree_tokens,
        parents,
        target,
        accept_path=accept_path,
        accept_len=accept_len,
        next_token=next_token,
    )
    return accept_path, accept_len, next_token


def tree_speculative_sampling(
    tree_tokens: Tensor,
    parents: Tensor,
    target_probs: Tensor,
    uniform: Tensor,
    draft_probs: Tensor | None = None,
    typical: TypicalAcceptance | None = None,
    max_accept: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Lossless verification of a token tree per row (multi-branch speculative sampling).

    From the root, a node's children are tried in index order: child c with token x is
    accepted with probability ``min(1, p(x) / q_c(x))`` and the walk descends into it; on
    rejection ``p <- norm(max(0, p - q_c))``. When no child is accepted, the next token is drawn
    from what is left of ``p``. With deterministic drafts (``draft_probs=None``, q = one-hot) a
    rejected token is simply removed from ``p``. The emitted tokens are distributed exactly as
    sampling from the target.

    Args:
        tree_tokens, parents: ``[B, T]`` the tree (see :func:`tree_verify_greedy`).
        target_probs: ``[B, T, V]`` the target's distribution after every node (rows sum to 1).
        uniform: ``[B, T]`` float32 samples from U[0, 1): ``uniform[:, c]`` tests node c,
            ``uniform[:, 0]`` draws the sampled token.
        draft_probs: ``[B, T, V]``: ``draft_probs[:, c]`` is the distribution node c was drawn
            from given its earlier siblings (the draft's distribution when siblings are drawn
            with replacement; that distribution without the earlier siblings' tokens,
            renormalised, when drawn without). ``None``: deterministic drafts.
        typical: use Medusa's LOSSY typical acceptance instead (deterministic drafts only): the
            longest path whose tokens pass the typical test is accepted and the next token is
            drawn from the target at its end.
        max_accept: as in :func:`tree_verify_greedy`.

    Returns:
        ``(accept_path, accept_len, next_token)`` as in :func:`tree_verify_greedy`.

    Example:
        >>> tokens, parents = torch.tensor([[0, 1, 2]]), torch.tensor([[-1, 0, 0]])
        >>> p = torch.tensor([[[0.0, 0.0, 1.0], [0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]])
        >>> path, n, nxt = tree_speculative_sampling(tokens, parents, p, torch.full((1, 3), 0.5))
        >>> path.tolist(), n.tolist(), nxt.tolist()   # node 1 (token 1) has p = 0: node 2 wins
        ([[0, 2, -1]], [1], [0])
    """
    B, T = _size(tree_tokens, 0), _size(tree_tokens, 1)
    width = T if max_accept is None else max_accept + 1
    accept_path = tree_tokens.new_empty((B, width))
    accept_len = tree_tokens.new_empty((B,))
    next_token = tree_tokens.new_empty((B,))
    _ops.tree_speculative_sampling(
        tree_tokens,
        parents,
        target_probs,
        uniform,
        draft_probs,
        typical.posterior_threshold if typical else None,
        typical.posterior_alpha if typical else 0.3,
        accept_path=accept_path,
        accept_len=accept_len,
        next_token=next_token,
    )
    return accept_path, accept_len, next_token


# ---- n-gram drafting: prompt lookup and the lookahead n-gram pool ------------------------------
def ngram_match(
    context: Tensor,
    context_len: Tensor | None = None,
    min_n: int = 1,
    max_n: int = 3,
    k: int = 10,
    earliest: bool = False,
) -> tuple[Tensor, Tensor]:
    """Prompt lookup: draft tokens copied from the context where its suffix occurred before.

    For each row, with ``L = context_len[b]``: the longest ``n`` in ``[min_n, max_n]`` for which
    the suffix ``context[b, L-n:L]`` occurs earlier (starting before ``L - n``; the occurrence
    may overlap the suffix), and of its occurrences the most recent one (the latest start
    ``p``; with ``earliest=True`` the first one, the choice of HF's prompt lookup). The draft is
    its continuation ``context[b, p+n : min(p+n+k, L)]``.

    Args:
        context: ``[B, S]`` token ids (int64 or int32); positions from ``context_len`` on are
            not read.
        context_len: ``[B]`` valid length of each row, in ``[0, S]`` (default: S).
        min_n, max_n: the n-gram lengths tried, longest first (``1 <= min_n <= max_n``).
        k: most draft tokens per row (the size of ``draft``).

    Returns:
        ``(draft [B, k], draft_len [B])``: ``draft_len[b]`` tokens, then -1 (``draft_len`` 0
        when nothing matches).

    Example:
        >>> ctx = torch.tensor([[7, 1, 2, 3, 9, 1, 2, 4, 5, 1, 2]])
        >>> draft, n = ngram_match(ctx, min_n=1, max_n=3, k=3)   # suffix [1, 2]: latest at 5
        >>> draft.tolist(), n.tolist()
        ([[4, 5, 1]], [3])
        >>> ngram_match(ctx, min_n=1, max_n=3, k=3, earliest=True)[0].tolist()   # at 1
        [[3, 9, 1]]
    """
    if k < 1:
        raise ValueError(f"specdec.ngram_match: k must be >= 1, got {k}")
    B, S = _size(context, 0), _size(context, 1)
    if context_len is None:
        context_len = torch.full((B,), S, dtype=context.dtype, device=context.device)
    draft = context.new_empty((B, k))
    draft_len = context.new_empty((B,))
    _ops.ngram_match(context, context_len, min_n, max_n, earliest, draft=draft, draft_len=draft_len)
    return draft, draft_len


def ngram_pool_insert(head: Tensor, entries: Tensor, cursor: Tensor, ngrams: Tensor, g: int) -> None:
    """Inserts n-grams into the n-gram pools of B rows, in place (see :class:`specdec.NGramPool`).

    The pool of a row keeps, for each key token, at most ``g`` distinct continuations (the
    n-gram without its first token), the most recently written first. The n-grams of a row
    are written in order ``m = 0 .. M-1``; one that is already there is refreshed (it becomes
    the most recent) rather than stored twice; a new one past ``g`` evicts the key's oldest.
    The row's pool holds at most its last ``C`` writes: write number ``t`` goes to slot
    ``t % C`` and evicts what that slot held. N-grams containing -1 (padding) are skipped.

    Args:
        head: ``[B, V]`` slot of each key's most recent entry, -1 when none (updated in place).
        entries: ``[B, C, N + 1]``: per slot the n-gram (key -1: free slot), then the slot of
            the key's next older entry, -1 at the end (updated in place).
        cursor: ``[B]`` the slot of each row's next write (updated in place).
        ngrams: ``[B, M, N]`` n-grams to insert; each id in ``[0, V)`` or -1.
        g: most continuations per key (use one ``g`` per pool).

    Example:
        >>> head = torch.full((1, 10), -1); entries = torch.full((1, 8, 4), -1)
        >>> cursor = torch.zeros(1, dtype=torch.int64)
        >>> ngram_pool_insert(head, entries, cursor, torch.tensor([[[3, 4, 5], [3, 6, 7]]]), 2)
        >>> ngram_pool_lookup(head, entries, torch.tensor([3]), 2)[0].tolist()
        [[[6, 7], [4, 5]]]
    """
    _ops.ngram_pool_insert(head, entries, cursor, ngrams, g)


def ngram_pool_lookup(
    head: Tensor, entries: Tensor, last_ids: Tensor, g: int
) -> tuple[Tensor, Tensor]:
    """The continuations stored under ``last_ids[b]`` in each row's n-gram pool.

    Args:
        head, entries: the pool (see :func:`ngram_pool_insert`).
        last_ids: ``[B]`` key token of each row, in ``[0, V)``; -1 looks nothing up.
        g: most candidates returned per row.

    Returns:
        ``(candidates [B, g, N - 1], count [B])``: the ``count[b]`` continuations, most recent
        first, then rows of -1.

    Example:
        >>> head = torch.full((1, 10), -1); entries = torch.full((1, 8, 3), -1)
        >>> cursor = torch.zeros(1, dtype=torch.int64)
        >>> ngram_pool_insert(head, entries, cursor, torch.tensor([[[1, 2], [5, 6], [1, 3]]]), 4)
        >>> cand, n = ngram_pool_lookup(head, entries, torch.tensor([1]), 3)
        >>> cand.tolist(), n.tolist()
        ([[[3], [2], [-1]]], [2])
    """
    if g < 1:
        raise ValueError(f"specdec.ngram_pool_lookup: g must be >= 1, got {g}")
    B, N = _size(head, 0), _size(entries, 2) - 1
    candidates = head.new_empty((B, g, max(N - 1, 1)))
    count = head.new_empty((B,))
    _ops.ngram_pool_lookup(head, entries, last_ids, candidates=candidates, count=count)
    return candidates, count


# ---- tree attention and KV commit --------------------------------------------------------------
def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    prefix_len: Tensor,
    tree_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Attention of T new tokens per row over the row's cached prefix and their tree ancestors.

    Row ``b`` has ``prefix_len[b]`` committed positions (``0 .. prefix_len[b] - 1`` of the
    cache) and its T new tokens' keys/values at ``prefix_len[b] .. prefix_len[b] + T - 1``.
    New token ``i`` attends to every committed position and to the new tokens ``j`` with
    ``tree_mask[b, i, j]`` (its ancestors and itself); ``tree_mask=None`` means a chain (causal:
    ``j <= i``), as in a prefill. Grouped-query attention: the H query heads share the Hkv
    key/value heads in groups of ``H // Hkv``. A token that sees no position gets zeros.

    Args:
        q: ``[B, H, T, D]`` queries (float32, float16 or bfloat16; computed in float32).
        k_cache, v_cache: ``[B, Hkv, S, D]`` caches (q's dtype, last dimension contiguous).
        prefix_len: ``[B]`` committed lengths (int64 or int32), ``0 <= prefix_len <= S - T``.
        tree_mask: ``[B, T, T]`` bool (see :func:`build_tree`), or ``None`` for causal.
        scale: score scale, default ``1 / sqrt(D)``.

    Returns:
        ``[B, H, T, D]`` in q's dtype.

    Example:
        >>> q = torch.zeros(1, 1, 2, 4)                   # equal scores: a plain average
        >>> k = torch.zeros(1, 1, 4, 4)
        >>> v = torch.arange(4.0).view(1, 1, 4, 1).expand(1, 1, 4, 4).contiguous()
        >>> mask = torch.tensor([[[True, False], [False, True]]])   # two siblings
        >>> tree_attention(q, k, v, torch.tensor([1]), mask)[0, 0, :, 0].tolist()
        [0.5, 1.0]
    """
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _ops.tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, scale, out=out)
    return out


def kv_commit(
    k_caches: list[Tensor],
    v_caches: list[Tensor],
    lengths: Tensor,
    src_pos: Tensor,
    accept_len: Tensor,
) -> None:
    """Moves the accepted entries of every layer's KV cache into place, in place.

    For every layer and row ``b``: ``cache[b, :, lengths[b] + i] = cache[b, :, src_pos[b, i]]``
    for ``i < accept_len[b]``, copied in order of ``i`` (so overlapping sources and
    destinations are right whenever ``src_pos[b, i] >= lengths[b] + i``, as for the nodes of a
    tree path); then ``lengths[b] += accept_len[b]``. Rolling back is only lowering
    ``lengths``.

    Args:
        k_caches, v_caches: one ``[B, Hkv, S, D]`` contiguous tensor per layer (all of a list
            one shape; one dtype and device).
        lengths: ``[B]`` int64 or int32, contiguous: updated in place.
        src_pos: ``[B, A]`` absolute source positions (lengths' dtype); columns past
            ``accept_len[b]`` are ignored.
        accept_len: ``[B]`` number of entries to move per row, ``0 <= accept_len <= A``.

    Example:
        >>> k = torch.arange(6.0).view(1, 1, 6, 1).contiguous(); v = k.clone()
        >>> lengths = torch.tensor([2])
        >>> kv_commit([k], [v], lengths, torch.tensor([[3, 5]]), torch.tensor([2]))
        >>> k.flatten().tolist(), lengths.tolist()
        ([0.0, 1.0, 3.0, 5.0, 4.0, 5.0], [4])
    """
    _ops.kv_commit(k_caches, v_caches, lengths, src_pos, accept_len)


# ---- fake kernels ------------------------------------------------------------------------------
# The ops only write their out-arguments, so the fake kernels compute nothing; they make the
# checks of csrc/op_args.cpp that read no data, raising the same error types naming the same
# arguments, so that torch.compile reports a wrong shape, dtype or device while tracing. Sizes
# may be symbolic: every comparison goes to torch._check_* as it is, never through bool().

_INDEX_DTYPES = (torch.int64, torch.int32)


def _fail_unless(cond, op: str, message, error=torch._check_value) -> None:
    error(cond, lambda: f"specdec.{op}: {message() if callable(message) else message}")


def _shape_str(shape) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def _check_index(t: Tensor, op: str, name: str, dim: int) -> None:
    _fail_unless(t.dtype in _INDEX_DTYPES, op,
                 lambda: f"{name} must be int64 or int32, got {t.dtype}", torch._check_type)
    _fail_unless(t.dim() == dim, op,
                 lambda: f"{name} must have {dim} dimensions, got shape {list(t.shape)}")


def _check_index_like(t: Tensor, ref: Tensor, op: str, name: str, ref_name: str, shape) -> None:
    """An index tensor of ``shape`` with ``ref``'s dtype and device."""
    _check_index(t, op, name, len(shape))
    _check_shape(t, op, name, shape)
    _check_same_dtype(t, ref, op, name, ref_name)
    _check_device(t, ref, op, name)


def _check_probs(t: Tensor, op: str, name: str, dim: int) -> None:
    _fail_unless(t.is_floating_point(), op,
                 lambda: f"{name} must be a floating tensor (float32, float16, bfloat16), "
                 f"got {t.dtype}", torch._check_type)
    _fail_unless(t.dim() == dim, op,
                 lambda: f"{name} must have {dim} dimensions, got shape {list(t.shape)}")


def _check_shape(t: Tensor, op: str, name: str, shape, *, output: bool = False) -> None:
    """``shape``: a None entry matches any size (any size >= 1 for an output)."""
    label = f"output {name}" if output else name

    def message() -> str:
        return f"{label} must have shape {_shape_str(shape)}, got {list(t.shape)}"

    _fail_unless(t.dim() == len(shape), op, message)
    for size, want in zip(t.shape, shape):
        if want is not None:
            _fail_unless(size == want, op, message)
        elif output:
            _fail_unless(size >= 1, op, message)


def _check_same_dtype(t: Tensor, ref: Tensor, op: str, name: str, ref_name: str) -> None:
    _fail_unless(t.dtype == ref.dtype, op,
                 lambda: f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}",
                 torch._check_type)


def _check_device(t: Tensor, ref: Tensor, op: str, name: str) -> None:
    _fail_unless(t.device == ref.device, op,
                 lambda: f"{name} is on {t.device} but the other arguments are on {ref.device}")


def _check_uniform(t: Tensor, op: str, shape) -> None:
    _fail_unless(t.dtype == torch.float32, op,
                 lambda: f"uniform must be float32, got {t.dtype}", torch._check_type)
    _check_shape(t, op, "uniform", shape)


def _check_out(out: Tensor, ref: Tensor, op: str, name: str, shape, dtype: torch.dtype) -> None:
    _check_device(out, ref, op, name)
    _fail_unless(out.dtype == dtype, op,
                 lambda: f"output {name} must be {dtype}, got {out.dtype}", torch._check_type)
    _check_shape(out, op, name, shape, output=True)
    _fail_unless(out.is_contiguous(), op, f"output {name} must be contiguous")


def _check_target(target: Tensor, ids: Tensor, op: str, B, N) -> None:
    """A greedy op's target: token ids [B, N] (ids' dtype) or logits [B, N, V]."""
    _check_device(target, ids, op, "target")
    if target.is_floating_point():
        _check_shape(target, op, "target", (B, N, None))
        _fail_unless(target.shape[2] >= 1, op, "target logits have an empty vocabulary")
        return
    _check_index(target, op, "target", 2)
    _check_same_dtype(target, ids, op, "target", "the draft token ids")
    _check_shape(target, op, "target", (B, N))


def _check_tree_outputs(op, tree_tokens, parents, accept_path, accept_len, next_token):
    _check_index(tree_tokens, op, "tree_tokens", 2)
    B, T = tree_tokens.shape
    _fail_unless(T >= 1, op, "tree_tokens needs at least the root node")
    _check_index_like(parents, tree_tokens, op, "parents", "tree_tokens", (B, T))
    _check_out(accept_path, tree_tokens, op, "accept_path", (B, None), tree_tokens.dtype)
    _check_out(accept_len, tree_tokens, op, "accept_len", (B,), tree_tokens.dtype)
    _check_out(next_token, tree_tokens, op, "next_token", (B,), tree_tokens.dtype)
    return B, T


@torch.library.register_fake("specdec::chain_speculative_sampling")
def _(draft_probs, draft_ids, target_probs, uniform, *, out_ids, accept_len):
    op = "chain_speculative_sampling"
    _check_index(draft_ids, op, "draft_ids", 2)
    B, K = draft_ids.shape
    _check_probs(target_probs, op, "target_probs", 3)
    _check_shape(target_probs, op, "target_probs", (B, K + 1, None))
    V = target_probs.shape[2]
    _fail_unless(V >= 1, op, "target_probs has an empty vocabulary")
    _check_device(target_probs, draft_ids, op, "target_probs")
    if draft_probs is not None:
        _check_probs(draft_probs, op, "draft_probs", 3)
        _check_shape(draft_probs, op, "draft_probs", (B, K, V))
        _check_same_dtype(draft_probs, target_probs, op, "draft_probs", "target_probs")
        _check_device(draft_probs, draft_ids, op, "draft_probs")
    _check_uniform(uniform, op, (B, K + 1))
    _check_device(uniform, draft_ids, op, "uniform")
    _check_out(out_ids, draft_ids, op, "out_ids", (B, K + 1), draft_ids.dtype)
    _check_out(accept_len, draft_ids, op, "accept_len", (B,), draft_ids.dtype)


@torch.library.register_fake("specdec::chain_greedy_verify")
def _(draft_ids, target, *, out_ids, accept_len):
    op = "chain_greedy_verify"
    _check_index(draft_ids, op, "draft_ids", 2)
    B, K = draft_ids.shape
    _check_out(out_ids, draft_ids, op, "out_ids", (B, K + 1), draft_ids.dtype)
    _check_out(accept_len, draft_ids, op, "accept_len", (B,), draft_ids.dtype)
    _check_target(target, draft_ids, op, B, K + 1)


@torch.library.register_fake("specdec::build_tree")
def _(parents, *, tree_mask, depth, paths):
    op = "build_tree"
    _check_index(parents, op, "parents", 2)
    B, T = parents.shape
    _fail_unless(T >= 1, op, "parents needs at least the root node")
    _check_out(tree_mask, parents, op, "tree_mask", (B, T, T), torch.bool)
    _check_out(depth, parents, op, "depth", (B, T), parents.dtype)
    _check_out(paths, parents, op, "paths", (B, None, None), parents.dtype)


@torch.library.register_fake("specdec::tree_verify_greedy")
def _(tree_tokens, parents, target, *, accept_path, accept_len, next_token):
    op = "tree_verify_greedy"
    B, T = _check_tree_outputs(op, tree_tokens, parents, accept_path, accept_len, next_token)
    _check_target(target, tree_tokens, op, B, T)


@torch.library.register_fake("specdec::tree_speculative_sampling")
def _(
    tree_tokens,
    parents,
    target_probs,
    uniform,
    draft_probs=None,
    posterior_threshold=None,
    posterior_alpha=0.3,
    *,
    accept_path,
    accept_len,
    next_token,
):
    op = "tree_speculative_sampling"
    B, T = _check_tree_outputs(op, tree_tokens, parents, accept_path, accept_len, next_token)
    _check_probs(target_probs, op, "target_probs", 3)
    _check_shape(target_probs, op, "target_probs", (B, T, None))
    V = target_probs.shape[2]
    _fail_unless(V >= 1, op, "target_probs has an empty vocabulary")
    _check_device(target_probs, tree_tokens, op, "target_probs")
    _check_uniform(uniform, op, (B, T))
    _check_device(uniform, tree_tokens, op, "uniform")
    if draft_probs is not None:
        _fail_unless(posterior_threshold is None, op,
                     "typical acceptance (posterior_threshold) takes no draft_probs")
        _check_probs(draft_probs, op, "draft_probs", 3)
        _check_shape(draft_probs, op, "draft_probs", (B, T, V))
        _check_same_dtype(draft_probs, target_probs, op, "draft_probs", "target_probs")
        _check_device(draft_probs, tree_tokens, op, "draft_probs")
    if posterior_threshold is not None:
        _fail_unless(0.0 <= posterior_threshold <= 1.0, op,
                     f"posterior_threshold must be in [0, 1], got {posterior_threshold}")
        _fail_unless(posterior_alpha >= 0.0, op,
                     f"posterior_alpha must be >= 0, got {posterior_alpha}")


@torch.library.register_fake("specdec::ngram_match")
def _(context, context_len, min_n, max_n, earliest=False, *, draft, draft_len):
    op = "ngram_match"
    _check_index(context, op, "context", 2)
    B = context.shape[0]
    _check_index_like(context_len, context, op, "context_len", "context", (B,))
    _fail_unless(min_n >= 1, op, f"min_n must be >= 1, got {min_n}")
    _fail_unless(max_n >= min_n, op, f"max_n ({max_n}) must be >= min_n ({min_n})")
    _check_out(draft, context, op, "draft", (B, None), context.dtype)
    _check_out(draft_len, context, op, "draft_len", (B,), context.dtype)


def _check_pool_tables(op: str, head: Tensor, entries: Tensor):
    _check_index(head, op, "head", 2)
    B, V = head.shape
    _fail_unless(V >= 1, op, "head must have one entry per token (V >= 1)")
    _check_index_like(entries, head, op, "entries", "head", (B, None, None))
    C, N = entries.shape[1], entries.shape[2] - 1

    def message() -> str:
        return ("entries must have shape [B, C, N + 1] with C >= 1 slots and n-grams of N >= 2 "
                f"tokens, got {list(entries.shape)}")

    _fail_unless(C >= 1, op, message)
    _fail_unless(N >= 2, op, message)
    for t in (head, entries):
        _fail_unless(t.is_contiguous(), op, "head and entries must be contiguous")
    return B, N


@torch.library.register_fake("specdec::ngram_pool_insert")
def _(head, entries, cursor, ngrams, g):
    op = "ngram_pool_insert"
    B, N = _check_pool_tables(op, head, entries)
    _check_index_like(cursor, head, op, "cursor", "head", (B,))
    _fail_unless(cursor.is_contiguous(), op, "cursor must be contiguous")
    _check_index_like(ngrams, head, op, "ngrams", "head", (B, None, N))
    _fail_unless(g >= 1, op, f"g must be >= 1, got {g}")


@torch.library.register_fake("specdec::ngram_pool_lookup")
def _(head, entries, last_ids, *, candidates, count):
    op = "ngram_pool_lookup"
    B, N = _check_pool_tables(op, head, entries)
    _check_index_like(last_ids, head, op, "last_ids", "head", (B,))
    _check_out(candidates, head, op, "candidates", (B, None, N - 1), head.dtype)
    _check_out(count, head, op, "count", (B,), head.dtype)


@torch.library.register_fake("specdec::tree_attention")
def _(q, k_cache, v_cache, prefix_len, tree_mask=None, scale=None, *, out):
    op = "tree_attention"
    _check_probs(q, op, "q", 4)
    B, H, T, D = q.shape
    for size in (H, T, D):
        _fail_unless(size >= 1, op, f"q must have H, T and D >= 1, got shape {list(q.shape)}")
    for t, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        _check_probs(t, op, name, 4)
        _check_same_dtype(t, q, op, name, "q")
        _check_device(t, q, op, name)
        _fail_unless(t.stride(3) == 1, op,
                     f"{name} must be contiguous in its last (head) dimension")
    _check_shape(k_cache, op, "k_cache", (B, None, None, D))
    Hkv, S = k_cache.shape[1], k_cache.shape[2]

    def heads() -> str:
        return f"the {H} query heads of q must be a multiple of the {Hkv} heads of k_cache"

    _fail_unless(Hkv >= 1, op, heads)  # first: H % 0 would raise ZeroDivisionError
    _fail_unless(H % Hkv == 0, op, heads)
    _fail_unless(S >= T, op,
                 lambda: f"k_cache holds {S} positions, fewer than the {T} tokens of q")
    _check_shape(v_cache, op, "v_cache", (B, Hkv, S, D))
    _check_index(prefix_len, op, "prefix_len", 1)
    _check_shape(prefix_len, op, "prefix_len", (B,))
    _check_device(prefix_len, q, op, "prefix_len")
    if tree_mask is not None:
        _fail_unless(tree_mask.dtype == torch.bool, op,
                     lambda: f"tree_mask must be bool, got {tree_mask.dtype}", torch._check_type)
        _check_shape(tree_mask, op, "tree_mask", (B, T, T))
        _check_device(tree_mask, q, op, "tree_mask")
    _check_out(out, q, op, "out", (B, H, T, D), q.dtype)


@torch.library.register_fake("specdec::kv_commit")
def _(k_caches, v_caches, lengths, src_pos, accept_len):
    op = "kv_commit"
    _fail_unless(len(k_caches) >= 1, op, "k_caches is empty")
    _fail_unless(len(v_caches) == len(k_caches), op,
                 f"k_caches has {len(k_caches)} layers but v_caches has {len(v_caches)}")
    k0, v0 = k_caches[0], v_caches[0]
    _check_probs(k0, op, "k_caches", 4)
    B, S = k0.shape[0], k0.shape[2]
    _check_probs(v0, op, "v_caches", 4)
    _check_shape(v0, op, "v_caches", (B, None, S, None))
    for caches, ref, name in ((k_caches, k0, "k_caches"), (v_caches, v0, "v_caches")):
        for c in caches:
            _check_same_dtype(c, k0, op, name, "k_caches[0]")
            _check_device(c, k0, op, name)
            _check_shape(c, op, name, tuple(ref.shape))
            _fail_unless(c.is_contiguous(), op, f"every tensor of {name} must be contiguous")
    _check_index(lengths, op, "lengths", 1)
    _check_shape(lengths, op, "lengths", (B,))
    _check_device(lengths, k0, op, "lengths")
    _fail_unless(lengths.is_contiguous(), op, "lengths must be contiguous")
    _check_index(src_pos, op, "src_pos", 2)
    _check_shape(src_pos, op, "src_pos", (B, None))
    _check_same_dtype(src_pos, lengths, op, "src_pos", "lengths")
    _check_device(src_pos, k0, op, "src_pos")
    _check_index(accept_len, op, "accept_len", 1)
    _check_shape(accept_len, op, "accept_len", (B,))
    _check_same_dtype(accept_len, lengths, op, "accept_len", "lengths")
    _check_device(accept_len, k0, op, "accept_len")
