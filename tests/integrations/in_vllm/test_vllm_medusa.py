"""Medusa heads trained by specdec (SmolLM2-135M, a small budget), exported, speculating in vLLM."""

import gc

import pytest

pytest.importorskip("vllm")

import specdec  # noqa: E402
from vllm_engines import MAX_TOKENS, Run, run  # noqa: E402
from specdec import models  # noqa: E402
from specdec.vllm import export_medusa, medusa_engine_args  # noqa: E402


@pytest.fixture(scope="module")
def exported(model_dir, tmp_path_factory):
    """Three heads trained on 4k tokens of the installed packages' Python sources as they are
    (``regenerate=False``: the target writing its own text first would add 85 s on 2 cores to a
    test of vLLM reading the heads; features cached in specdec's cache: a rerun trains only),
    exported for vLLM."""
    root = tmp_path_factory.mktemp("medusa")
    model, tokenizer = models.load(model_dir)
    heads = specdec.train_medusa(model, tokenizer, root / "heads", num_heads=3, num_tokens=4000, epochs=4,
                                 regenerate=False, verbose=False)
    out = export_medusa(heads, root / "vllm")
    del model, heads
    gc.collect()
    return out


@pytest.fixture(scope="module")
def medusa(exported, model_dir) -> Run:
    return run(model_dir, **medusa_engine_args(exported, model_dir))


def test_greedy_output_is_identical_one_at_a_time_and_batched(medusa, plain):
    assert [len(s) for s in medusa.singles] == MAX_TOKENS
    assert medusa.singles == plain.singles
    assert medusa.batch == plain.batch


def test_the_heads_speculate(medusa):
    # A few hundred drafts from a 49k-token vocabulary: chance would accept none.
    assert medusa.metrics["vllm:spec_decode_num_draft_tokens"] > 100
    assert medusa.metrics["vllm:spec_decode_num_accepted_tokens"] >= 3
