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

from specdec import _C  # noqa: F401  (loads the library that registers the ops)
from specdec.ops import fakes  # noqa: F401  (registers the fake kernels)
from specdec.ops.attention import tree_attention
from specdec.ops.kv_cache import kv_commit
from specdec.ops.linear import linear
from specdec.ops.ngram import ngram_match, ngram_pool_insert, ngram_pool_lookup
from specdec.ops.ngram_pool import NGramPool
from specdec.ops.verification import (TypicalAcceptance, build_tree, chain_greedy_verify, chain_speculative_sampling,
                                      tree_speculative_sampling, tree_verify_greedy)

__all__ = [
    "NGramPool",
    "TypicalAcceptance",
    "build_tree",
    "chain_greedy_verify",
    "chain_speculative_sampling",
    "kv_commit",
    "linear",
    "ngram_match",
    "ngram_pool_insert",
    "ngram_pool_lookup",
    "tree_attention",
    "tree_speculative_sampling",
    "tree_verify_greedy",
]
