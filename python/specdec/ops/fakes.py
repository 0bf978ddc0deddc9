"""Fake kernels of every op, registered on import: they compute nothing (the ops only write
their out-arguments) and make the shape, dtype and device checks, so torch.compile reports a
wrong argument while tracing. Sizes may be symbolic: every comparison goes to torch._check_*."""

from __future__ import annotations

import torch

from specdec.ops.checks import (check_cache, check_device, check_index, check_index_like,
                                 check_out, check_pool_tables, check_probs, check_same_dtype,
                                 check_shape, check_target, check_tree_outputs, check_uniform,
                                 fail_unless)


@torch.library.register_fake("specdec::chain_speculative_sampling")
def _(draft_probs, draft_ids, target_probs, uniform, *, out_ids, accept_len):
    op = "chain_speculative_sampling"
    check_index(draft_ids, op, "draft_ids", 2)
    B, K = draft_ids.shape
    check_probs(target_probs, op, "target_probs", 3)
    check_shape(target_probs, op, "target_probs", (B, K + 1, None))
    V = target_probs.shape[2]
    fail_unless(V >= 1, op, "target_probs has an empty vocabulary")
    check_device(target_probs, draft_ids, op, "target_probs")
    if draft_probs is not None:
        check_probs(draft_probs, op, "draft_probs", 3)
        check_shape(draft_probs, op, "draft_probs", (B, K, V))
        check_same_dtype(draft_probs, target_probs, op, "draft_probs", "target_probs")
        check_device(draft_probs, draft_ids, op, "draft_probs")
    check_uniform(uniform, op, (B, K + 1))
    check_device(uniform, draft_ids, op, "uniform")
    check_out(out_ids, draft_ids, op, "out_ids", (B, K + 1), draft_ids.dtype)
    check_out(accept_len, draft_ids, op, "accept_len", (B,), draft_ids.dtype)


@torch.library.register_fake("specdec::chain_greedy_verify")
def _(draft_ids, target, *, out_ids, accept_len):
    op = "chain_greedy_verify"
    check_index(draft_ids, op, "draft_ids", 2)
    B, K = draft_ids.shape
    check_out(out_ids, draft_ids, op, "out_ids", (B, K + 1), draft_ids.dtype)
    check_out(accept_len, draft_ids, op, "accept_len", (B,), draft_ids.dtype)
    check_target(target, draft_ids, op, B, K + 1)


@torch.library.register_fake("specdec::build_tree")
def _(parents, *, tree_mask, depth, paths):
    op = "build_tree"
    check_index(parents, op, "parents", 2)
    B, T = parents.shape
    fail_unless(T >= 1, op, "parents needs at least the root node")
    check_out(tree_mask, parents, op, "tree_mask", (B, T, T), torch.bool)
    check_out(depth, parents, op, "depth", (B, T), parents.dtype)
    check_out(paths, parents, op, "paths", (B, None, None), parents.dtype)


@torch.library.register_fake("specdec::tree_verify_greedy")
def _(tree_tokens, parents, target, *, accept_path, accept_len, next_token):
    op = "tree_verify_greedy"
    B, T = check_tree_outputs(op, tree_tokens, parents, accept_path, accept_len, next_token)
    check_target(target, tree_tokens, op, B, T)


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
    B, T = check_tree_outputs(op, tree_tokens, parents, accept_path, accept_len, next_token)
    check_probs(target_probs, op, "target_probs", 3)
    check_shape(target_probs, op, "target_probs", (B, T, None))
    V = target_probs.shape[2]
    fail_unless(V >= 1, op, "target_probs has an empty vocabulary")
    check_device(target_probs, tree_tokens, op, "target_probs")
    check_uniform(uniform, op, (B, T))
    check_device(uniform, tree_tokens, op, "uniform")
    if draft_probs is not None:
        fail_unless(posterior_threshold is None, op,
                     "typical acceptance (posterior_threshold) takes no draft_probs")
        check_probs(draft_probs, op, "draft_probs", 3)
        check_shape(draft_probs, op, "draft_probs", (B, T, V))
        check_same_dtype(draft_probs, target_probs, op, "draft_probs", "target_probs")
        check_device(draft_probs, tree_tokens, op, "draft_probs")
    if posterior_threshold is not None:
        fail_unless(0.0 <= posterior_threshold <= 1.0, op,
                     f"posterior_threshold must be in [0, 1], got {posterior_threshold}")
        fail_unless(posterior_alpha >= 0.0, op,
                     f"posterior_alpha must be >= 0, got {posterior_alpha}")


@torch.library.register_fake("specdec::ngram_match")
def _(context, context_len, min_n, max_n, earliest=False, *, draft, draft_len):
    op = "ngram_match"
    check_index(context, op, "context", 2)
    B = context.shape[0]
    check_index_like(context_len, context, op, "context_len", "context", (B,))
    fail_unless(min_n >= 1, op, f"min_n must be >= 1, got {min_n}")
    fail_unless(max_n >= min_n, op, f"max_n ({max_n}) must be >= min_n ({min_n})")
    check_out(draft, context, op, "draft", (B, None), context.dtype)
    check_out(draft_len, context, op, "draft_len", (B,), context.dtype)



@torch.library.register_fake("specdec::ngram_pool_insert")
def _(head, entries, cursor, ngrams, g):
    op = "ngram_pool_insert"
    B, N = check_pool_tables(op, head, entries)
    check_index_like(cursor, head, op, "cursor", "head", (B,))
    fail_unless(cursor.is_contiguous(), op, "cursor must be contiguous")
    check_index_like(ngrams, head, op, "ngrams", "head", (B, None, N))
    fail_unless(g >= 1, op, f"g must be >= 1, got {g}")


