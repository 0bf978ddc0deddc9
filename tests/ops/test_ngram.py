"""ngram_match (prompt lookup) and the n-gram pool (lookahead) against brute-force references."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.ops import assert_all_raise, assert_fakes_match_kernels

import specdec
import specdec.ops.reference as ref
from specdec import ops

INDEX_DTYPES = [torch.int64, torch.int32]
T_OPS = torch.ops.specdec
# The `device` fixture is function-scoped; hypothesis runs every example in the same call.
HYPOTHESIS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---- ngram_match ------------------------------------------------------------------------------


def match(device, rows, lens=None, min_n=1, max_n=3, k=4, dtype=torch.int64, earliest=False):
    """ngram_match on `rows` (lists padded to one length with 0) -> (drafts, lens) as lists."""
    S = max(len(r) for r in rows)
    context = torch.tensor([r + [0] * (S - len(r)) for r in rows], dtype=dtype, device=device)
    lens = torch.tensor([len(r) for r in rows] if lens is None else lens, dtype=dtype, device=device)
    draft, n = ops.ngram_match(context, lens, min_n, max_n, k, earliest)
    return draft.tolist(), n.tolist()


def test_match_by_hand(device):
    cases = [
        # (context, min_n, max_n, k) -> (draft, draft_len)
        (([1, 2, 3, 4], 1, 3, 3), ([-1, -1, -1], 0)),            # no earlier occurrence
        (([5, 6, 7, 8, 5], 1, 3, 3), ([6, 7, 8], 3)),            # match at the very start
        (([9, 1, 4, 9, 2, 5, 9], 1, 1, 2), ([2, 5], 2)),         # several: the latest wins
        (([1, 2, 7, 8, 2, 5, 1, 2], 1, 2, 2), ([7, 8], 2)),      # [1 2] beats a later [2]
        (([1, 2, 7, 8, 2, 5, 1, 2], 1, 1, 2), ([5, 1], 2)),      # max_n 1: the later [2]
        (([1, 2, 7, 8, 2, 5, 1, 2], 3, 4, 2), ([-1, -1], 0)),    # min_n 3: nothing that long
        (([3, 4, 0, 3, 4], 1, 2, 6), ([0, 3, 4, -1, -1, -1], 3)),  # k past the context: cut at L
        (([4, 4, 4, 4], 1, 3, 3), ([4, -1, -1], 1)),             # latest [4 4 4] starts at 0
        (([4, 4, 4, 4], 1, 2, 3), ([4, -1, -1], 1)),             # overlap: [4 4] at 1, one token
        (([2, 2], 1, 5, 2), ([2, -1], 1)),
        (([7], 1, 1, 2), ([-1, -1], 0)),                         # one token: nothing earlier
        (([], 1, 1, 2), ([-1, -1], 0)),
    ]
    for (ctx, min_n, max_n, k), (want_draft, want_n) in cases:
        rows = [ctx] if ctx else [[0]]
        got = match(device, rows, [len(ctx)], min_n, max_n, k)
        assert got == ([want_draft], [want_n]), (ctx, min_n, max_n, k)
        want = ref.ngram_match(torch.tensor(rows), torch.tensor([len(ctx)]), min_n, max_n, k)
        assert want[0].tolist() == [want_draft]


def test_match_earliest_by_hand(device):
    cases = [
        # (context, min_n, max_n, k) -> (draft, draft_len), the EARLIEST occurrence winning
        (([9, 1, 4, 9, 2, 5, 9], 1, 1, 2), ([1, 4], 2)),         # several: the first wins
        (([1, 2, 7, 8, 2, 5, 1, 2], 1, 1, 2), ([7, 8], 2)),      # max_n 1: the first [2]
        (([1, 2, 7, 8, 2, 5, 1, 2], 1, 2, 2), ([7, 8], 2)),      # the longest n still first
        (([4, 4, 4, 4], 1, 2, 3), ([4, 4, -1], 2)),              # [4 4] first at 0
        (([1, 2, 3, 4], 1, 3, 3), ([-1, -1, -1], 0)),
    ]
    for (ctx, min_n, max_n, k), (want_draft, want_n) in cases:
        got = match(device, [ctx], [len(ctx)], min_n, max_n, k, earliest=True)
        assert got == ([want_draft], [want_n]), (ctx, min_n, max_n, k)
        want = ref.ngram_match(torch.tensor([ctx]), torch.tensor([len(ctx)]), min_n, max_n, k, True)
        assert want[0].tolist() == [want_draft]


def test_match_ignores_tokens_past_context_len(device):
    # Row 0 would match [3] at 2 within the full row; with length 3 its suffix is [3] with no
    # earlier occurrence. Row 1 (length 5) continues its [1 2] match up to its own length only.
    rows = [[1, 2, 3, 1, 3, 9], [1, 2, 8, 1, 2, 1]]
    assert match(device, rows, [3, 5], 1, 2, 4) == ([[-1] * 4, [8, 1, 2, -1]], [0, 3])


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@HYPOTHESIS
@given(data=st.data())
def test_match_matches_reference(device, dtype, data):
    B = data.draw(st.integers(1, 4))
    S = data.draw(st.integers(0, 40))
    # A small alphabet makes repetitive rows (many and long matches), a large one random rows.
    alphabet = data.draw(st.sampled_from([2, 3, 5, 50, 2**20]))
    rows = [data.draw(st.lists(st.integers(0, alphabet - 1), min_size=S, max_size=S)) for _ in range(B)]
    lens = [data.draw(st.integers(0, S)) for _ in range(B)]
    min_n = data.draw(st.integers(1, 4))
    max_n = data.draw(st.integers(min_n, 6))
    k = data.draw(st.integers(1, 8))
    earliest = data.draw(st.booleans())
    context = torch.tensor(rows, dtype=dtype).reshape(B, S)
    want = ref.ngram_match(context, torch.tensor(lens, dtype=dtype), min_n, max_n, k, earliest)
    got = ops.ngram_match(context.to(device), torch.tensor(lens, dtype=dtype, device=device), min_n,
                          max_n, k, earliest)
    for g, w in zip(got, want):
        assert g.dtype == dtype and torch.equal(g.cpu(), w)


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
def test_match_long_contexts_match_reference(device, dtype):
    # Prompt-lookup sizes: 4096 tokens, code-like repetition (copied spans) in random text.
    gen = torch.Generator().manual_seed(3)
    B, S = 16, 4096
    context = torch.randint(0, 32000, (B, S), generator=gen)
    for b in range(B):
        for _ in range(b % 4 * 8):
            src, dst, n = (int(x) for x in torch.randint(0, S - 64, (3,), generator=gen))
            context[b, dst : dst + n % 64] = context[b, src : src + n % 64].clone()
    context = context.to(dtype)
    lens = torch.randint(S // 2, S + 1, (B,), generator=gen, dtype=dtype)
    for earliest in (False, True):
        want = ref.ngram_match(context, lens, 2, 5, 10, earliest)
        got = ops.ngram_match(context.to(device), lens.to(device), 2, 5, 10, earliest)
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


def test_match_default_length_is_the_whole_row(device):
    context = torch.tensor([[1, 2, 3, 1, 2]], device=device)
    draft, n = ops.ngram_match(context, min_n=2, max_n=2, k=2)
    assert draft.tolist() == [[3, 1]] and n.tolist() == [2]


# ---- the n-gram pool --------------------------------------------------------------------------


def new_pool(B, V, N, C, device, dtype=torch.int64):
    """(head, entries, cursor) of an empty pool."""
    return (
        torch.full((B, V), -1, dtype=dtype, device=device),
        torch.full((B, C, N + 1), -1, dtype=dtype, device=device),
        torch.zeros(B, dtype=dtype, device=device),
    )


def pool_state(head, entries, cursor):
    """The state with the don't-care columns of free slots (only their key -1 is specified) at -1."""
    free = entries[..., :1] < 0
    return head.cpu(), entries.masked_fill(free, -1).cpu(), cursor.cpu()


