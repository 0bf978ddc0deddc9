"""specdec's proposers inside vLLM: greedy output identical to vLLM without speculation."""

import pytest

pytest.importorskip("vllm")

from vllm_engines import MAX_TOKENS, Run, engine, run  # noqa: E402


@pytest.fixture(scope="module", params=["PromptLookup", "Lookahead"])
def speculative(request, model_dir) -> Run:
    # Fixed prices (timed=False): measured ones change the drafts with the machine's load, and
    # test_drafts_are_accepted must not (DraftSizer's timing has its own tests, with a clock).
    return run(model_dir, {"method": "custom_class", "model": f"specdec.vllm.{request.param}",
                           "num_speculative_tokens": 6}, additional_config={"specdec": {"timed": False}})


def test_one_request_at_a_time_is_identical(speculative, plain):
    assert [len(s) for s in plain.singles] == MAX_TOKENS
    for i, (ours, theirs) in enumerate(zip(speculative.singles, plain.singles)):
        assert ours == theirs, f"prompt {i}: first mismatch at token {_first_mismatch(ours, theirs)}"


def test_a_batch_with_joins_finishes_and_preemptions_is_identical(speculative, plain):
    assert speculative.metrics["vllm:num_preemptions"] > 0  # the small KV cache did preempt
    for i, (ours, theirs) in enumerate(zip(speculative.batch, plain.batch)):
        assert ours == theirs, f"prompt {i}: first mismatch at token {_first_mismatch(ours, theirs)}"


def test_drafts_are_accepted(speculative):
    assert speculative.metrics["vllm:spec_decode_num_drafts"] > 0
    # Far above chance (1 in 49152 ids): drafts off by one position would be near 0. At the
    # fixed prices the runs are the same on every machine: Lookahead's acceptance is 0.09 here
    # (measured prices gave above 0.1 on an idle machine, 0.02 on a loaded one).
    assert speculative.acceptance > 0.05


def test_an_unknown_option_stops_the_engine_naming_it(model_dir):
    with pytest.raises(RuntimeError, match="specdec.vllm.Lookahead: unknown option 'ngram_size' in "
                                           "additional_config\\['specdec'\\]; its options are"):
        engine(model_dir, {"model": "specdec.vllm.Lookahead", "num_speculative_tokens": 4},
               additional_config={"specdec": {"ngram_size": 3}})


def _first_mismatch(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
