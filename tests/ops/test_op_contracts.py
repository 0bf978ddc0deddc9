"""Contracts shared by the sampling/verification ops: opcheck, torch.compile, bad input."""

import pytest
import torch
from support.ops import assert_all_raise, assert_fakes_match_kernels, random_probs

import specdec
from specdec import ops

T_OPS = torch.ops.specdec


def example_inputs(device, dtype=torch.int64):
    gen = torch.Generator().manual_seed(0)
    B, K, V, T = 3, 4, 11, 6
    d = {
        "draft_ids": torch.randint(0, V, (B, K), generator=gen, dtype=dtype),
        "draft_probs": random_probs(B, K, V, gen=gen),
        "target_probs": random_probs(B, K + 1, V, gen=gen),
        "uniform": torch.rand(B, K + 1, generator=gen),
        "parents": torch.tensor([[-1, 0, 0, 1, 1, 2]] * B, dtype=dtype),
        "tree_tokens": torch.randint(0, V, (B, T), generator=gen, dtype=dtype),
        "tree_probs": random_probs(B, T, V, gen=gen),
        "tree_uniform": torch.rand(B, T, generator=gen),
        "logits": torch.randn(B, K + 1, V, generator=gen),
        "tree_logits": torch.randn(B, T, V, generator=gen),
    }
    return {k: v.to(device) for k, v in d.items()}


def op_calls(x):
    """(op, args, out-kwargs) for every op, outputs preallocated as an engine would."""
    B, K = x["draft_ids"].shape
    T = x["parents"].shape[1]
    idx = lambda *s: x["draft_ids"].new_empty(s)  # noqa: E731
    return [
        (T_OPS.chain_speculative_sampling.default,
         (x["draft_probs"], x["draft_ids"], x["target_probs"], x["uniform"]),
         {"out_ids": idx(B, K + 1), "accept_len": idx(B)}),
        (T_OPS.chain_speculative_sampling.default,
         (None, x["draft_ids"], x["target_probs"], x["uniform"]),
         {"out_ids": idx(B, K + 1), "accept_len": idx(B)}),
        (T_OPS.chain_greedy_verify.default, (x["draft_ids"], x["logits"]),
         {"out_ids": idx(B, K + 1), "accept_len": idx(B)}),
        (T_OPS.build_tree.default, (x["parents"],),
         {"tree_mask": torch.empty(B, T, T, dtype=torch.bool, device=x["parents"].device),
          "depth": idx(B, T), "paths": idx(B, T, T)}),
        (T_OPS.tree_verify_greedy.default, (x["tree_tokens"], x["parents"], x["tree_logits"]),
         {"accept_path": idx(B, T), "accept_len": idx(B), "next_token": idx(B)}),
        (T_OPS.tree_speculative_sampling.default,
         (x["tree_tokens"], x["parents"], x["tree_probs"], x["tree_uniform"]),
         {"accept_path": idx(B, T), "accept_len": idx(B), "next_token": idx(B)}),
        (T_OPS.tree_speculative_sampling.default,
         (x["tree_tokens"], x["parents"], x["tree_probs"], x["tree_uniform"], None, 0.1, 0.3),
         {"accept_path": idx(B, T), "accept_len": idx(B), "next_token": idx(B)}),
    ]


@pytest.mark.parametrize("case", range(7))
def test_opcheck(device, case):
    op, args, kwargs = op_calls(example_inputs(device))[case]
    torch.library.opcheck(op, args, kwargs)


def test_torch_compile_fullgraph(device):
    x = example_inputs(device)

    def step(x):
        out, n = ops.chain_speculative_sampling(x["draft_probs"], x["draft_ids"], x["target_probs"], x["uniform"])
        g_out, g_n = ops.chain_greedy_verify(x["draft_ids"], x["logits"])
        mask, depth, paths = ops.build_tree(x["parents"])
        path, tn, nxt = ops.tree_verify_greedy(x["tree_tokens"], x["parents"], x["tree_logits"])
        s_path, s_n, s_nxt = ops.tree_speculative_sampling(
            x["tree_tokens"], x["parents"], x["tree_probs"], x["tree_uniform"])
        return out, n + 1, g_out, g_n, mask, depth, paths, path, tn, nxt, s_path, s_n, s_nxt

    eager = step(x)
    compiled = torch.compile(step, fullgraph=True)(x)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)


def test_torch_compile_reports_a_wrong_shape_while_tracing(device):
    x = example_inputs(device)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    @torch.compile(backend=backend, fullgraph=True)
    def step(p):
        return ops.chain_speculative_sampling(None, x["draft_ids"], p, x["uniform"])

    with pytest.raises(Exception, match=r"target_probs must have shape"):
        step(x["target_probs"][:, 1:])
    assert not graphs  # the fake kernel raised: no graph was made, let alone run