def keys_of(pool, key, g):
    """Lookup of one key in every row -> per row the list of continuations."""
    head, entries = pool[0], pool[1]
    ids = torch.full((head.shape[0],), key, dtype=head.dtype, device=head.device)
    cand, count = ops.ngram_pool_lookup(head, entries, ids, g)
    return [cand[b, : int(count[b])].tolist() for b in range(head.shape[0])]


def insert(pool, grams, g):
    head, entries, cursor = pool
    ops.ngram_pool_insert(head, entries, cursor, torch.tensor(grams, dtype=head.dtype, device=head.device), g)


def test_pool_by_hand(device):
    pool = new_pool(1, 10, 3, 16, device)
    insert(pool, [[[1, 2, 3], [1, 4, 5], [2, 7, 7], [1, 6, 6]]], g=3)
    assert keys_of(pool, 1, 3) == [[[6, 6], [4, 5], [2, 3]]]        # most recent first
    insert(pool, [[[1, 8, 8]]], g=3)
    assert keys_of(pool, 1, 3) == [[[8, 8], [6, 6], [4, 5]]]        # at G the oldest leaves
    insert(pool, [[[1, 4, 5]]], g=3)
    assert keys_of(pool, 1, 3) == [[[4, 5], [8, 8], [6, 6]]]        # a duplicate is refreshed
    insert(pool, [[[1, -1, 9], [-1, 3, 3], [1, 9, 9]]], g=3)
    assert keys_of(pool, 1, 3) == [[[9, 9], [4, 5], [8, 8]]]        # n-grams with -1 skipped
    assert keys_of(pool, 2, 3) == [[[7, 7]]]
    assert keys_of(pool, 1, 2) == [[[9, 9], [4, 5]]]                # lookup g below the count
    assert keys_of(pool, 0, 3) == [[]]
    assert keys_of(pool, -1, 3) == [[]]                             # -1: no lookup
    cand, count = ops.ngram_pool_lookup(pool[0], pool[1], torch.tensor([1], device=device), 4)
    assert cand[0, 3].tolist() == [-1, -1] and count.tolist() == [3]


