"""The runnable examples in the docstrings of the public modules."""

import doctest
import importlib

import pytest
import torch

MODULES = [
    "specdec", "specdec.ops", "specdec.ngram_pool", "specdec.cache", "specdec.tree_forward",
    "specdec.sampling", "specdec.cost_model", "specdec.models", "specdec.accelerate",
    "specdec.random_streams", "specdec.hf_integration", "specdec.decoders.base", "specdec.trees",
    "specdec.decoders.draft_tree",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
