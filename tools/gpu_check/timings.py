"""CUDA-event timings of specdec's ops (tools/gpu_check.sh, step e), written as markdown tables.

1. tree_attention against torch's scaled_dot_product_attention on a verification pass's shapes:
   a Llama-3-8B layer (32 query heads, 8 KV heads, D = 128, bf16), one row, T = 1-64 tree nodes
   over S = 512-32768 keys (the prefix and the tree). SDPA gets each KV head's queries stacked
   (exact GQA without copying K/V) and the boolean prefix + tree mask (torch picks its backend;
   flash attention takes no such mask), and once without a mask on the flash backend (every
   query sees every key: what FlashAttention costs on these shapes, the bar to meet). The floor
   is the larger of K and V read once at the GPU's bandwidth and the FLOPs at its dense bf16
   rate (docs/cuda_kernels.md's figures).
2. The sampling ops' achieved HBM bandwidth: bytes the kernels must move (counted per case
   below) over their time, as a fraction of the H200's 4.8 TB/s.
3. Every op against its plain-PyTorch reference (specdec.ops.reference, one row at a time, on
   the same device) on decode shapes.

Times are medians of CUDA-event timed calls after warm-up (host clock on CPU). The tables are
rewritten after every case, so a run stopped by its time limit leaves what it measured.
``--device cpu --quick`` runs every case on tiny shapes (the script's own check).
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import time
from pathlib import Path

from gpu_common import ROOT, device_or_exit, parser
from timing_report import Report, Timer, fmt, times

import torch
import torch.nn.functional as F
from support.ops import drafts_from, random_parents, random_probs

from specdec import TypicalAcceptance, ops
from specdec.ops import reference as ref

HBM_BYTES_PER_S = 4.8e12  # H200 (an H100 SXM: 3.35e12)
BF16_FLOP_PER_S = 989e12  # dense bf16 tensor cores, H100/H200 SXM


def header(device: torch.device) -> str:
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        commit = "?"
    import specdec

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = f"{props.name}, {props.multi_processor_count} SMs, CUDA {torch.version.cuda}"
    else:
        gpu = "CPU (the script's own check: not a measurement)"
    return (f"# specdec op timings ({datetime.date.today()}, commit {commit or '?'})\n\n"
            f"{gpu}; torch {torch.__version__}; {specdec.build_info()}.\n"
            "Medians of CUDA-event timed calls after warm-up; written by tools/gpu_check/timings.py.")


# --- 1. tree_attention against SDPA -------------------------------------------------------------


def attention_vs_sdpa(timer: Timer, report: Report, quick: bool) -> None:
    dev = timer.device
    H, Hkv, D = (4, 2, 32) if quick else (32, 8, 128)
    G = H // Hkv
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rows = report.section(
        f"tree_attention vs SDPA (B = 1, H = {H}, Hkv = {Hkv}, D = {D}, {str(dtype)[6:]})",
        "S: keys per query row's view (prefix S - T, then the T-node tree). `sdpa mask`: SDPA with "
        "the boolean prefix + tree mask (the backend torch picks); `flash, no mask`: SDPA's flash "
        "backend with every key visible (FlashAttention's cost on the shape). Floor: max(K and V "
        "read once at 4.8 TB/s, FLOPs at 989 TFLOP/s). Ratios: specdec's time over each.",
        ["T", "S", "specdec", "sdpa mask", "flash, no mask", "floor", "/ sdpa mask", "/ flash", "/ floor"])
    Ts, Ss = ([1, 4], [64, 256]) if quick else ([1, 4, 16, 64], [512, 2048, 8192, 32768])
    for T in Ts:
        for S in Ss:
            if timer.left() < 5:
                rows.append([str(T), str(S)] + ["(out of time)"] * 7)
                report.write()
                return
            gen = torch.Generator(device=dev).manual_seed(T * S)
            q = torch.randn(1, H, T, D, generator=gen, device=dev).to(dtype)
            k = torch.randn(1, Hkv, S, D, generator=gen, device=dev).to(dtype)
            v = torch.randn(1, Hkv, S, D, generator=gen, device=dev).to(dtype)
            prefix = torch.tensor([S - T], device=dev)
            cpu_gen = torch.Generator().manual_seed(T)
            tree_mask = ops.build_tree(torch.tensor([random_parents(T, cpu_gen)], device=dev))[0]
            mask = torch.ones(1, 1, G * T, S, dtype=torch.bool, device=dev)
            mask[0, 0, :, S - T:] = tree_mask[0].repeat(G, 1)
            qg = q.view(1, Hkv, G * T, D)  # [B, Hkv, G T, D]: query head kvh * G + g, node t
            ours = timer.us(lambda: ops.tree_attention(q, k, v, prefix, tree_mask))
            sdpa = timer.us(lambda: F.scaled_dot_product_attention(qg, k, v, attn_mask=mask))
            flash = None
            if dev.type == "cuda":
                try:
                    from torch.nn.attention import SDPBackend, sdpa_kernel

                    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                        flash = timer.us(lambda: F.scaled_dot_product_attention(qg, k, v))
                except Exception as e:  # noqa: BLE001 (no flash backend for this build or shape)
                    print(f"flash backend unavailable at T={T} S={S}: {type(e).__name__}", flush=True)
            kv_bytes = 2 * Hkv * S * D * k.element_size()
            flops = 4 * H * T * S * D
            floor = max(kv_bytes / HBM_BYTES_PER_S, flops / BF16_FLOP_PER_S) * 1e6
            ratio = lambda x: "-" if x is None else times(ours / x)  # noqa: E731
            rows.append([str(T), str(S), fmt(ours), fmt(sdpa), fmt(flash), fmt(floor), ratio(sdpa),
                         ratio(flash), ratio(floor)])
            report.write()


# --- 2. sampling bandwidth ----------------------------------------------------------------------


def sampling_bandwidth(timer: Timer, report: Report, quick: bool) -> None:
    dev = timer.device
    V = 1000 if quick else 152064
    l2 = (f"the {torch.cuda.get_device_properties(dev).L2_cache_size / 2**20:.0f} MiB L2"
          if dev.type == "cuda" else "the L2")
    rows = report.section(
        f"Sampling ops: achieved bandwidth (V = {V}, float32 probabilities)",
        "Bytes: the global-memory reads and writes of the kernels' passes over the vocabulary, "
        "counted by hand from the kernel code, per row (a float32 pass: 4V bytes; scalar reads "
        "and each draw's re-read of the 512-entry chunk its token falls in, 2 KB, left out). "
        "Chain rows reject draft 0 and tree rows every child, so every row draws: chain, q = 1: "
        "the draw's pass over p (4V); chain with draft probabilities: the draw's pass over p and "
        "q (8V); tree, q = 1, 7 children of the root all rejected (no pass for them): p read and "
        "the residual written, then the draw's pass over the residual (12V); tree, draft "
        "probabilities, the same 7 children: per child one pass reading p (the first child) or "
        "the residual and q, writing the residual (12V each), then the draw's pass over the "
        "residual (4V): 88V; typical acceptance over a chain of T = 8 nodes: the entropies' pass "
        "over every node (8 x 4V), then the draw at the node the walk stops at (4V). Fraction: of "
        f"4.8 TB/s. Calls run back to back, so data under {l2} (B = 1, and B = 64 in "
        "part) is partly read from it. The tree rows count the residual (float32 [B, V] scratch "
        "that a row's block writes and reads back) as HBM traffic: at B = 512 it is several times "
        "the L2, yet a read that follows its write closely may still be served by L2, so those "
        "rows bound HBM traffic from above; the other B = 512 rows measure HBM.",
        ["case", "rows", "time", "bytes", "GB/s", "fraction of HBM"])
    Bs = [1, 4] if quick else [1, 64, 512]
    cases = []
    for B in Bs:
        cases += [("chain_speculative_sampling q=1, K=4", B, "chain", False),
                  ("chain_speculative_sampling draft probs, K=4", B, "chain", True),
                  ("tree_speculative_sampling q=1, 7 children", B, "tree", False),
                  ("tree_speculative_sampling draft probs, 7 children", B, "tree", True),
                  ("tree_speculative_sampling typical, T=8", B, "typical", False)]
    for name, B, kind, stochastic in cases:
        if timer.left() < 5:
            rows.append([name, str(B)] + ["(out of time)"] * 4)
            break
        gen = torch.Generator(device=dev).manual_seed(B)
        if kind == "chain":
            K = 4
            p = torch.rand(B, K + 1, V, generator=gen, device=dev)
            p /= p.sum(-1, keepdim=True)
            ids = torch.randint(0, V, (B, K), generator=gen, device=dev)
            p[torch.arange(B, device=dev), 0, ids[:, 0]] = 0.0  # draft 0 rejected in every row
            q = None
            if stochastic:
                q = torch.rand(B, K, V, generator=gen, device=dev)
                q /= q.sum(-1, keepdim=True)
            u = torch.rand(B, K + 1, generator=gen, device=dev)
            fn = lambda: ops.chain_speculative_sampling(q, ids, p, u)  # noqa: E731
            nbytes = B * V * 4 * (2 if stochastic else 1)
        elif kind == "tree":
            T = 8  # the root and 7 children, each with a token the root's p gives 0
            parents = torch.tensor([[-1] + [0] * (T - 1)] * B, device=dev)
            tokens = torch.arange(T, device=dev).repeat(B, 1)
            p = torch.rand(B, T, V, generator=gen, device=dev)
            p[:, 0, :T] = 0.0
            p /= p.sum(-1, keepdim=True)
            q = None
            if stochastic:
                q = torch.rand(B, T, V, generator=gen, device=dev)
                q /= q.sum(-1, keepdim=True)
            u = torch.rand(B, T, generator=gen, device=dev)
            fn = lambda: ops.tree_speculative_sampling(tokens, parents, p, u, q)  # noqa: E731
            nbytes = B * V * 4 * ((3 * (T - 1) + 1) if stochastic else 3)
        else:
            T = 8
            parents = torch.tensor([[-1] + list(range(T - 1))] * B, device=dev)
            tokens = torch.randint(0, V, (B, T), generator=gen, device=dev)
            p = torch.rand(B, T, V, generator=gen, device=dev)
            p /= p.sum(-1, keepdim=True)
            u = torch.rand(B, T, generator=gen, device=dev)
            typical = TypicalAcceptance()
            fn = lambda: ops.tree_speculative_sampling(tokens, parents, p, u, typical=typical)  # noqa: E731
            nbytes = B * V * 4 * (T + 1)
        t = timer.us(fn)
        rate = nbytes / (t * 1e-6)
        rows.append([name, str(B), fmt(t), f"{nbytes / 1e6:.1f} MB", f"{rate / 1e9:.0f}",
                     f"{rate / HBM_BYTES_PER_S:.1%}"])
        report.write()


# --- 3. every op against its reference ----------------------------------------------------------


def ops_vs_reference(timer: Timer, report: Report, quick: bool) -> None:
    dev = timer.device
    V = 1000 if quick else 152064
    B = 2 if quick else 8
    rows = report.section(
        "Every op against its plain-PyTorch reference (same device)",
        "specdec.ops.reference runs one row at a time in Python (host-bound on a GPU): the "
        "baseline a user without the compiled ops would have.",
        ["op", "shape", "specdec", "reference", "speed-up"])
    gen = torch.Generator().manual_seed(0)
    to = lambda *ts: [None if t is None else t.to(dev) for t in ts]  # noqa: E731

    def chain(stochastic):
        p = random_probs(B, 9, V, gen=gen)
        q = random_probs(B, 8, V, gen=gen) if stochastic else None
        ids = drafts_from(p[:, :8] if q is None else q, gen)
        return to(q, ids, p, torch.rand(B, 9, generator=gen))

    def parents_of(T):
        return torch.tensor([random_parents(T, gen) for _ in range(B)])

    def tree(T, stochastic):
        parents = parents_of(T)
        p = random_probs(B, T, V, gen=gen)
        parent_p = torch.gather(p, 1, parents.clamp_min(0)[..., None].expand(B, T, V))
        tokens = drafts_from(parent_p, gen)
        q = random_probs(B, T, V, gen=gen) if stochastic else None
        return to(tokens, parents, p, torch.rand(B, T, generator=gen), q)

    H, Hkv, D, S, T = (4, 2, 32, 128, 8) if quick else (32, 8, 128, 4096, 16)

    def attention():
        q = torch.randn(1, H, T, D, generator=gen).to(torch.bfloat16)
        k = torch.randn(1, Hkv, S, D, generator=gen).to(torch.bfloat16)
        v = torch.randn(1, Hkv, S, D, generator=gen).to(torch.bfloat16)
        mask = ref.build_tree(torch.tensor([random_parents(T, gen)]))[0]
        return to(q, k, v, torch.tensor([S - T]), mask)

    def commit():
        L, Hkv, S, D, A = (2, 2, 64, 16, 4) if quick else (32, 8, 4096, 128, 8)
        ks = [torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16) for _ in range(L)]
        vs = [torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16) for _ in range(L)]
        lengths = torch.full((B,), S // 2, device=dev)
        src = lengths[:, None] + torch.arange(A, device=dev) * 2
        accept = torch.full((B,), A, device=dev)
        # Each call commits A entries; the lengths go back first, so every call does the same.
        def run(impl):
            def call():
                lengths.fill_(S // 2)
                impl.kv_commit(ks, vs, lengths, src, accept)
            return call
        return run

    def pool(filled: bool):
        C, N, M = (64, 3, 16) if quick else (4096, 4, 64)
        head = torch.full((B, V), -1)
        entries = torch.full((B, C, N + 1), -1)
        cursor = torch.zeros(B, dtype=torch.int64)
        ngrams = torch.randint(0, 50, (B, M, N), generator=gen)
        state = to(head, entries, cursor, ngrams)
        if filled:
            ops.ngram_pool_insert(*state, 4)
        return state

    cases = [
        ("chain_greedy_verify", f"logits B={B} K=8 V={V}",
         lambda: (lambda lg: to(lg[:, :8].argmax(-1), lg))(torch.randn(B, 9, V, generator=gen)),
         lambda impl, ids, lg: impl.chain_greedy_verify(ids, lg)),
        ("chain_speculative_sampling", f"q=1 B={B} K=8 V={V}", lambda: chain(False),
         lambda impl, q, ids, p, u: impl.chain_speculative_sampling(q, ids, p, u)),
        ("chain_speculative_sampling", f"draft probs B={B} K=8 V={V}", lambda: chain(True),
         lambda impl, q, ids, p, u: impl.chain_speculative_sampling(q, ids, p, u)),
        ("build_tree", f"B={B} T=64", lambda: to(parents_of(64)),
         lambda impl, parents: impl.build_tree(parents)),
        ("tree_verify_greedy", f"logits B={B} T=64 V={V}",
         lambda: to(torch.randint(0, V, (B, 64), generator=gen), parents_of(64),
                    torch.randn(B, 64, V, generator=gen)),
         lambda impl, tokens, parents, lg: impl.tree_verify_greedy(tokens, parents, lg)),
        ("tree_speculative_sampling", f"q=1 B={B} T=64 V={V}", lambda: tree(64, False),
         lambda impl, tokens, parents, p, u, q: impl.tree_speculative_sampling(tokens, parents, p, u)),
        ("tree_speculative_sampling", f"draft probs B={B} T=16 V={V}", lambda: tree(16, True),
         lambda impl, tokens, parents, p, u, q: impl.tree_speculative_sampling(tokens, parents, p, u, q)),
        ("tree_speculative_sampling", f"typical B={B} T=64 V={V}", lambda: tree(64, False),
         lambda impl, tokens, parents, p, u, q: impl.tree_speculative_sampling(
             tokens, parents, p, u, typical=TypicalAcceptance(0.09, 0.3) if impl is ops else (0.09, 0.3))),
        ("ngram_match", f"B={B} S=1024 k=10", lambda: to(torch.randint(0, 50, (B, 1024), generator=gen)),
         lambda impl, ctx: impl.ngram_match(ctx, None, 1, 3, 10)),
        ("ngram_pool_insert", f"B={B} V={V} 64 4-grams", lambda: pool(False),
         lambda impl, head, entries, cursor, ngrams: impl.ngram_pool_insert(head, entries, cursor, ngrams, 4)),
        ("ngram_pool_lookup", f"B={B} V={V} g=4", lambda: pool(True),
         lambda impl, head, entries, cursor, ngrams: impl.ngram_pool_lookup(head, entries, ngrams[:, 0, 0], 4)),
        ("tree_attention", f"bf16 B=1 H={H} Hkv={Hkv} D={D} S={S} T={T}", attention,
         lambda impl, q, k, v, prefix, mask: impl.tree_attention(q, k, v, prefix, mask)),
    ]
    for name, shape, make, call in cases:
        if timer.left() < 5:
            rows.append([name, shape, "(out of time)", "-", "-"])
            break
        args = make()
        ours = timer.us(lambda: call(ops, *args))
        theirs = timer.slow_us(lambda: call(ref, *args)) if timer.left() > 10 else None
        rows.append([name, shape, fmt(ours), fmt(theirs), "-" if theirs is None else times(theirs / ours)])
        report.write()
    run = commit()
    shape = "bf16 32 layers B=8 Hkv=8 D=128 A=8" if not quick else "quick"
    if timer.left() > 5:
        ours = timer.us(run(ops))
        theirs = timer.slow_us(run(ref)) if timer.left() > 10 else None
        rows.append(["kv_commit", shape, fmt(ours), fmt(theirs), "-" if theirs is None else times(theirs / ours)])
        report.write()


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="markdown file to write (rewritten after every case)")
    p.add_argument("--budget", type=float, default=40.0, help="seconds; cases not started after it are listed")
    p.add_argument("--quick", action="store_true", help="tiny shapes (checking the script itself)")
    args = p.parse_args()
    dev = device_or_exit(args.device)
    timer = Timer(dev, time.monotonic() + args.budget)
    report = Report(args.out, header(dev))
    failed = 0
    with torch.inference_mode():
        for part in (attention_vs_sdpa, sampling_bandwidth, ops_vs_reference):
            try:
                part(timer, report, args.quick)
            except Exception as e:  # noqa: BLE001 (the next table still runs)
                failed += 1
                print(f"FAIL: {part.__name__}: {type(e).__name__}: {e}", flush=True)
                report.sections.append((part.__name__, f"FAILED: {type(e).__name__}: {e}", ["-"], []))
    print(report.write(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
