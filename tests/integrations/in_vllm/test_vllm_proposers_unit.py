"""specdec's vLLM proposers step by step, on batches made by hand (a real VllmConfig, no engine):
options and their errors, the vLLM version check, one op call per n-gram length and step,
requests followed across rows. How drafts are sized: ../test_vllm_draft_sizing.py."""

import copy

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")

from specdec.integrations.vllm import prompt_lookup  # noqa: E402
from specdec.vllm import Lookahead, PromptLookup, check_vllm_version  # noqa: E402

K = 5


@pytest.fixture(scope="module")
def vllm_config(model_dir):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=model_dir, max_model_len=256, enforce_eager=True, speculative_config={
        "method": "custom_class", "model": "specdec.vllm.PromptLookup", "num_speculative_tokens": K,
    }).create_engine_config()


def with_options(vllm_config, **options):
    config = copy.copy(vllm_config)
    config.additional_config = {"specdec": options}
    return config


class Batch:
    """vLLM's per-step inputs of a custom proposer: rows of token ids and their lengths."""

    def __init__(self, *rows):
        self.token_ids = np.zeros((8, 256), dtype=np.int32)
        self.num_tokens = np.zeros(8, dtype=np.int32)
        for i, row in enumerate(rows):
            self.set(i, row)

    def set(self, i, row):
        self.token_ids[i, : len(row)] = row
        self.num_tokens[i] = len(row)

    def propose(self, proposer, sampled):
        return proposer.propose(sampled, self.num_tokens, self.token_ids)


def test_the_installed_vllm_is_a_tested_one_and_others_are_refused_by_version():
    check_vllm_version()
    for version in ("0.31.2", "0.33.0", "1.0.0"):
        with pytest.raises(RuntimeError, match=f"this is vLLM {version}: install a tested version"):
            check_vllm_version(version)


def test_an_untested_vllm_gets_an_error_naming_it(vllm_config, monkeypatch):
    monkeypatch.setattr(vllm, "__version__", "0.40.1")
    with pytest.raises(RuntimeError, match=r"tested with vLLM >=0.32,<0.33; this is vLLM 0.40.1"):
        PromptLookup(vllm_config)


def test_options_come_from_vllms_fields_and_additional_config(vllm_config):
    opts = Lookahead(with_options(vllm_config, ngram=3, max_ngram=5)).options
    assert (opts.num_speculative_tokens, opts.max_model_len, opts.vocab_size) == (K, 256, 49152)
    assert (opts.ngram, opts.max_ngram, opts.min_ngram) == (3, 5, 2)
    assert PromptLookup(vllm_config).options.max_ngram == 4  # the defaults alone work
    opts = PromptLookup(with_options(vllm_config, prompt_lookup_min=1, prompt_lookup_max=4)).options
    assert (opts.min_ngram, opts.max_ngram) == (1, 4)  # vLLM's names for them


@pytest.mark.parametrize("options, message", [
    ({"ngram_max": 4}, "unknown option 'ngram_max' in additional_config\\['specdec'\\]; its options are"),
    ({"ngram": 3}, "unknown option 'ngram'"),  # Lookahead's, not PromptLookup's
    ({"num_speculative_tokens": 3}, "'num_speculative_tokens' .* comes from vLLM's own configuration"),
    ({"max_ngram": "4"}, "option 'max_ngram' must be a int, got '4'"),
    ({"min_ngram": 3, "max_ngram": 2}, "need 1 <= min_ngram <= max_ngram"),
    ({"max_ngram": 3, "prompt_lookup_max": 4}, "both 'prompt_lookup_max' and 'max_ngram' .* the same option"),
])
def test_a_bad_option_is_named(vllm_config, options, message):
    with pytest.raises(ValueError, match=f"specdec.vllm.PromptLookup: {message}"):
        PromptLookup(with_options(vllm_config, **options))


def test_prompt_lookup_is_one_op_call_per_ngram_length_for_the_batch(vllm_config, monkeypatch):
    calls = []
    op = prompt_lookup.ops.ngram_match
    monkeypatch.setattr(prompt_lookup.ops, "ngram_match", lambda *a, **kw: calls.append(a[2]) or op(*a, **kw))
    proposer = PromptLookup(with_options(vllm_config, min_ngram=1, adaptive=False))  # row 1 matches one token
    batch = Batch([1, 2, 3, 4, 9, 1, 2], [7, 8, 7], [5, 6])
    drafts = batch.propose(proposer, [[2], [7], []])
    # row 0: [1, 2] first occurred at 0; row 1: [7] at 0; row 2 sampled nothing (a prefill chunk)
    assert drafts == [[3, 4, 9, 1, 2], [8, 7], []] and calls == [4, 3, 2, 1]


def test_lookahead_pools_follow_their_requests_across_rows(vllm_config):
    proposer = Lookahead(with_options(vllm_config, ngram=3, adaptive=False))
    a, b = [1, 2, 3, 4, 1], [1, 7, 8, 9, 1]
    batch = Batch(a, b)
    assert batch.propose(proposer, [[1], [1]]) == [[2, 3, 4, 1, 2], [7, 8, 9, 1, 7]]
    # vLLM accepted 1 draft token of each and condensed the batch the other way round
    batch = Batch(b + [7, 8], a + [2, 3])
    assert batch.propose(proposer, [[7, 8], [2, 3]]) == [[9, 1, 7, 8, 9], [4, 1, 2, 3, 4]]


def test_a_request_in_a_finished_requests_row_starts_with_its_own_pool(vllm_config):
    proposer = Lookahead(with_options(vllm_config, ngram=3, adaptive=False))
    assert Batch([5, 6, 7, 8, 5]).propose(proposer, [[5]]) == [[6, 7, 8, 5, 6]]
    # it finished; a new request takes row 0: the old pool's 7 -> [8, 5] must not show through
    assert Batch([9, 6, 7]).propose(proposer, [[7]]) == [[]]
    assert Batch([9, 6, 7, 9, 6, 7]).propose(proposer, [[6, 7]]) == [[9, 6, 7, 9, 6]]


def test_lookahead_goes_on_from_the_pool_where_the_copy_stops(vllm_config):
    lookahead = Lookahead(with_options(vllm_config, ngram=3, adaptive=False))
    copy = PromptLookup(with_options(vllm_config, adaptive=False))
    tokens = [1, 2, 3, 9, 1, 2]
    # [1, 2] first occurred at 0: the copy [3, 9, 1, 2] reaches the end of the text; the pool
    # knows 2 -> [3, 9] and goes on
    assert Batch(tokens).propose(copy, [[2]]) == [[3, 9, 1, 2]]
    assert Batch(tokens).propose(lookahead, [[2]]) == [[3, 9, 1, 2, 3]]
    assert Batch([1, 3, 9]).propose(lookahead, [[9]]) == [[]]  # neither has anything


@pytest.mark.parametrize("module", ["lookahead", "options", "rows", "version"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"specdec.integrations.vllm.{module}"))
    assert result.attempted > 0 and result.failed == 0