def test_pool_ring_forgets_writes_older_than_capacity(device):
    pool = new_pool(1, 10, 2, 3, device)
    lists = lambda: [keys_of(pool, k, 4)[0] for k in (1, 3, 5)]  # noqa: E731
    insert(pool, [[[1, 2], [3, 4], [5, 6]]], g=4)
    assert lists() == [[[2]], [[4]], [[6]]]
    insert(pool, [[[3, 7]]], g=4)     # the 4th write reuses the 1st one's slot
    assert lists() == [[], [[7], [4]], [[6]]]
    insert(pool, [[[3, 4]]], g=4)     # a refresh is a write (to the next slot)
    assert lists() == [[], [[4], [7]], [[6]]]
    insert(pool, [[[1, 9]]], g=4)     # [5 6] was written 3 writes ago: it leaves
    assert lists() == [[[9]], [[4], [7]], []]
    assert pool[2].tolist() == [0]


def test_pool_rows_are_independent(device):
    pool = new_pool(2, 6, 2, 4, device)
    insert(pool, [[[1, 2], [1, 3]], [[1, 4], [-1, -1]]], g=2)
    assert keys_of(pool, 1, 2) == [[[3], [2]], [[4]]]
    assert pool[2].tolist() == [2, 1]


def random_grams(data, B, M, N, alphabet):
    """[B, M, N] n-grams over a few tokens (many repeats), some with -1 padding."""
    token = st.integers(0, alphabet - 1)
    if data.draw(st.booleans()):
        token = token | st.just(-1)
    flat = data.draw(st.lists(token, min_size=B * M * N, max_size=B * M * N))
    return torch.tensor(flat, dtype=torch.int64).reshape(B, M, N)


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@HYPOTHESIS
@given(data=st.data())
def test_pool_matches_reference(device, dtype, data):
    B = data.draw(st.integers(1, 3))
    V = data.draw(st.integers(1, 6))
    N = data.draw(st.integers(2, 4))
    g = data.draw(st.integers(1, 4))
    C = data.draw(st.integers(1, 24))
    alphabet = data.draw(st.integers(1, V))
    got, want = new_pool(B, V, N, C, device, dtype), new_pool(B, V, N, C, "cpu", dtype)
    for _ in range(data.draw(st.integers(1, 5))):
        grams = random_grams(data, B, data.draw(st.integers(0, 12)), N, alphabet).to(dtype)
        ops.ngram_pool_insert(*got, grams.to(device), g)
        ref.ngram_pool_insert(*want, grams, g)
        for gs, ws in zip(pool_state(*got), pool_state(*want)):
            assert torch.equal(gs, ws)
        last = torch.tensor(data.draw(st.lists(st.integers(-1, V - 1), min_size=B, max_size=B)), dtype=dtype)
        width = data.draw(st.integers(1, g + 1))
        cand, count = ops.ngram_pool_lookup(got[0], got[1], last.to(device), width)
        want_cand, want_count = ref.ngram_pool_lookup(want[0], want[1], last, width)
        assert cand.dtype == dtype and torch.equal(cand.cpu(), want_cand)
        assert torch.equal(count.cpu(), want_count)