@torch.library.register_fake("specdec::ngram_pool_lookup")
def _(head, entries, last_ids, *, candidates, count):
    op = "ngram_pool_lookup"
    B, N = check_pool_tables(op, head, entries)
    check_index_like(last_ids, head, op, "last_ids", "head", (B,))
    check_out(candidates, head, op, "candidates", (B, None, N - 1), head.dtype)
    check_out(count, head, op, "count", (B,), head.dtype)


@torch.library.register_fake("specdec::tree_attention")
def _(q, k_cache, v_cache, prefix_len, tree_mask=None, scale=None, *, out):
    op = "tree_attention"
    check_probs(q, op, "q", 4)
    B, H, T, D = q.shape
    for size in (H, T, D):
        fail_unless(size >= 1, op, f"q must have H, T and D >= 1, got shape {list(q.shape)}")
    for t, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        check_probs(t, op, name, 4)
        check_same_dtype(t, q, op, name, "q")
        check_device(t, q, op, name)
        fail_unless(t.stride(3) == 1, op,
                     f"{name} must be contiguous in its last (head) dimension")
    check_shape(k_cache, op, "k_cache", (B, None, None, D))
    Hkv, S = k_cache.shape[1], k_cache.shape[2]

    def heads() -> str:
        return f"the {H} query heads of q must be a multiple of the {Hkv} heads of k_cache"

    fail_unless(Hkv >= 1, op, heads)  # first: H % 0 would raise ZeroDivisionError
    fail_unless(H % Hkv == 0, op, heads)
    fail_unless(S >= T, op,
                 lambda: f"k_cache holds {S} positions, fewer than the {T} tokens of q")
    check_shape(v_cache, op, "v_cache", (B, Hkv, S, D))
    check_index(prefix_len, op, "prefix_len", 1)
    check_shape(prefix_len, op, "prefix_len", (B,))
    check_device(prefix_len, q, op, "prefix_len")
    if tree_mask is not None:
        fail_unless(tree_mask.dtype == torch.bool, op,
                     lambda: f"tree_mask must be bool, got {tree_mask.dtype}", torch._check_type)
        check_shape(tree_mask, op, "tree_mask", (B, T, T))
        check_device(tree_mask, q, op, "tree_mask")
    check_out(out, q, op, "out", (B, H, T, D), q.dtype)


@torch.library.register_fake("specdec::kv_commit")
def _(k_caches, v_caches, lengths, src_pos, accept_len):
    op = "kv_commit"
    fail_unless(len(k_caches) >= 1, op, "k_caches is empty")
    fail_unless(len(v_caches) == len(k_caches), op,
                 f"k_caches has {len(k_caches)} layers but v_caches has {len(v_caches)}")
    k0, v0 = k_caches[0], v_caches[0]
    check_cache(k0, op, "k_caches", 4)
    B, S = k0.shape[0], k0.shape[2]
    check_cache(v0, op, "v_caches", 4)
    check_shape(v0, op, "v_caches", (B, None, S, None))
    for caches, ref, name in ((k_caches, k0, "k_caches"), (v_caches, v0, "v_caches")):
        for c in caches:
            check_same_dtype(c, k0, op, name, "k_caches[0]")
            check_device(c, k0, op, name)
            check_shape(c, op, name, tuple(ref.shape))
            fail_unless(c.is_contiguous(), op, f"every tensor of {name} must be contiguous")
    check_index(lengths, op, "lengths", 1)
    check_shape(lengths, op, "lengths", (B,))
    check_device(lengths, k0, op, "lengths")
    fail_unless(lengths.is_contiguous(), op, "lengths must be contiguous")
    check_index(src_pos, op, "src_pos", 2)
    check_shape(src_pos, op, "src_pos", (B, None))
    check_same_dtype(src_pos, lengths, op, "src_pos", "lengths")
    check_device(src_pos, k0, op, "src_pos")
    check_index(accept_len, op, "accept_len", 1)
    check_shape(accept_len, op, "accept_len", (B,))
    check_same_dtype(accept_len, lengths, op, "accept_len", "lengths")
    check_device(accept_len, k0, op, "accept_len")


@torch.library.register_fake("specdec::linear")
def _(x, weight, bias=None, *, out):
    op = "linear"
    fail_unless(x.dtype in (torch.float32, torch.bfloat16), op,
                lambda: f"x must be float32 or bfloat16, got {x.dtype}", torch._check_type)
    fail_unless(x.dim() == 2, op, lambda: f"x must have 2 dimensions, got shape {list(x.shape)}")
    check_same_dtype(weight, x, op, "weight", "x")
    fail_unless(weight.dim() == 2, op, lambda: f"weight must have 2 dimensions, got shape {list(weight.shape)}")
    M, K = x.shape
    N = weight.shape[0]
    check_shape(weight, op, "weight", (N, K))
    check_device(weight, x, op, "weight")
    fail_unless(weight.is_contiguous(), op, "weight must be contiguous")
    if bias is not None:
        check_same_dtype(bias, x, op, "bias", "x")
        fail_unless(bias.dim() == 1, op, lambda: f"bias must have 1 dimensions, got shape {list(bias.shape)}")
        check_shape(bias, op, "bias", (N,))
        check_device(bias, x, op, "bias")
    check_out(out, x, op, "out", (M, N), x.dtype)
