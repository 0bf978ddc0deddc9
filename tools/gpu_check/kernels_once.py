"""Every CUDA kernel of csrc/cuda once, on small shapes: the program the GPU check runs under
compute-sanitizer's memcheck, racecheck and synccheck (tools/gpu_check.sh, step c).

The ops and the kernels each call launches (csrc/cuda/*.cu, TORCH_LIBRARY_IMPL):

  chain_speculative_sampling  chain_sampling_kernel (with and without draft probabilities)
  chain_greedy_verify         chain_greedy_kernel (token ids, and logits: torch's argmax first)
  build_tree                  build_tree_kernel (300 nodes: two steps of its 256-node leaf scan)
  tree_verify_greedy          tree_greedy_kernel
  tree_speculative_sampling   tree_sampling_kernel (deterministic, stochastic drafts);
                              typical: node_entropy_kernel, tree_typical_walk_kernel,
                              sample_at_node_kernel
  ngram_match                 ngram_match_kernel
  ngram_pool_insert / lookup  ngram_pool_insert_kernel, ngram_pool_lookup_kernel
  tree_attention              tree_attention_kernel (one key split, bf16, D = 128, a tree mask;
                              several splits, fp16, D = 64, causal: merge_kernel; fp32, D = 32;
                              fp16, D = 200: the widest heads' bucket, 2-warp blocks, 16-key tiles)
  kv_commit                   kv_commit_kernel (1-, 2-, 4- and 8-byte elements),
                              advance_lengths_kernel

Each result is compared with specdec.ops.reference on CPU copies (draws within the CUDA
tolerance of tests/support: at most one row in a hundred, and at least one, may land on a
neighbouring token). ``--device cpu`` runs the same calls on the CPU kernels.
"""

from __future__ import annotations

import sys

from gpu_common import Checks, device_or_exit, parser, sync

import torch
from support.ops import drafts_from, random_parents, random_probs

from specdec import TypicalAcceptance, ops
from specdec.ops import reference as ref


