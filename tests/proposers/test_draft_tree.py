"""Token trees from a draft model (`DraftModel(tree=k)`): the tree grown level by level against a
plain-Python expansion, the draft's cache after each step, greedy identity, and bad arguments.
The sampling distribution and seeded equality with one-token decoding are in test_decoders and
test_verify_loop (their method lists include trees)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from support.decoding import assert_greedy_identity, hf_greedy, PROMPTS
from support.models import perturbed, tiny_lm

import specdec
from specdec.model.cache import SpecCache
from specdec.loop.cost_model import CostModel
from specdec.proposers.draft.tree import Calibration, grow, select
from specdec.loop.protocol import Context, Proposal
from specdec.loop.sampling import Sampling
from specdec.model.attention import enable_tree_attention
from specdec.model.forward import tree_forward
from specdec.model.prefill import prefill


def fake_logp(path: tuple[int, ...], vocab: int) -> torch.Tensor:
    """A fixed next-token distribution for every path (no ties)."""
    g = torch.Generator().manual_seed(hash(path) % (2**31))
    return (torch.randn(vocab, generator=g) * 2).log_softmax(-1)


def reference_tree(k: int, depth: int, n: int, vocab: int) -> dict[tuple[int, ...], float]:
    """EAGLE-2's expansion in plain Python: per level the k best nodes (by path score) each get
    their k best children; then the n best nodes of all levels. Path -> score."""
    nodes: dict[tuple[int, ...], float] = {}
    frontier = [((), 0.0)]
    for _ in range(depth):
        level = {}
        for path, score in frontier:
            logp = fake_logp(path, vocab)
            for t in logp.topk(k).indices.tolist():
                level[path + (t,)] = score + float(logp[t])
        nodes.update(level)
        frontier = sorted(level.items(), key=lambda kv: -kv[1])[:k]
    return dict(sorted(nodes.items(), key=lambda kv: -kv[1])[:n])


@pytest.mark.parametrize("k, depth, n", [(2, 3, 6), (3, 4, 11), (4, 2, 20)])
def test_grown_tree_is_eagle2_expansion_over_what_each_node_sees(k, depth, n):
    # The fake draft computes each node's distribution from the tokens its attention mask lets
    # it see (its fed ancestors and itself): a wrong mask, slot or order changes the tree.
    B, vocab = 2, 40
    fed: list[torch.Tensor] = []       # [B] token of every fed slot
    positions_seen = []

    def feed(tokens, mask, positions, pending, parent_slot):
        assert pending == len(fed) and mask.shape == (B, tokens.shape[1], pending + tokens.shape[1])
        # Each node's parent: the root (-1) on the first level, else a slot fed before it that its mask sees.
        seen = torch.gather(mask, 2, parent_slot.clamp_min(0)[..., None])[..., 0]
        assert bool(((parent_slot == -1) == (pending == 0)).all()) and bool((seen | (parent_slot < 0)).all())
        assert bool((parent_slot < pending).all())
        fed.extend(tokens.unbind(1))
        positions_seen.append(positions)
        out = torch.empty(B, tokens.shape[1], vocab)
        for b in range(B):
            for i in range(tokens.shape[1]):
                path = tuple(int(fed[s][b]) for s in range(len(fed)) if mask[b, i, s])
                out[b, i] = fake_logp(path, vocab)
        return out

    lengths = torch.tensor([7, 4])
    ctx = Context(torch.zeros(B, 16, dtype=torch.long), lengths, torch.zeros(B, dtype=torch.bool), Sampling(),
                  None, CostModel())
    first = fake_logp((), vocab).expand(B, vocab)
    tree, count, passes = grow(first, feed, k, depth, n, ctx, adaptive=False)
    assert passes == depth and len(positions_seen) == depth - 1
    for d, pos in enumerate(positions_seen, start=1):  # level d sits at root + d
        assert torch.equal(pos, (lengths - 1 + d)[:, None].expand_as(pos))
    want = reference_tree(k, depth, n, vocab)
    assert count == len(want)
    proposal, slots, first, _ = select(tree, count, ctx.roots())
    for b in range(B):
        par, toks = proposal.parents[b].tolist(), proposal.tokens[b].tolist()
        got = {}
        for i in range(1, count + 1):
            assert 0 <= par[i] < i  # parents first: a valid tree under the root
            path, j = [], i
            while j:
                path.append(toks[j])
                j = par[j]
            got[tuple(path[::-1])] = i
        assert set(got) == set(want)
        # A node fed to the draft has its slot; its token is the one written there.
        for path, i in got.items():
            if slots[b, i] >= 0:
                assert int(fed[int(slots[b, i])][b]) == path[-1]
        assert int((slots[b] >= 0).sum()) > 0
        # A node is its parent's first choice where its token is the draft's argmax there (the
        # chain a chain drafter drafts runs along these).
        for path, i in got.items():
            assert bool(first[b, i]) == (path[-1] == int(fake_logp(path[:-1], vocab).argmax()))
        assert not first[b, 0]


def test_calibration_counts_the_nodes_the_target_tried():
    # Nodes 1 and 2 are the root's children, node 3 node 1's, node 4 node 2's; the target
    # accepted node 1 and rejected node 3: nodes 1, 2 and 3 were tried (their parent was
    # accepted), node 4 was not. Scores were drafted with a log-scale of log(0.5); what is
    # counted is the drafter's own probability of each tried node given its parent.
    half = math.log(0.5)
    cond = torch.tensor([0.5, 0.3, 0.4, 0.9]).log() + half
    score = torch.tensor([[0.0, cond[0], cond[1], cond[0] + cond[2], cond[1] + cond[3]]])
    proposal = Proposal(torch.tensor([[9, 1, 2, 3, 4]]), torch.tensor([[-1, 0, 0, 1, 2]]))
    cal = Calibration(prior=1.0, decay=1.0)
    cal.drafted(proposal, score, half)
    cal.verified(torch.tensor([[0, 1, -1, -1]]), torch.tensor([True]))
    assert float(cal.accepted) == 1.0 and float(cal.predicted) == pytest.approx(1.2)
    cal.verified(torch.tensor([[0, 1, -1, -1]]), torch.tensor([True]))  # nothing drafted since: nothing counted
    cal.drafted(proposal, score, half)
    cal.verified(torch.tensor([[0, 1, -1, -1]]), torch.tensor([False]))  # a finished row
    assert float(cal.predicted) == pytest.approx(1.2)
    assert math.exp(cal.log_scale) == pytest.approx(2 / 2.2)
    assert Calibration(accepted=9.0, predicted=1.0).log_scale == 0.0  # underconfident: not taken


def test_calibrated_scores_verify_fewer_nodes_where_the_drafter_overstates():
    # A first choice the drafter gives 0.6: at these costs verifying it pays (1.6 tokens for
    # 135 ms against 1 for 105); at a quarter of that (0.15) it does not, and the step verifies
    # nothing.
    ctx = Context(torch.zeros(1, 8, dtype=torch.long), torch.tensor([4]), torch.zeros(1, dtype=torch.bool),
                  Sampling(), None, CostModel({1: 100.0, 2: 130.0, 4: 200.0}, draft_ms_per_token=5.0))
    first = torch.tensor([[0.6, 0.25, 0.1, 0.05]]).log()
    feed = None  # one level: no draft pass after the first

    def verified(log_scale: float) -> int:
        return grow(first, feed, 2, 1, 4, ctx, adaptive=True, log_scale=log_scale)[1]

    assert verified(0.0) == 1 and verified(math.log(0.25)) == 0


def test_pending_nodes_are_seen_as_the_mask_says(device):
    # A tree fed in two calls: the second level's nodes see the first level's uncommitted
    # entries through the mask; every node's logits equal a plain forward over its path.
    torch.manual_seed(0)
    plain = tiny_lm("qwen2", seed=3).to(device)
    model = copy.deepcopy(plain)
    enable_tree_attention(model)
    cache = SpecCache.for_model(model, 2, 48)
    lens = torch.tensor([9, 5], device=device)
    prompts = torch.randint(0, 60, (2, 9), device=device)
    with torch.no_grad():
        prefill(model, cache, prompts, lens)
        level1 = torch.tensor([[11, 12, 13], [14, 15, 16]], device=device)
        pos1 = (lens[:, None] + torch.zeros(1, 3, dtype=torch.long, device=device))
        eye = torch.eye(3, dtype=torch.bool, device=device).expand(2, 3, 3)
        out1 = tree_forward(model, cache, level1, attention_mask=eye, position_ids=pos1)
        # Children of level-1 nodes 2 and 0 (row 0) and 1 and 1 (row 1).
        level2 = torch.tensor([[21, 22], [23, 24]], device=device)
        parent = [[2, 0], [1, 1]]
        mask = torch.zeros(2, 2, 5, dtype=torch.bool, device=device)
        for b in range(2):
            for i in range(2):
                mask[b, i, parent[b][i]] = mask[b, i, 3 + i] = True
        out2 = tree_forward(model, cache, level2, attention_mask=mask, position_ids=pos1[:, :2] + 1, pending=3)
        assert torch.equal(cache.lengths, lens)  # nothing committed
        for b in range(2):
            prefix = prompts[b, : lens[b]].tolist()
            for i in range(3):
                want = plain(torch.tensor([prefix + [int(level1[b, i])]], device=device)).logits[0, -1]
                torch.testing.assert_close(out1[b, i], want, atol=1e-4, rtol=0)
            for i in range(2):
                seq = prefix + [int(level1[b, parent[b][i]]), int(level2[b, i])]
                want = plain(torch.tensor([seq], device=device)).logits[0, -1]
                torch.testing.assert_close(out2[b, i], want, atol=1e-4, rtol=0)
        with pytest.raises(ValueError, match="pending nodes need"):
            tree_forward(model, cache, level2, pending=3)
        with pytest.raises(ValueError, match=r"bool \[2, 2, 5\]"):
            tree_forward(model, cache, level2, attention_mask=mask[..., :4], position_ids=pos1[:, :2], pending=3)


class CheckedCache(specdec.DraftModel):
    """A DraftModel whose draft cache is compared, after every step, with a fresh prefill of
    the committed tokens it should hold."""

    def start(self, target, ctx, prompt, prompt_len, max_length, first):
        proposer = super().start(target, ctx, prompt, prompt_len, max_length, first)
        update, self.moved = proposer.update, 0

        def checked(ctx, step):
            before = proposer.cache.lengths.clone()
            update(ctx, step)
            cache = proposer.cache
            self.moved += int((cache.lengths > before).sum())  # tree entries moved into place
            for b in range(ctx.lengths.shape[0]):
                n = int(cache.lengths[b])
                fresh = SpecCache.for_model(self.model, 1, n + 1)
                prefill(self.model, fresh, ctx.tokens[b:b + 1, :n])
                for layer, ref in zip(cache.layers, fresh.layers):
                    torch.testing.assert_close(layer.keys[b, :, :n], ref.keys[0, :, :n], atol=1e-4, rtol=0)
                    torch.testing.assert_close(layer.values[b, :, :n], ref.values[0, :, :n], atol=1e-4, rtol=0)

        proposer.update = checked
        return proposer


def test_draft_cache_holds_the_committed_tokens_after_every_step():
    target = tiny_lm("llama", seed=6)
    method = CheckedCache(perturbed(target, 0.05, 2), 4, tree="dynamic", top_k=3)
    assert_greedy_identity(target, PROMPTS, method, max_new=16)
    assert method.moved > 0


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("tree, adaptive", [(2, False), (3, True)])
def test_greedy_identity_batch_ragged_with_eos(family, tree, adaptive, device):
    target = tiny_lm(family, seed=1)
    draft = perturbed(target, 0.05, seed=5).to(device)
    target = target.to(device)
    eos = hf_greedy(target, PROMPTS[2], 24)[7]
    method = specdec.DraftModel(draft, 4, adaptive=adaptive, tree=tree)
    out = assert_greedy_identity(target, PROMPTS, method, eos=eos)
    assert out.stats.total_accepted > 0
    assert_greedy_identity(target, PROMPTS[:1], method)  # batch 1


def test_tree_takes_fewer_passes_than_the_chain():
    # The same draft and depth: where the draft's first choice is wrong the target often takes
    # its second, which the tree verifies too (greedy and fixed sizes: deterministic).
    target = tiny_lm("qwen2", seed=1)
    draft = perturbed(target, 0.05, seed=5)
    chain = assert_greedy_identity(target, PROMPTS, specdec.DraftModel(draft, 4))
    tree = assert_greedy_identity(target, PROMPTS, specdec.DraftModel(draft, 4, tree="dynamic", top_k=3, tree_nodes=12))
    assert tree.stats.target_forwards < chain.stats.target_forwards
    assert max(int(p.max()) for p in tree.stats.proposed) <= 12


def test_trees_in_ensembles_and_with_a_reduced_head():
    target = tiny_lm("llama", seed=8)
    draft = perturbed(target, 0.05, seed=3)
    for method in (specdec.DraftModel(draft, 3, tree="dynamic", top_k=2, draft_vocab_size=40),
                   specdec.Ensemble(specdec.PromptLookup(), specdec.DraftModel(draft, 3, tree="dynamic", top_k=3)),
                   specdec.Ensemble(specdec.DraftModel(draft, 3, tree="dynamic", top_k=2),
                                    specdec.DraftModel(perturbed(draft, 0.05, seed=4), 3), mix="average")):
        out = assert_greedy_identity(target, PROMPTS, method)
        assert out.stats.total_accepted > 0


def test_bad_arguments():
    draft = tiny_lm("llama", seed=0)
    with pytest.raises(ValueError, match='tree must be None \\(a chain\\) or "dynamic"'):
        specdec.DraftModel(draft, tree="static")
    with pytest.raises(ValueError, match="top_k >= 2"):
        specdec.DraftModel(draft, tree="dynamic", top_k=1)
    with pytest.raises(ValueError, match="tree_nodes must be >= 1"):
        specdec.DraftModel(draft, tree="dynamic", top_k=2, tree_nodes=0)
    with pytest.raises(ValueError, match="needs coupled=True"):
        specdec.DraftModel(draft, tree="dynamic", top_k=2, coupled=False)
