"""The runnable examples in the docstrings of the public modules."""

import doctest
import importlib

import pytest
import torch

MODULES = [
    "specdec", "specdec.ops.verification", "specdec.ops.ngram", "specdec.ops.attention", "specdec.ops.kv_cache", "specdec.ops.ngram_pool", "specdec.model.cache", "specdec.model.forward", "specdec.model.prefill", "specdec.model.prompt_plan",
    "specdec.loop.sampling", "specdec.loop.cost_model", "specdec.models", "specdec.model.prepare",
    "specdec.loop.random_streams", "specdec.integrations.hf", "specdec.loop.generate", "specdec.proposers.medusa.trees", "specdec.proposers.merge",
    "specdec.proposers.draft.tree", "specdec.proposers.vocab", "specdec.training.corpus",
    "specdec.training.features",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