@HYPOTHESIS
@given(data=st.data())
def test_pool_keeps_the_most_recent_distinct_continuations(device, data):
    # Semantics from first principles: replay every write with its time.
    V, N, g = 4, 3, data.draw(st.integers(1, 3))
    C = data.draw(st.integers(1, 30))
    grams = random_grams(data, 1, data.draw(st.integers(0, 40)), N, 3)
    pool = new_pool(1, V, N, C, device)
    ops.ngram_pool_insert(*pool, grams.to(device), g)
    writes = [x for x in grams[0].tolist() if -1 not in x][-C:]  # the last C writes
    for key in range(V):
        newest_first = [x[1:] for x in reversed(writes) if x[0] == key]
        distinct = [c for i, c in enumerate(newest_first) if c not in newest_first[:i]]
        assert keys_of(pool, key, g) == [distinct[:g]]


def test_ngram_pool_class(device):
    pool = specdec.ops.NGramPool(batch=3, vocab=50, n=3, g=2, device=device, capacity=8, dtype=torch.int32)
    assert pool.nbytes == (3 * 50 + 3 * 8 * 4 + 3) * 4
    tokens = torch.tensor([[1, 2, 3, 1, 2, 4], [5, 6, 7, 8, 9, 10], [1, 2, 3, -1, -1, -1]], device=device)
    pool.insert(tokens.unfold(1, 3, 1))  # int64 n-grams into an int32 pool
    cand, count = pool.lookup(torch.tensor([1, 5, 1], device=device))
    assert cand.dtype == torch.int32 and cand.shape == (3, 2, 2)
    assert cand.tolist() == [[[2, 4], [2, 3]], [[6, 7], [-1, -1]], [[2, 3], [-1, -1]]]
    assert count.tolist() == [2, 1, 1]
    pool.reset(torch.tensor([True, False, False], device=device))
    assert pool.lookup(torch.tensor([1, 5, 1], device=device))[1].tolist() == [0, 1, 1]
    pool.reset([2])
    assert pool.lookup(torch.tensor([1, 5, 1], device=device))[1].tolist() == [0, 1, 0]
    assert pool.cursor.tolist() == [0, 4, 0]
    pool.reset()
    assert (pool.head == -1).all() and (pool.cursor == 0).all()
    with pytest.raises(ValueError, match="n >= 2"):
        specdec.ops.NGramPool(1, 10, 1, 2)


# ---- op contracts: opcheck, torch.compile, bad input -------------------------------------------


