"""Prefill: prompts run through the model and committed to a SpecCache, in length groups and
after shared prefixes computed once, or copied from another cache's rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from specdec.model.cache import SpecCache
from specdec.model.forward import PassOutput, forward_pass
from specdec.model.prompt_plan import PASS_TOKENS, SharedPrefix, length_groups, prefix_offsets


def prefill(model: PreTrainedModel, cache: SpecCache, tokens: Tensor, lengths: Tensor | None = None,
            head: Callable[[Tensor], Tensor] | None = None, *, shared: Sequence[SharedPrefix] = (),
            pass_tokens: int = 0, cached: Tensor | None = None) -> Tensor:
    """The logits of :func:`prefill_pass` (the same arguments; no hidden states): ``[B, V]``."""
    return prefill_pass(model, cache, tokens, lengths, head, shared=shared, pass_tokens=pass_tokens,
                        cached=cached).logits


@torch.no_grad()
def prefill_pass(
    model: PreTrainedModel,
    cache: SpecCache,
    tokens: Tensor,
    lengths: Tensor | None = None,
    head: Callable[[Tensor], Tensor] | None = None,
    return_hidden: bool = False,
    shared: Sequence[SharedPrefix] = (),
    pass_tokens: int = 0,
    cached: Tensor | None = None,
    inputs_embeds: Tensor | None = None,
    all_hidden: bool = False,
) -> PassOutput:
    """Runs right-padded prompts ``tokens[b, :lengths[b]]`` after each row's cached prefix and
    commits them; returns ``PassOutput``: the logits after every prompt's last token, ``[B, V]``
    (and with ``return_hidden`` the final hidden state there, ``[B, H]``).

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
        inputs_embeds: ``[B, N, H]`` the decoder's inputs in place of the tokens' embeddings
            (`forward_pass`); not with ``shared`` or ``cached``.
        all_hidden: with ``return_hidden``, the final hidden state at every prompt token
            ``[B, N, H]`` (zeros past each row's length), shared prefixes' included; not with
            ``cached``.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from specdec.model.attention import enable_tree_attention
        >>> from specdec.model.prompt_plan import prefix_donors, shared_prefixes
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
    if inputs_embeds is not None and (shared or cached is not None):
        raise ValueError("specdec.prefill: inputs_embeds run whole prompts: not with shared or cached")
    if all_hidden and cached is not None:
        raise ValueError("specdec.prefill: all_hidden computes every prompt token: not with cached")
    offsets = prefix_offsets(shared, B, tokens.device) if shared else cached
    if offsets is not None and bool((offsets >= lengths).any()):
        raise ValueError("specdec.prefill: a shared prefix (or a cached one) must end before its row's prompt does")
    prefix_hidden = []  # with all_hidden: each shared prefix's hidden states [n, H]
    for group in shared:
        n = group.length
        one = SpecCache(model.config, 1, n, cache.layers[0].keys.dtype, cache.lengths.device)
        first = tokens[group.rows[0], :n][None]
        out = forward_pass(model, one, first, keep=torch.tensor([n - 1], device=tokens.device), head=head,
                           return_hidden=all_hidden, all_hidden=all_hidden)
        prefix_hidden.append(out.hidden)
        one.advance(torch.tensor([n]))
        cache.copy_row(one, torch.tensor(group.rows, device=cache.lengths.device))
    if offsets is not None:
        # Each row's rest, moved to the front (right-padded again).
        columns = torch.arange(N, device=tokens.device)
        tokens = torch.gather(tokens, 1, (offsets[:, None] + columns).clamp_max(N - 1))
        lengths = lengths - offsets
        tokens = tokens[:, : int(lengths.max())]
    out = _prefill_rests(model, cache, tokens, lengths, head, return_hidden, inputs_embeds, all_hidden, pass_tokens)
    if not (all_hidden and shared):
        return out
    # Every prompt token's hidden state: the shared prefix's, then the row's rest after it.
    H = out.hidden.shape[-1]
    hidden = out.hidden.new_zeros(B, N, H)
    for group, prefix in zip(shared, prefix_hidden):
        hidden[list(group.rows), : group.length] = prefix[0]
    rel = torch.arange(N, device=tokens.device) - offsets[:, None]  # position in the row's rest
    rest = torch.gather(out.hidden, 1, rel.clamp(0, out.hidden.shape[1] - 1)[..., None].expand(B, N, H))
    inside = (rel >= 0) & (rel < lengths[:, None])
    return PassOutput(out.logits, torch.where(inside[..., None], rest, hidden))


def _prefill_rests(model: PreTrainedModel, cache: SpecCache, tokens: Tensor, lengths: Tensor,
                   head: Callable[[Tensor], Tensor] | None, return_hidden: bool, inputs_embeds: Tensor | None,
                   all_hidden: bool, pass_tokens: int) -> PassOutput:
    """`_prefill_rows` in one pass, or in passes over rows of similar lengths (``pass_tokens``)."""
    N = tokens.shape[1]
    groups = length_groups(lengths, pass_tokens) if pass_tokens else [None]
    if len(groups) == 1:
        return _prefill_rows(model, cache, tokens, lengths, head, return_hidden, inputs_embeds, all_hidden)
    outs = []
    for rows in groups:  # each group in a cache of its rows, copied back into theirs
        rows = rows.to(tokens.device)
        n = int(lengths[rows].max())
        part = cache.rows_of(rows, int(cache.lengths[rows].max()) + n)
        embeds = None if inputs_embeds is None else inputs_embeds[rows, :n]
        outs.append(_prefill_rows(model, part, tokens[rows, :n], lengths[rows], head, return_hidden, embeds,
                                  all_hidden))
        cache.copy_row(part, rows)
    order = torch.cat(groups).to(tokens.device).argsort()  # back to the rows' own order
    hidden = None
    if return_hidden:  # every prompt token's: padded to the longest group's
        hidden = torch.cat([F.pad(o.hidden, (0, 0, 0, N - o.hidden.shape[1])) if all_hidden else o.hidden
                            for o in outs])[order]
    return PassOutput(torch.cat([o.logits for o in outs])[order], hidden)


@torch.no_grad()
def prefill_from(model: PreTrainedModel, cache: SpecCache, source: SpecCache, donor: Tensor, reused: Tensor,
                 tokens: Tensor, lengths: Tensor, head: Callable[[Tensor], Tensor] | None = None,
                 return_hidden: bool = False) -> PassOutput:
    """`prefill_pass` of right-padded prompts ``tokens [k, N]`` (``lengths``) into the empty ``cache``,
    the first ``reused[j]`` entries of row j copied from row ``donor[j]`` of ``source`` (-1: none;
    `prefix_donors` finds them) and only the rest computed, in passes grouped by length.

    Example (the second prompt starts as row 1 of a batch already prefilled):
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from specdec.model.attention import enable_tree_attention
        >>> from specdec.model.prompt_plan import prefix_donors, shared_prefixes
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
        >>> logits = prefill_from(model, copied, batch, donor, reused, joining, torch.tensor([2, 3])).logits
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
    return prefill_pass(model, cache, tokens, lengths, head=head, return_hidden=return_hidden,
                        pass_tokens=PASS_TOKENS, cached=reused)


def _prefill_rows(model: PreTrainedModel, cache: SpecCache, tokens: Tensor, lengths: Tensor,
                  head: Callable[[Tensor], Tensor] | None, return_hidden: bool, inputs_embeds: Tensor | None = None,
                  all_hidden: bool = False) -> PassOutput:
    """One pass over right-padded ``tokens [B, N]`` (``lengths [B]``), committed; the logits
    (and hidden states) after each row's last token (every token's hidden states with
    ``all_hidden``, zeros past each row's length)."""
    B, N = tokens.shape
    last = (lengths.to(torch.int64) - 1).clamp_min(0).to(tokens.device)
    # The LM head runs only where some row's prompt ends, not over every prompt token.
    columns = torch.unique(last)
    out = forward_pass(model, cache, tokens, keep=columns, head=head, return_hidden=return_hidden,
                       inputs_embeds=inputs_embeds, all_hidden=all_hidden)
    cache.advance(lengths)
    rows, cols = torch.arange(B, device=tokens.device), torch.searchsorted(columns, last)
    hidden = out.hidden
    if hidden is not None:
        hidden = (hidden * (torch.arange(N, device=tokens.device) < lengths.to(tokens.device)[:, None])[..., None]
                  if all_hidden else hidden[rows, cols])
    return PassOutput(out.logits[rows, cols], hidden)