def test_outputs_can_be_preallocated_and_reused(device):
    x = example_inputs(device, torch.int32)
    op, args, kwargs = op_calls(x)[0]
    op(*args, **kwargs)
    first = {k: v.clone() for k, v in kwargs.items()}
    op(*args, **kwargs)
    assert all(torch.equal(first[k], kwargs[k]) for k in kwargs)
    assert kwargs["out_ids"].dtype == torch.int32


def bad_calls(x, values: bool):
    """(description, call, match): each call must raise ValueError/TypeError matching `match`.
    ``values``: include the value checks, which read the data (CPU tensors only)."""
    ids, q, p, u = x["draft_ids"], x["draft_probs"], x["target_probs"], x["uniform"]
    par, tok, tp, tu = x["parents"], x["tree_tokens"], x["tree_probs"], x["tree_uniform"]
    cs, cg = ops.chain_speculative_sampling, ops.chain_greedy_verify
    ts, tg = ops.tree_speculative_sampling, ops.tree_verify_greedy
    cases = [
        ("draft ids rank", lambda: cs(q, ids[0], p, u), "draft_ids"),
        ("draft ids dtype", lambda: cs(q, ids.float(), p, u), "draft_ids"),
        ("target rank", lambda: cs(q, ids, p[:, 0], u), "target_probs"),
        ("target K", lambda: cs(q, ids, p[:, :-1], u), "target_probs"),
        ("target dtype", lambda: cs(q, ids, p.long(), u), "target_probs"),
        ("target float8", lambda: cs(None, ids, p.to(torch.float8_e4m3fn), u),
         "target_probs must be float32, float16, bfloat16 or float64"),
        ("draft probs vocab", lambda: cs(q[..., :-1], ids, p, u), "draft_probs"),
        ("draft probs dtype", lambda: cs(q.double(), ids, p, u), "draft_probs"),
        ("uniform shape", lambda: cs(q, ids, p, u[:, :-1]), "uniform"),
        ("uniform dtype", lambda: cs(q, ids, p, u.double()), "uniform"),
        ("greedy target shape", lambda: cg(ids, ids), "target"),
        ("greedy target dtype", lambda: cg(ids, x["logits"].argmax(-1).int()), "target"),
        ("greedy target float8", lambda: cg(ids, x["logits"].to(torch.float8_e5m2)),
         "target logits must be float32, float16, bfloat16 or float64"),
        ("parents rank", lambda: ops.build_tree(par[0]), "parents"),
        ("parents dtype", lambda: ops.build_tree(par.float()), "parents"),
        ("tree parents shape", lambda: tg(tok, par[:, :-1], x["tree_logits"]), "parents"),
        ("tree parents dtype", lambda: tg(tok, par.int(), x["tree_logits"]), "parents"),
        ("tree target shape", lambda: tg(tok, par, x["logits"]), "target"),
        ("tree probs shape", lambda: ts(tok, par, p, tu), "target_probs"),
        ("tree uniform shape", lambda: ts(tok, par, tp, u), "uniform"),
        ("typical with draft probs",
         lambda: ts(tok, par, tp, tu, tp, typical=specdec.TypicalAcceptance()), "posterior_threshold"),
        ("typical threshold", lambda: ts(tok, par, tp, tu, typical=specdec.TypicalAcceptance(2.0)),
         "posterior_threshold"),
        ("typical alpha", lambda: ts(tok, par, tp, tu, typical=specdec.TypicalAcceptance(0.1, -1.0)),
         "posterior_alpha"),
        ("max_accept zero", lambda: tg(tok, par, x["tree_logits"], max_accept=-1), "accept_path"),
        ("out wrong shape", lambda: T_OPS.chain_greedy_verify(
            ids, x["logits"], out_ids=ids.new_empty(3, 2), accept_len=ids.new_empty(3)), "out_ids"),
        ("out wrong dtype", lambda: T_OPS.chain_greedy_verify(
            ids, x["logits"], out_ids=ids.new_empty(3, 5).int(), accept_len=ids.new_empty(3)), "out_ids"),
        ("out not contiguous", lambda: T_OPS.chain_greedy_verify(
            ids, x["logits"], out_ids=ids.new_empty(5, 3).t(), accept_len=ids.new_empty(3)), "out_ids"),
    ]
    if values:
        bad_ids = ids.clone()
        bad_ids[1, 2] = 11
        neg_tok = tok.clone()
        neg_tok[0, 3] = -5  # -1 would be a padding node
        cases += [
            ("draft id past vocab", lambda: cs(q, bad_ids, p, u), "draft_ids"),
            ("greedy draft id past vocab", lambda: cg(bad_ids, x["logits"]), "draft_ids"),
            ("greedy tree token negative", lambda: tg(neg_tok, par, x["tree_logits"]), "tree_tokens"),
            ("tree token negative", lambda: ts(neg_tok, par, tp, tu), "tree_tokens"),
            ("root with a parent", lambda: ops.build_tree(torch.tensor([[0, 0, 1]])), "parents"),
            ("two roots", lambda: ops.build_tree(torch.tensor([[-1, 0, -1]])), "second root"),
            ("forward reference", lambda: ops.build_tree(torch.tensor([[-1, 2, 0]])), "precede"),
            ("cycle", lambda: tg(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[-1, 2, 1]]),
                                 torch.zeros(1, 3, dtype=torch.long)), "not a tree"),
            ("self parent", lambda: ts(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[-1, 1]]),
                                       torch.ones(1, 2, 1), torch.rand(1, 2)), "not a tree"),
        ]
    if torch.cuda.is_available():
        other = "cpu" if ids.is_cuda else "cuda"
        cases += [
            ("target on another device", lambda: cs(q, ids, p.to(other), u), "target_probs"),
            ("uniform on another device", lambda: ts(tok, par, tp, tu.to(other)), "uniform"),
            ("parents on another device", lambda: tg(tok, par.to(other), x["tree_logits"]), "parents"),
        ]
    return cases


