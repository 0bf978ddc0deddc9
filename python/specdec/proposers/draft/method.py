"""`DraftModel`, the draft-model method: its settings, their defaults and checks, and the
reduced LM head it drafts with (the proposer is ``proposer``'s)."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import torch
from torch import Tensor

from specdec.renamed import take_aliases, warn_renamed
from specdec.proposers.draft.proposer import draft_proposer
from specdec.proposers.vocab import head_for_ids
from specdec.loop.protocol import Context, Method, StepResult


@dataclass
class DraftModel(Method):
    """Propose tokens of a smaller model sharing the target's tokenizer. By default
    (``adaptive``) the draft decides token by token, up to ``max_draft_tokens``: it stops when,
    from its confidence in the tokens drafted so far and the measured draft and target pass
    costs, one more token is not expected to raise the emitted tokens per unit of time
    (`CostModel.extend_pays`). Given ``num_draft_tokens`` (and not ``adaptive=True``), it
    proposes that many tokens every step.

    Names from other libraries are accepted: ``num_assistant_tokens`` (transformers) for
    ``num_draft_tokens``, ``num_speculative_tokens`` (vLLM) for ``max_draft_tokens``;
    ``head_tokens`` is the deprecated name of ``draft_vocab_size``.

    ``draft_vocab_size``: the draft scores only token ids ``0 .. draft_vocab_size - 1``, not the whole
    vocabulary. Byte-level BPE vocabularies (Qwen, Llama 3, GPT-2) number tokens in merge order,
    commonest first, so few good candidates are lost, while each draft token gets cheaper (at
    V = 152k the LM head is a quarter of a 0.5B model's weights). The target's output is
    unaffected: only what is proposed changes. The reduced head is a copy, made on first use.

    Sampling (``do_sample=True``): with ``coupled=True`` (default) the draft draws its token at
    position t with the same uniform the target's draw at t uses, so a candidate is accepted
    when the two draws agree; the output is then token for token what ``method=None`` emits
    with the same seed, whatever the draft lengths. ``coupled=False`` draws the draft's tokens
    on their own and verifies by rejection sampling with the draft's probabilities (lossless,
    accepts somewhat more when draft and target differ; reproducible for a fixed draft length,
    ``adaptive=False``).

    ``tree="dynamic"`` drafts a token tree instead of a chain (EAGLE-2's dynamic trees, as
    ``Medusa(tree="dynamic")``): each level expands the ``top_k`` most probable nodes of the one
    before (by the draft's cumulative probability of their paths) into their ``top_k`` most
    probable children, one draft pass per level over the ``top_k`` nodes, and the target
    verifies the most probable nodes of the whole tree, at most ``tree_nodes``. (``tree=k``, an
    int, is the deprecated spelling of ``tree="dynamic", top_k=k``.) With ``adaptive=True`` the measured pass costs decide how many levels
    (up to ``max_draft_tokens``) and how many nodes pay; else ``num_draft_tokens`` levels and
    ``tree_nodes`` nodes, and each step drafts the tree or the chain ``tree=None`` would (with its
    copies, ``lookup``), whichever has emitted more tokens per ms so far (measured per step, the
    chain's tokens on the tree's steps too: `specdec.loop.shape_choice`). Where the draft's first choice is
    wrong the target often takes its second, and the branch under it goes on. Sampling needs ``coupled=True`` (the branches are
    verified as deterministic candidates: exact, and seeded equal to ``method=None``).

    ``lookup=m`` (chains): each draft pass also feeds up to m tokens copied from the context
    (prompt lookup over the prompt, the output and this step's drafts) after the draft's latest
    token, and takes at once those the draft itself would have chosen next. The chain is the
    same as with ``lookup=0`` (the draft's argmax, or its coupled draws), drafted in fewer draft
    passes where the text repeats earlier text (code editing); the pass costs a little more
    than a one-token pass, and ``adaptive`` prices it for the copies the draft took in the
    passes before (on copied code a chain can then go on to ``max_draft_tokens``). Prompt lookup
    drafting for the draft (a cascade). Default (None): 8
    for the chains of a batch of one row with coupled draws (an adaptive tree's chain steps
    too), else 0 (a batch's draft pass would be as wide as its rows' copies together, and
    ``coupled=False`` needs its own draws).

    The draft must share the target's tokenizer. When the two vocabularies differ only by
    padding rows past the tokenizer (e.g. Qwen2.5 7B and 0.5B), pass ``shared_vocab=len(tokenizer)``:
    the draft then never proposes an id at or past it.

    Example (``draft`` and ``target`` are Hugging Face causal LMs)::

        out = specdec.generate(target, input_ids, method=specdec.DraftModel(draft))
        out = specdec.generate(target, input_ids, method=specdec.DraftModel(draft, tree="dynamic", top_k=3))
        out = specdec.generate(target, input_ids, method=specdec.DraftModel(draft, lookup=8))
        out = specdec.generate(target, input_ids, method=specdec.DraftModel(draft, num_draft_tokens=5))  # fixed
    """

    model: torch.nn.Module
    num_draft_tokens: int | None = None  # fixed length (default 5 where not adaptive)
    adaptive: bool | None = None          # default: True unless num_draft_tokens is given
    max_draft_tokens: int = 16
    draft_vocab_size: int | None = None
    coupled: bool = True
    shared_vocab: int | None = None
    tree: str | None = None  # None: a chain; "dynamic": a tree of the draft's top_k per node
    top_k: int = 4
    tree_nodes: int = 24
    lookup: int | None = None
    _head: tuple | None = field(default=None, init=False, repr=False, compare=False)
    num_assistant_tokens: InitVar[int | None] = None
    num_speculative_tokens: InitVar[int | None] = None
    head_tokens: InitVar[int | None] = None

    def __post_init__(self, num_assistant_tokens: int | None, num_speculative_tokens: int | None,
                      head_tokens: int | None) -> None:
        take_aliases(self, {"num_assistant_tokens": num_assistant_tokens,
                            "num_speculative_tokens": num_speculative_tokens, "head_tokens": head_tokens},
                     {"num_assistant_tokens": "num_draft_tokens", "num_speculative_tokens": "max_draft_tokens",
                      "head_tokens": "draft_vocab_size"}, deprecated={"head_tokens"})
        if self.adaptive is None:
            self.adaptive = self.num_draft_tokens is None
        if self.num_draft_tokens is None:
            self.num_draft_tokens = 5
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.adaptive and self.max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, got {self.max_draft_tokens}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size must be >= 1 or None, got {self.draft_vocab_size}")
        if self.shared_vocab is not None and self.shared_vocab < 1:
            raise ValueError(f"shared_vocab must be >= 1 or None, got {self.shared_vocab}")
        if isinstance(self.tree, int) and not isinstance(self.tree, bool):
            warn_renamed(f"DraftModel(tree={self.tree})", 'tree="dynamic", top_k=k (or tree=None for a chain)',
                         stacklevel=4)
            if self.tree < 1:
                raise ValueError(f"tree must be >= 1 (1: a chain), got {self.tree}")
            self.tree, self.top_k = ("dynamic", self.tree) if self.tree > 1 else (None, self.top_k)
        if self.tree not in (None, "dynamic"):
            raise ValueError(f'DraftModel: tree must be None (a chain) or "dynamic", got {self.tree!r}')
        if self.tree and self.top_k < 2:
            raise ValueError(f"DraftModel: a tree needs top_k >= 2 (1 is a chain), got {self.top_k}")
        if self.branches > 1 and self.tree_nodes < 1:
            raise ValueError(f"tree_nodes must be >= 1, got {self.tree_nodes}")
        if self.lookup is not None and self.lookup < 0:
            raise ValueError(f"lookup must be >= 0 (0: off) or None, got {self.lookup}")
        if self.lookup and self.branches > 1:
            raise ValueError("DraftModel(lookup=...) drafts chains: it needs tree=None")
        if self.lookup and not self.coupled:
            raise ValueError("DraftModel(lookup=...) takes copied tokens where the draft would have chosen "
                             "them: it needs coupled=True")
        if self.branches > 1 and not self.coupled:
            raise ValueError("DraftModel(tree=...) verifies its branches as deterministic candidates: "
                             "it needs coupled=True")

    @property
    def branches(self) -> int:
        """Children per expanded node: ``top_k`` for a tree, 1 for a chain."""
        return self.top_k if self.tree == "dynamic" else 1

    @property
    def depth(self) -> int:
        """Most draft tokens on a path (levels of a tree)."""
        return self.max_draft_tokens if self.adaptive else self.num_draft_tokens

    @property
    def max_pass_tokens(self) -> int:
        return 1 + (self.tree_nodes if self.branches > 1 else self.depth)

    def copied_tokens(self, rows: int) -> int:
        """Copied tokens per draft pass of a chain, for a batch of ``rows`` (``lookup``, or its
        default; also the chain an adaptive tree falls back to)."""
        if self.lookup is not None:
            return self.lookup
        return 8 if rows == 1 and self.coupled else 0

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        return (self.model,)

    def start(self, target, ctx: Context, prompt: Tensor, prompt_len: Tensor, max_length: int,
              first: StepResult):
        return draft_proposer([self], target, prompt, prompt_len, max_length, ctx.shared_prefixes, ctx.prefix_donors)

    def reduced_head(self) -> torch.nn.Module | None:
        """The draft's LM head over ids ``0 .. draft_vocab_size - 1`` (None without ``draft_vocab_size``),
        made once per head module and device."""
        if self.draft_vocab_size is None:
            return None
        lm_head = self.model.get_output_embeddings()
        key = (id(lm_head), str(self.model.device))
        if self._head is None or self._head[0] != key:
            self._head = (key, head_for_ids(lm_head, self.draft_vocab_size))
        return self._head[1]