def draws_match(got: torch.Tensor, want: torch.Tensor, exact: bool) -> str | None:
    got = got.cpu()
    bad = int((got != want).sum())
    allowed = 0 if exact else max(1, got.numel() // 100)
    return None if bad <= allowed else f"{bad} of {got.numel()} draws differ from the reference"


def equal(got, want) -> str | None:
    for i, (g, w) in enumerate(zip(got, want)):
        if not torch.equal(g.cpu(), w):
            return f"output {i} differs from the reference"
    return None


def trees(B: int, T: int, gen: torch.Generator, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor([random_parents(T, gen) for _ in range(B)], dtype=dtype)


def main() -> int:
    args = parser(__doc__.splitlines()[0]).parse_args()
    dev = device_or_exit(args.device)
    exact = dev.type == "cpu"
    gen = torch.Generator().manual_seed(args.seed)
    checks = Checks()
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731

    def chain_sampling(V: int, with_draft: bool, index_dtype) -> str | None:
        B, K = 3, 4
        p = random_probs(B, K + 1, V, gen=gen)
        q = random_probs(B, K, V, gen=gen) if with_draft else None
        ids = drafts_from(p[:, :K], gen)
        ids[1] = drafts_from(random_probs(1, K, V, gen=gen), gen)[0]  # row 1 rejects early
        ids = ids.to(index_dtype)
        u = torch.rand(B, K + 1, generator=gen)
        u[0, :K] = 0.0  # row 0 accepts every draft with p > 0
        want_out, want_n = ref.chain_speculative_sampling(q, ids, p, u)
        out, n = ops.chain_speculative_sampling(to(q), to(ids), to(p), to(u))
        if not torch.equal(n.cpu(), want_n):
            return f"accept_len {n.tolist()} != reference {want_n.tolist()}"
        drawn = torch.zeros_like(want_out, dtype=torch.bool)
        drawn[torch.arange(B), want_n.long()] = True
        out = out.cpu()
        if not torch.equal(out[~drawn], want_out[~drawn]):
            return "accepted drafts differ from the reference"
        return draws_match(out[drawn], want_out[drawn], exact)

    for V, with_draft, index_dtype in [(1000, True, torch.int64), (1000, False, torch.int32),
                                       (600_000, False, torch.int64)]:
        checks.run(f"chain_speculative_sampling V={V} draft_probs={with_draft} {index_dtype}",
                   lambda: chain_sampling(V, with_draft, index_dtype))

    def chain_greedy() -> str | None:
        B, K, V = 4, 5, 50
        logits = torch.randn(B, K + 1, V, generator=gen)
        ids = logits[:, :K].argmax(-1)
        ids[1, 2] = (ids[1, 2] + 1) % V
        ids[3, 0] = (ids[3, 0] + 1) % V
        for target in (logits, logits.argmax(-1)):
            detail = equal(ops.chain_greedy_verify(to(ids), to(target)), ref.chain_greedy_verify(ids, target))
            if detail:
                return detail
        return None

    checks.run("chain_greedy_verify (logits and ids)", chain_greedy)

    def build_tree() -> str | None:
        parents = trees(2, 300, gen)
        for max_leaves, max_depth in ((None, None), (7, 3)):
            got = ops.build_tree(to(parents), max_leaves, max_depth)
            detail = equal(got, ref.build_tree(parents, max_leaves, max_depth))
            if detail:
                return f"max_leaves={max_leaves}: {detail}"
        return None

    checks.run("build_tree T=300", build_tree)

    def tree_greedy() -> str | None:
        B, T, V = 4, 16, 4
        parents = trees(B, T, gen, torch.int32)
        tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int32)
        logits = torch.randn(B, T, V, generator=gen)
        got = ops.tree_verify_greedy(to(tokens), to(parents), to(logits))
        return equal(got, ref.tree_verify_greedy(tokens, parents, logits))

    checks.run("tree_verify_greedy", tree_greedy)

    def tree_sampling(stochastic: bool, typical: bool) -> str | None:
        B, T, V = 4, 12, 3000
        parents = trees(B, T, gen)
        p = random_probs(B, T, V, gen=gen)
        q = random_probs(B, T, V, gen=gen) if stochastic else None
        # Tokens from the target at the parent half of the time, so paths get accepted.
        parent_p = torch.gather(p, 1, parents.clamp_min(0)[..., None].expand(B, T, V))
        src = q if stochastic else random_probs(B, T, V, gen=gen)
        pick = torch.rand(B, T, generator=gen) < 0.5
        tokens = torch.multinomial(torch.where(pick[..., None], parent_p, src).reshape(-1, V), 1,
                                   generator=gen).reshape(B, T)
        u = torch.rand(B, T, generator=gen)
        if typical:
            want = ref.tree_speculative_sampling(tokens, parents, p, u, typical=(0.2, 0.5))
            got = ops.tree_speculative_sampling(to(tokens), to(parents), to(p), to(u),
                                                typical=TypicalAcceptance(0.2, 0.5))
        else:
            want = ref.tree_speculative_sampling(tokens, parents, p, u, q)
            got = ops.tree_speculative_sampling(to(tokens), to(parents), to(p), to(u), to(q))
        return equal(got[:2], want[:2]) or draws_match(got[2], want[2], exact)

    for stochastic, typical in [(False, False), (True, False), (False, True)]:
        checks.run(f"tree_speculative_sampling stochastic={stochastic} typical={typical}",
                   lambda: tree_sampling(stochastic, typical))

    def ngram_match() -> str | None:
        B, S = 3, 200
        context = torch.randint(0, 12, (B, S), generator=gen)
        lengths = torch.tensor([S, 150, 2])
        for earliest in (False, True):
            got = ops.ngram_match(to(context), to(lengths), 1, 3, k=6, earliest=earliest)
            detail = equal(got, ref.ngram_match(context, lengths, 1, 3, k=6, earliest=earliest))
            if detail:
                return f"earliest={earliest}: {detail}"
        return None

    checks.run("ngram_match", ngram_match)

    def ngram_pool() -> str | None:
        B, V, C, N, M, g = 3, 20, 16, 3, 24, 2
        ngrams = torch.randint(0, 5, (B, M, N), generator=gen)
        ngrams[0, 3, 1] = -1  # padding: skipped
        state = (torch.full((B, V), -1), torch.full((B, C, N + 1), -1), torch.zeros(B, dtype=torch.int64))
        mine = [to(t.clone()) for t in state]
        theirs = [t.clone() for t in state]
        ops.ngram_pool_insert(*mine, to(ngrams), g)
        ref.ngram_pool_insert(*theirs, ngrams, g)
        for key in range(6):
            last = torch.full((B,), key)
            got = ops.ngram_pool_lookup(mine[0], mine[1], to(last), g)
            detail = equal(got, ref.ngram_pool_lookup(theirs[0], theirs[1], last, g))
            if detail:
                return f"lookup of key {key}: {detail}"
        return None if torch.equal(mine[2].cpu(), theirs[2]) else "cursor differs from the reference"

    checks.run("ngram_pool_insert + ngram_pool_lookup", ngram_pool)

    def tree_attention(B, H, Hkv, T, D, S, dtype, with_mask, atol) -> str | None:
        q = torch.randn(B, H, T, D, generator=gen).to(dtype)
        k = torch.randn(B, Hkv, S, D, generator=gen).to(dtype)
        v = torch.randn(B, Hkv, S, D, generator=gen).to(dtype)
        prefix = (torch.rand(B, generator=gen) * (S - T + 1)).long()
        mask = ref.build_tree(trees(B, T, gen))[0] if with_mask else None
        got = ops.tree_attention(to(q), to(k), to(v), to(prefix), to(mask)).cpu().float()
        want = ref.tree_attention(q.float(), k.float(), v.float(), prefix, mask)
        err = float((got - want).abs().max())
        return None if err <= atol else f"max abs error {err:.3g} > {atol}"

    # (B, H, Hkv, T, D, S): S = 40 is one key split; S = 1000 with B * Hkv = 2 is four splits
    # on a GPU of >= 4 SMs, so the merge kernel runs.
    for shape, dtype, with_mask, atol in [((2, 4, 2, 5, 128, 40), torch.bfloat16, True, 3e-2),
                                          ((1, 8, 2, 3, 64, 1000), torch.float16, False, 5e-3),
                                          ((2, 2, 1, 4, 32, 300), torch.float32, True, 1e-5),
                                          ((1, 4, 1, 17, 200, 90), torch.float16, True, 1e-2)]:
        checks.run(f"tree_attention {shape} {dtype} mask={with_mask}",
                   lambda: tree_attention(*shape, dtype, with_mask, atol))

    def kv_commit(dtype) -> str | None:
        L, B, H, S, D = 2, 3, 2, 24, 16
        ks = [torch.randn(B, H, S, D, generator=gen).to(dtype) for _ in range(L)]
        vs = [torch.randn(B, H, S, D + 2, generator=gen).to(dtype) for _ in range(L)]
        lengths = torch.tensor([0, 5, 12])
        accept = torch.tensor([2, 0, 4])
        src = torch.stack([lengths[b] + torch.tensor([1, 2, 4, 6]) for b in range(B)])  # a tree path
        # Copies (on the CPU, .to() would return the tensors themselves, which the op changes).
        mine_k, mine_v = [to(t.clone()) for t in ks], [to(t.clone()) for t in vs]
        mine_len = to(lengths.clone())
        ops.kv_commit(mine_k, mine_v, mine_len, to(src), to(accept))
        ref_k, ref_v, ref_len = [t.clone() for t in ks], [t.clone() for t in vs], lengths.clone()
        ref.kv_commit(ref_k, ref_v, ref_len, src, accept)
        for got, want in zip(mine_k + mine_v, ref_k + ref_v):
            if not torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8)):
                return "a cache differs from the reference"
        return None if torch.equal(mine_len.cpu(), ref_len) else "lengths differ from the reference"

    for dtype in (torch.float8_e4m3fn, torch.bfloat16, torch.float32, torch.float64):
        checks.run(f"kv_commit {dtype}", lambda: kv_commit(dtype))

    sync(dev)
    return checks.exit()


if __name__ == "__main__":
    sys.exit(main())