def test_bad_input_raises_clear_errors(device):
    # Value checks read the data: CPU tensors only (docs/ops.md).
    assert_all_raise(bad_calls(example_inputs(device), values=device == "cpu"))


def test_fake_kernels_reject_what_the_kernels_reject(device):
    # torch.compile traces with fake tensors: wrong shapes, dtypes and devices must raise there
    # too, with the same errors (fake tensors hold no values, so value checks are left out),
    # and correct calls must pass.
    mode, x = assert_fakes_match_kernels(example_inputs(device), bad_calls, op_calls)
    with mode:
        out, n = ops.chain_speculative_sampling(None, x["draft_ids"], x["target_probs"], x["uniform"])
        assert isinstance(out, torch._subclasses.fake_tensor.FakeTensor) and out.shape == (3, 5)
        with pytest.raises(ValueError, match=r"target_probs must have shape \[3, 5, \*\]"):
            ops.chain_speculative_sampling(None, x["draft_ids"], x["target_probs"][:, 1:], x["uniform"])


def test_bad_input_writes_nothing(device):
    x = example_inputs(device)
    out = torch.full((3, 5), 123, device=device)
    n = torch.full((3,), 123, device=device)
    bad = x["draft_ids"].clone()
    bad[0, 0] = -1
    with pytest.raises((ValueError, TypeError)):
        T_OPS.chain_speculative_sampling(
            None, bad if device == "cpu" else bad.float(), x["target_probs"], x["uniform"],
            out_ids=out, accept_len=n)
    assert (out == 123).all() and (n == 123).all()


def test_empty_batch(device):
    x = example_inputs(device)
    out, n = ops.chain_speculative_sampling(None, x["draft_ids"][:0], x["target_probs"][:0], x["uniform"][:0])
    assert out.shape == (0, 5) and n.shape == (0,)


def test_invalid_values_raise_on_cpu_and_are_safe_on_cuda(device):
    # Out-of-vocabulary drafts and a node with a forward parent: CPU raises (checks read the
    # data); CUDA cannot raise without a sync, so the draft is rejected and the node detached.
    p = torch.full((1, 3, 4), 0.25, device=device)
    ids = torch.tensor([[1, 99]], device=device)
    u = torch.zeros(1, 3, device=device)
    parents = torch.tensor([[-1, 0, 3, 0]], device=device)
    tokens = torch.tensor([[0, 1, 2, 3]], device=device)
    target = torch.tensor([[1, 2, 0, 0]], device=device)
    if device == "cpu":
        with pytest.raises(ValueError, match="draft_ids"):
            ops.chain_speculative_sampling(None, ids, p, u)
        with pytest.raises(ValueError, match="parents"):
            ops.tree_verify_greedy(tokens, parents, target)
        return
    out, n = ops.chain_speculative_sampling(None, ids, p, u)
    assert n.tolist() == [1] and out[0, 0] == 1 and 0 <= out[0, 1] < 4 and out[0, 2] == -1
    path, n, nxt = ops.tree_verify_greedy(tokens, parents, target)
    assert path[0, :2].tolist() == [0, 1] and n.tolist() == [1]  # node 2 (detached) never accepted
    mask, depth, _ = ops.build_tree(parents)
    assert depth[0, 2] == 0 and mask[0, 2].tolist() == [False, False, True, False]