def example(device, dtype=torch.int64):
    gen = torch.Generator().manual_seed(0)
    B, S, V, N, C = 3, 40, 9, 3, 16
    head, entries, cursor = new_pool(B, V, N, C, "cpu", dtype)
    grams = torch.randint(0, 4, (B, 12, N), generator=gen, dtype=dtype)
    ref.ngram_pool_insert(head, entries, cursor, grams, 3)
    d = {
        "context": torch.randint(0, 5, (B, S), generator=gen, dtype=dtype),
        "context_len": torch.tensor([S, S // 2, 1], dtype=dtype),
        "head": head, "entries": entries, "cursor": cursor,
        "ngrams": torch.randint(0, V, (B, 5, N), generator=gen, dtype=dtype),
        "last_ids": torch.tensor([0, 1, -1], dtype=dtype),
    }
    return {k: v.to(device) for k, v in d.items()}


def op_calls(x):
    B = x["context"].shape[0]
    idx = lambda *s: x["context"].new_empty(s)  # noqa: E731
    return [
        (T_OPS.ngram_match.default, (x["context"], x["context_len"], 1, 3),
         {"draft": idx(B, 5), "draft_len": idx(B)}),
        (T_OPS.ngram_pool_insert.default, (x["head"], x["entries"], x["cursor"], x["ngrams"], 3), {}),
        (T_OPS.ngram_pool_lookup.default, (x["head"], x["entries"], x["last_ids"]),
         {"candidates": idx(B, 3, 2), "count": idx(B)}),
    ]


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@pytest.mark.parametrize("case", range(3))
def test_opcheck(device, dtype, case):
    op, args, kwargs = op_calls(example(device, dtype))[case]
    torch.library.opcheck(op, args, kwargs)


def test_torch_compile_fullgraph(device):
    def step(x):
        draft, n = ops.ngram_match(x["context"], x["context_len"], 2, 4, 6)
        ops.ngram_pool_insert(x["head"], x["entries"], x["cursor"], x["ngrams"], 3)
        cand, count = ops.ngram_pool_lookup(x["head"], x["entries"], x["last_ids"], 3)
        return draft, n + 1, cand, count

    eager_x, compiled_x = example(device), example(device)
    eager = step(eager_x)
    compiled = torch.compile(step, fullgraph=True)(compiled_x)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)
    for k in ("head", "entries", "cursor"):  # the in-place updates happened under compile too
        assert torch.equal(eager_x[k], compiled_x[k])


def bad_calls(x, values: bool):
    """(description, call, match): each call must raise ValueError/TypeError matching `match`.
    ``values``: include the value checks, which read the data (CPU tensors only)."""
    ctx, lens = x["context"], x["context_len"]
    head, entries, cursor, grams, last = x["head"], x["entries"], x["cursor"], x["ngrams"], x["last_ids"]
    m, ins, look = ops.ngram_match, ops.ngram_pool_insert, ops.ngram_pool_lookup
    cases = [
        ("context rank", lambda: m(ctx[0], lens[:1]), "context"),
        ("context dtype", lambda: m(ctx.float(), lens), "context"),
        ("context_len shape", lambda: m(ctx, lens[:2]), "context_len"),
        ("context_len rank", lambda: m(ctx, lens[:, None]), "context_len"),
        ("context_len dtype", lambda: m(ctx, lens.int()), "context_len"),
        ("min_n zero", lambda: m(ctx, lens, 0, 3), "min_n"),
        ("min_n > max_n", lambda: m(ctx, lens, 3, 2), "max_n"),
        ("k zero", lambda: m(ctx, lens, 1, 2, 0), "k must"),
        ("draft dtype", lambda: T_OPS.ngram_match(
            ctx, lens, 1, 2, draft=ctx.new_empty(3, 4).int(), draft_len=ctx.new_empty(3)), "draft"),
        ("draft rows", lambda: T_OPS.ngram_match(
            ctx, lens, 1, 2, draft=ctx.new_empty(2, 4), draft_len=ctx.new_empty(3)), "draft"),
        ("head rank", lambda: ins(head[0], entries, cursor, grams, 3), "head"),
        ("head dtype", lambda: ins(head.float(), entries, cursor, grams, 3), "head"),
        ("entries rank", lambda: ins(head, entries[0], cursor, grams, 3), "entries"),
        ("entries dtype", lambda: ins(head, entries.int(), cursor, grams, 3), "entries"),
        ("entries rows", lambda: ins(head, entries[:2], cursor, grams, 3), "entries"),
        ("entries n < 2", lambda: ins(head, entries[..., :2].contiguous(), cursor, grams[..., :1], 3), "entries"),
        ("entries not contiguous", lambda: ins(head, entries.transpose(0, 1).contiguous().transpose(0, 1),
                                               cursor, grams, 3), "contiguous"),
        ("cursor shape", lambda: ins(head, entries, cursor[:2], grams, 3), "cursor"),
        ("cursor dtype", lambda: ins(head, entries, cursor.int(), grams, 3), "cursor"),
        ("ngrams length", lambda: ins(head, entries, cursor, grams[..., :2], 3), "ngrams"),
        ("ngrams rank", lambda: ins(head, entries, cursor, grams[0], 3), "ngrams"),
        ("ngrams dtype", lambda: ins(head, entries, cursor, grams.int(), 3), "ngrams"),
        ("g zero", lambda: ins(head, entries, cursor, grams, 0), "g must"),
        ("lookup g zero", lambda: look(head, entries, last, 0), "g must"),
        ("last_ids shape", lambda: look(head, entries, last[:2], 3), "last_ids"),
        ("last_ids dtype", lambda: look(head, entries, last.int(), 3), "last_ids"),
        ("lookup entries", lambda: look(head, entries[:, :, :2].contiguous(), last, 3), "entries"),
        ("candidates width", lambda: T_OPS.ngram_pool_lookup(
            head, entries, last, candidates=head.new_empty(3, 3, 3), count=head.new_empty(3)), "candidates"),
        ("count dtype", lambda: T_OPS.ngram_pool_lookup(
            head, entries, last, candidates=head.new_empty(3, 3, 2), count=head.new_empty(3).int()), "count"),
    ]
    if values:
        def with_value(t, index, value):
            t = t.clone()
            t[index] = value
            return t

        cases += [
            ("context_len > S", lambda: m(ctx, with_value(lens, 1, 41)), "context_len"),
            ("context_len negative", lambda: m(ctx, with_value(lens, 0, -1)), "context_len"),
            ("ngram id past vocab", lambda: ins(head, entries, cursor, with_value(grams, (1, 2, 0), 9), 3), "ngrams"),
            ("ngram id below -1", lambda: ins(head, entries, cursor, with_value(grams, (0, 0, 2), -2), 3), "ngrams"),
            ("cursor past capacity", lambda: ins(head, entries, with_value(cursor, 0, 16), grams, 3), "cursor"),
            ("last id past vocab", lambda: look(head, entries, with_value(last, 2, 9), 3), "last_ids"),
            ("last id below -1", lambda: look(head, entries, with_value(last, 2, -3), 3), "last_ids"),
        ]
    if torch.cuda.is_available():
        other = "cpu" if ctx.is_cuda else "cuda"
        cases += [
            ("context_len on another device", lambda: m(ctx, lens.to(other)), "context_len"),
            ("entries on another device", lambda: ins(head, entries.to(other), cursor, grams, 3), "entries"),
            ("ngrams on another device", lambda: ins(head, entries, cursor, grams.to(other), 3), "ngrams"),
            ("last_ids on another device", lambda: look(head, entries, last.to(other), 3), "last_ids"),
        ]
    return cases


def test_bad_input_raises_clear_errors(device):
    # Value checks read the data: CPU tensors only (docs/ops.md).
    assert_all_raise(bad_calls(example(device), values=device == "cpu"))


def test_fake_kernels_reject_what_the_kernels_reject(device):
    assert_fakes_match_kernels(example(device), bad_calls, op_calls)


def test_bad_input_changes_nothing(device):
    x = example(device)
    before = {k: x[k].clone() for k in ("head", "entries", "cursor")}
    bad = x["ngrams"].clone()
    bad[2, 4, 1] = 99 if device == "cpu" else 0
    with pytest.raises((ValueError, TypeError)):
        ops.ngram_pool_insert(x["head"], x["entries"], x["cursor"], bad if device == "cpu" else bad.float(), 3)
    assert all(torch.equal(before[k], x[k]) for k in before)


def test_empty_inputs(device):
    x = example(device)
    draft, n = ops.ngram_match(x["context"][:0], x["context_len"][:0], 1, 2, 3)
    assert draft.shape == (0, 3) and n.shape == (0,)
    draft, n = ops.ngram_match(x["context"][:, :0], torch.zeros_like(x["context_len"]), 1, 2, 3)
    assert (draft == -1).all() and (n == 0).all()
    before = x["entries"].clone()
    ops.ngram_pool_insert(x["head"], x["entries"], x["cursor"], x["ngrams"][:, :0], 3)
    assert torch.equal(before, x["entries"])


def test_invalid_values_raise_on_cpu_and_are_safe_on_cuda(device):
    # CPU raises (the checks read the data); CUDA cannot raise without a sync: context_len is
    # clamped to [0, S], n-grams with ids outside the vocabulary are skipped like padding, a key
    # outside it has no candidates, a cursor outside [0, C) writes to slot 0.
    context = torch.tensor([[1, 2, 1, 2]], device=device)
    pool = new_pool(1, 5, 2, 4, device)
    pool[2].fill_(7)
    if device == "cpu":
        with pytest.raises(ValueError, match="context_len"):
            ops.ngram_match(context, torch.tensor([9], device=device), 1, 1, 2)
        with pytest.raises(ValueError, match="ngrams"):
            insert(pool, [[[1, 2], [1, 5]]], g=2)
        with pytest.raises(ValueError, match="last_ids"):
            ops.ngram_pool_lookup(pool[0], pool[1], torch.tensor([5], device=device), 2)
        return
    draft, n = ops.ngram_match(context, torch.tensor([9], device=device), 1, 1, 2)
    assert draft.tolist() == [[1, 2]] and n.tolist() == [2]
    draft, n = ops.ngram_match(context, torch.tensor([-3], device=device), 1, 1, 2)
    assert n.tolist() == [0]
    insert(pool, [[[1, 2], [1, 5], [9, 1], [-4, 1], [1, 3]]], g=2)
    assert keys_of(pool, 1, 2) == [[[3], [2]]] and pool[2].tolist() == [2]
    cand, count = ops.ngram_pool_lookup(pool[0], pool[1], torch.tensor([5], device=device), 2)
    assert count.tolist() == [0] and (cand == -1).all()


def test_corrupted_pool_is_read_safely(device):
    # Links that point outside the slots or into a cycle: lookups and inserts stay in bounds and
    # terminate (the contents are then unspecified).
    head, entries, cursor = new_pool(2, 4, 2, 3, device)
    head[0] = torch.tensor([0, 99, -7, 1])
    entries[0] = torch.tensor([[0, 1, 1], [0, 2, 0], [3, 3, 50]])
    head[1] = 2
    entries[1] = torch.tensor([[2, 1, 2], [2, 2, 0], [2, 3, 1]])  # a cycle 2 -> 1 -> 0 -> 2
    for key in range(4):
        ops.ngram_pool_lookup(head, entries, torch.full((2,), key, device=device), 5)
    ops.ngram_pool_insert(head, entries, cursor, torch.tensor([[[0, 3], [3, 1]], [[2, 3], [2, 0]]], device=device), 2)
    cand, count = ops.ngram_pool_lookup(head, entries, torch.tensor([3, 2], device=device), 5)
    assert count.tolist()[0] >= 1 and cand[0, 0].tolist() == [1]
    assert cand[1, 0].tolist() == [0]
