"""Plain-PyTorch reference of every op: the oracle of the tests and the baseline of the benchmarks.

Written for clarity, one row at a time, with the same conventions as the compiled ops (see
docs/ops.md): the acceptance tests use the same float32 arithmetic, and draws take the smallest
index whose cumulative weight (float64) exceeds ``u * total``. This module imports nothing of
specdec's.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sample_from_weights(weights: Tensor, u: float) -> int:
    """Smallest j with cumsum(w)[j] > u * sum(w) and w[j] > 0 (the last positive j if rounding
    leaves none); -1 when all weights are zero. Negative and NaN weights count as zero. Sums run
    in float64 in index order and the total is rounded to float32, as in the CPU kernel."""
    w = torch.nan_to_num(weights.float(), nan=0.0).clamp_min(0.0).double()
    positive = torch.nonzero(w > 0).flatten()
    if positive.numel() == 0:
        return -1
    cdf = torch.cumsum(w, 0)
    total = _float32(float(cdf[-1]))
    if not total > 0:
        return -1
    j = int(torch.searchsorted(cdf, u * total, right=True))
    return j if j < w.numel() else int(positive[-1])


def sample_without(weights: Tensor, x: int, u: float) -> int:
    """A draw from ``weights`` with index x's weight set to zero (x outside the row: nothing
    excluded); -1 when no weight is left."""
    w = weights.float().clone()
    if 0 <= x < w.numel():
        w[x] = 0.0
    return sample_from_weights(w, u)


def _float32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def _mass(w: Tensor) -> Tensor:
    """float32 total of w summed in float64 in index order (the CPU kernel's sum)."""
    return torch.tensor(_float32(float(torch.cumsum(w.double(), 0)[-1])), dtype=torch.float32)


def _chain_row(accepted: list[int], token: int, width: int) -> list[int]:
    return (accepted + [token] + [-1] * width)[:width]


def chain_speculative_sampling(
    draft_probs: Tensor | None, draft_ids: Tensor, target_probs: Tensor, uniform: Tensor
) -> tuple[Tensor, Tensor]:
    B, K = draft_ids.shape
    V = target_probs.shape[-1]
    p_all, u_all = target_probs.float(), uniform.float()
    q_all = None if draft_probs is None else draft_probs.float()
    out, lens = [], []
    for b in range(B):
        i = 0
        while i < K:
            x = int(draft_ids[b, i])
            if not 0 <= x < V:
                break
            q = q_all[b, i, x] if q_all is not None else torch.tensor(1.0)
            if not bool(u_all[b, i] * q < p_all[b, i, x]):
                break
            i += 1
        u = float(u_all[b, K])
        token = -1
        if i < K and q_all is not None:
            token = sample_from_weights(p_all[b, i] - q_all[b, i], u)
        elif i < K:
            token = sample_without(p_all[b, i], int(draft_ids[b, i]), u)
        if token < 0:
            token = sample_from_weights(p_all[b, i], u)
        out.append(_chain_row([int(t) for t in draft_ids[b, :i]], token, K + 1))
        lens.append(i)
    return _as_index(out, draft_ids), _as_index(lens, draft_ids)


def chain_greedy_verify(draft_ids: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    target_ids = target.argmax(-1) if target.is_floating_point() else target
    B, K = draft_ids.shape
    out, lens = [], []
    for b in range(B):
        i = 0
        while i < K and int(draft_ids[b, i]) == int(target_ids[b, i]):
            i += 1
        out.append(_chain_row([int(t) for t in draft_ids[b, :i]], int(target_ids[b, i]), K + 1))
        lens.append(i)
    return _as_index(out, draft_ids), _as_index(lens, draft_ids)


def _depths(parents: list[int]) -> list[int]:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


def _path(parents: list[int], node: int) -> list[int]:
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


def build_tree(
    parents: Tensor, max_leaves: int | None = None, max_depth: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    B, T = parents.shape
    L = T if max_leaves is None else max_leaves
    P = T if max_depth is None else max_depth + 1
    mask = torch.zeros(B, T, T, dtype=torch.bool)
    depth = torch.zeros(B, T, dtype=torch.int64)
    paths = torch.full((B, L, P), -1, dtype=torch.int64)
    for b in range(B):
        par = [int(p) for p in parents[b]]
        depth[b] = torch.tensor(_depths(par))
        for i in range(T):
            mask[b, i, _path(par, i)] = True
        leaves = [i for i in range(T) if i not in par[1:]]
        for slot, leaf in enumerate(leaves[:L]):
            path = _path(par, leaf)[:P]
            paths[b, slot, : len(path)] = torch.tensor(path)
    return mask, depth.to(parents.dtype), paths.to(parents.dtype)


def _accepted_path(parents: list[int], width: int, edge_ok) -> tuple[list[int], int, int]:
    """Deepest node whose every edge passes edge_ok (lowest index among ties): returns
    (path from the root cut to `width` nodes, accepted count, first node cut off or -1)."""
    T = len(parents)
    ok = [True] + [False] * (T - 1)
    for c in range(1, T):
        ok[c] = ok[parents[c]] and edge_ok(parents[c], c)
    depth = _depths(parents)
    best = max((c for c in range(T) if ok[c]), key=lambda c: (depth[c], -c))
    path = _path(parents, best)
    kept = min(depth[best], width - 1)
    cut = path[kept + 1] if kept < depth[best] else -1
    return path[: kept + 1], kept, cut


def _tree_outputs(rows, like: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    paths = [(path + [-1] * width)[:width] for path, _, _ in rows]
    return (
        _as_index(paths, like),
        _as_index([n for _, n, _ in rows], like),
        _as_index([t for _, _, t in rows], like),
    )


def tree_verify_greedy(
    tree_tokens: Tensor, parents: Tensor, target: Tensor, max_accept: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    target_ids = target.argmax(-1) if target.is_floating_point() else target
    B, T = tree_tokens.shape
    width = T if max_accept is None else max_accept + 1
    rows = []
    for b in range(B):
        par = [int(p) for p in parents[b]]
        tok = [int(t) for t in tree_tokens[b]]
        tgt = [int(t) for t in target_ids[b]]
        path, n, cut = _accepted_path(par, width, lambda a, c: tok[c] == tgt[a])
        rows.append((path, n, tok[cut] if cut >= 0 else tgt[path[-1]]))
    return _tree_outputs(rows, tree_tokens, width)


def tree_speculative_sampling(
    tree_tokens: Tensor,
    parents: Tensor,
    target_probs: Tensor,
    uniform: Tensor,
    draft_probs: Tensor | None = None,
    typical: tuple[float, float] | None = None,
    max_accept: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``typical`` is (posterior_threshold, posterior_alpha) for Medusa's lossy mode."""
    B, T = tree_tokens.shape
    V = target_probs.shape[-1]
    width = T if max_accept is None else max_accept + 1
    p_all, u_all = target_probs.float(), uniform.float()
    q_all = None if draft_probs is None else draft_probs.float()
    rows = []
    for b in range(B):
        par = [int(p) for p in parents[b]]
        tok = [int(t) for t in tree_tokens[b]]
        u = u_all[b]
        if typical is not None:
            threshold, alpha = typical
            entropy = torch.special.entr(p_all[b]).sum(-1)

            def passes(a: int, c: int) -> bool:
                if not 0 <= tok[c] < V:
                    return False
                floor = min(threshold, alpha * float(torch.exp(-entropy[a])))
                return float(p_all[b, a, tok[c]]) > floor

            path, n, cut = _accepted_path(par, width, passes)
            nxt = tok[cut] if cut >= 0 else sample_from_weights(p_all[b, path[-1]], float(u[0]))
            rows.append((path, n, nxt))
            continue
        node, path, token = 0, [0], -1
        while True:
            p = p_all[b, node].clamp_min(0.0)
            resid, mass, rejected, chosen = p.clone(), torch.tensor(1.0), 0.0, -1
            children = [c for c in range(node + 1, T) if par[c] == node and 0 <= tok[c] < V]
            for c in children:
                x = tok[c]
                if q_all is not None:
                    q = q_all[b, c]
                    if bool(u[c] * q[x] * mass < resid[x]):
                        chosen = c
                        break
                    resid = (resid - mass * q).clamp_min(0.0)
                    mass = _mass(resid)
                else:
                    px = resid[x]
                    if bool(u[c] * mass < px):
                        chosen = c
                        break
                    # m = 1 - p(rejected tokens): the rows are taken as normalised.
                    rejected += float(px)
                    mass = torch.tensor(1.0 - rejected, dtype=torch.float32)
                    resid[x] = 0.0
            if chosen >= 0 and len(path) < width:
                path.append(chosen)
                node = chosen
                continue
            if chosen >= 0:
                token = tok[chosen]
            else:
                token = sample_from_weights(resid, float(u[0]))
                if token < 0:
                    token = sample_from_weights(p, float(u[0]))
            break
        rows.append((path, len(path) - 1, token))
    return _tree_outputs(rows, tree_tokens, width)


def _as_index(values, like: Tensor) -> Tensor:
    return torch.tensor(values, dtype=like.dtype)


# ---- n-gram ops: prompt lookup and the lookahead n-gram pool ----------------------------------


def ngram_match(
    context: Tensor,
    context_len: Tensor | None = None,
    min_n: int = 1,
    max_n: int = 3,
    k: int = 10,
    earliest: bool = False,
) -> tuple[Tensor, Tensor]:
    """Brute force: for n from max_n down to min_n, the latest (or earliest) start p < L - n
    with context[p:p+n] == context[L-n:L]; the draft is context[p+n : min(p+n+k, L)]."""
    B, S = context.shape
    lens = [S] * B if context_len is None else [int(x) for x in context_len]
    drafts, draft_lens = [], []
    for b in range(B):
        L = lens[b]
        ctx = [int(t) for t in context[b, :L]]
        draft: list[int] = []
        for n in range(min(max_n, L - 1), min_n - 1, -1):
            suffix = ctx[L - n :]
            starts = range(L - n) if earliest else range(L - n - 1, -1, -1)
            p = next((p for p in starts if ctx[p : p + n] == suffix), None)
            if p is not None:
                draft = ctx[p + n : p + n + k]
                break
        drafts.append(draft + [-1] * (k - len(draft)))
        draft_lens.append(len(draft))
    return _as_index(drafts, context).reshape(B, k), _as_index(draft_lens, context)


def ngram_pool_insert(head: Tensor, entries: Tensor, cursor: Tensor, ngrams: Tensor, g: int) -> None:
    """In place, as a function of what each row has written: every n-gram without -1 is one
    write, the row's t-th write since its reset goes to slot t % C, and per key the row keeps
    its g most recently written distinct continuations among its last C writes. Free slots
    have key -1; their other columns are left as they are."""
    C, N = entries.shape[1], entries.shape[2] - 1
    for b in range(head.shape[0]):
        cur = int(cursor[b])
        writes = [gram for gram in ngrams[b].tolist() if -1 not in gram]
        # (age in writes, slot, n-gram) of what the row held and of the new writes.
        events = [(len(writes) - 1 - t, (cur + t) % C, gram) for t, gram in enumerate(writes)]
        for s in torch.nonzero(entries[b, :, 0] >= 0).flatten().tolist():
            events.append(((cur - 1 - s) % C + len(writes), s, entries[b, s, :N].tolist()))
        lists: dict[int, list[tuple[int, list[int]]]] = {}
        for age, s, gram in sorted(events):
            if age >= C:
                break
            kept = lists.setdefault(gram[0], [])
            if len(kept) < g and all(gram[1:] != other[1:] for _, other in kept):
                kept.append((s, gram))
        head[b] = -1
        entries[b, :, 0] = -1
        for key, kept in lists.items():
            head[b, key] = kept[0][0]
            for i, (s, gram) in enumerate(kept):
                nxt = kept[i + 1][0] if i + 1 < len(kept) else -1
                entries[b, s] = torch.tensor(gram + [nxt], dtype=entries.dtype)
        cursor[b] = (cur + len(writes)) % C


def ngram_pool_lookup(
    head: Tensor, entries: Tensor, last_ids: Tensor, g: int
) -> tuple[Tensor, Tensor]:
    """The continuations of last_ids[b] in row b, most recent first (the key's list from head)."""
    B, N = head.shape[0], entries.shape[2] - 1
    candidates = torch.full((B, g, N - 1), -1, dtype=head.dtype)
    count = []
    for b in range(B):
        key, found = int(last_ids[b]), 0
        s = int(head[b, key]) if key >= 0 else -1
        while s >= 0 and found < g:
            candidates[b, found] = entries[b, s, 1:N]
            found += 1
            s = int(entries[b, s, N])
        count.append(found)
    return candidates, _as_index(count, head)


# --- tree attention and KV commit -----------------------------------------------------------------
def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    prefix_len: Tensor,
    tree_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """scaled_dot_product_attention (float32) with the explicit mask: prefix, then the tree."""
    B, H, T, D = q.shape
    group = H // k_cache.shape[1]
    if tree_mask is None:
        tree_mask = torch.ones(B, T, T, dtype=torch.bool, device=q.device).tril()
    out = torch.empty(B, H, T, D, dtype=torch.float32, device=q.device)
    for b in range(B):
        p = int(prefix_len[b])
        mask = torch.zeros(T, p + T, dtype=torch.bool, device=q.device)
        mask[:, :p] = True
        mask[:, p:] = tree_mask[b]
        k = k_cache[b, :, : p + T].float().repeat_interleave(group, 0)
        v = v_cache[b, :, : p + T].float().repeat_interleave(group, 0)
        scores = q[b].float() @ k.transpose(-1, -2) * (D**-0.5 if scale is None else scale)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, -1).nan_to_num(0.0)  # a query seeing nothing: zeros
        out[b] = weights @ v
    return out.to(q.dtype)


def kv_commit(
    k_caches: list[Tensor],
    v_caches: list[Tensor],
    lengths: Tensor,
    src_pos: Tensor,
    accept_len: Tensor,
) -> None:
    """In place, one entry at a time in order (the semantics of the op, overlaps included)."""
    for cache in [*k_caches, *v_caches]:
        for b in range(lengths.shape[0]):
            start = int(lengths[b])
            for i in range(int(accept_len[b])):
                cache[b, :, start + i] = cache[b, :, int(src_pos[b, i])]
    lengths += accept_len
