"""regenerate: the target's own continuations as training text; its use by the trainings."""

import doctest

import pytest
import torch
from support.decoding import hf_greedy
from support.models import tiny_lm
from support.training import CharTokenizer, repeating_text

import specdec
import specdec.training.regenerate as regenerate_module
from specdec.training.corpus import MIN_CHUNK_TOKENS, Chunk
from specdec.training.regenerate import PROMPT_TOKENS, regenerate


def test_docstring_examples():
    result = doctest.testmod(regenerate_module)
    assert result.attempted > 0 and result.failed == 0


def chunks(n: int, length: int = 120, seed: int = 0) -> list[Chunk]:
    g = torch.Generator().manual_seed(seed)
    return [Chunk(tuple([0] + torch.randint(3, 96, (length - 1,), generator=g).tolist())) for _ in range(n)]


def test_each_chunk_is_its_prompt_then_the_targets_greedy_continuation(tmp_path):
    model = tiny_lm(seed=3)
    model.generation_config.eos_token_id = None
    text = chunks(5) + [Chunk((0, 7, 8, 9, 10, 11) + (12,) * 90, start=6)]  # a chat chunk: its request is 6 tokens
    own, seconds = regenerate(model, CharTokenizer(), text, num_tokens=10_000, chunk_tokens=100,
                              cache_root=tmp_path, verbose=False)
    assert seconds is not None and len(own) == len(text)
    for source, chunk in zip(text, own):
        start = source.start or PROMPT_TOKENS
        assert chunk.start == start and chunk.ids[:start] == source.ids[:start]
        assert len(chunk.ids) == 100
        assert list(chunk.ids[start:]) == hf_greedy(model, list(source.ids[:start]), 100 - start)


def test_a_continuation_ends_after_the_end_of_text_token_and_short_ones_are_left_out(tmp_path):
    model = tiny_lm(seed=3)
    model.generation_config.eos_token_id = None
    text = chunks(3)
    written = [hf_greedy(model, list(c.ids[:PROMPT_TOKENS]), 100 - PROMPT_TOKENS) for c in text]
    # An end-of-text id that row 0 writes first after more than MIN_CHUNK_TOKENS tokens.
    eos = next(t for i, t in enumerate(written[0]) if i >= MIN_CHUNK_TOKENS and t not in written[0][:i])
    model.generation_config.eos_token_id = eos
    own, _ = regenerate(model, CharTokenizer(), text, num_tokens=10_000, chunk_tokens=100, cache_root=tmp_path,
                        verbose=False)
    ends = [w.index(eos) + 1 if eos in w else len(w) for w in written]
    kept = [c for c, end in zip(text, ends) if end >= MIN_CHUNK_TOKENS]
    assert [chunk.ids[:PROMPT_TOKENS] for chunk in own] == [c.ids[:PROMPT_TOKENS] for c in kept]
    assert [len(chunk.ids) - PROMPT_TOKENS for chunk in own] == [end for end in ends if end >= MIN_CHUNK_TOKENS]
    assert own[0].ids[-1] == eos


def test_the_budget_stops_generation_and_cuts_the_last_chunk(tmp_path):
    model = tiny_lm(seed=3)
    model.generation_config.eos_token_id = None
    calls = []
    hook = model.get_decoder().register_forward_pre_hook(lambda *a: calls.append(1))
    own, _ = regenerate(model, CharTokenizer(), chunks(40), num_tokens=280, chunk_tokens=100, cache_root=tmp_path,
                        verbose=False)
    hook.remove()
    assert [len(c.ids) for c in own] == [100, 100, 80]
    assert len(calls) <= 100 - PROMPT_TOKENS + 1  # one batch of 3 rows (the budget's), not two batches


def test_the_continuations_are_cached_per_model_prompts_and_budget(tmp_path):
    model = tiny_lm(seed=3)
    text = chunks(4)
    first, seconds = regenerate(model, CharTokenizer(), text, num_tokens=300, chunk_tokens=100,
                                cache_root=tmp_path, verbose=False)
    calls = []
    hook = model.get_decoder().register_forward_pre_hook(lambda *a: calls.append(1))
    again, cached = regenerate(model, CharTokenizer(), text, num_tokens=300, chunk_tokens=100,
                               cache_root=tmp_path, verbose=False)
    assert again == first and cached is None and not calls
    other, _ = regenerate(model, CharTokenizer(), text, num_tokens=200, chunk_tokens=100, cache_root=tmp_path,
                          verbose=False)
    hook.remove()
    assert calls and sum(len(c.ids) for c in other) <= 200
    assert seconds is not None


def test_too_few_continuations_is_a_clear_error(tmp_path):
    model = tiny_lm(seed=3)
    with pytest.raises(ValueError, match="a training and a held-out chunk are needed"):
        regenerate(model, CharTokenizer(), chunks(1), num_tokens=1000, chunk_tokens=100, cache_root=tmp_path,
                   verbose=False)


@pytest.mark.parametrize("train", ["medusa", "eagle"])
def test_the_trainings_learn_from_the_targets_continuations_by_default(tmp_path, train):
    model = tiny_lm(seed=3)
    model.generation_config.eos_token_id = None
    fit = specdec.train_medusa if train == "medusa" else specdec.train_eagle
    kw = dict(num_tokens=1200, data=repeating_text(tmp_path), chunk_tokens=100, epochs=1, verbose=False,
              cache_dir=tmp_path / "cache")
    own = fit(model, CharTokenizer(), tmp_path / "own", **kw)
    given = fit(model, CharTokenizer(), tmp_path / "given", regenerate=False, **kw)
    assert own.metrics["data"].startswith("the target's continuations of the prompts of ")
    assert own.metrics["regenerate_seconds"] is not None and "regenerate_seconds" not in given.metrics
    assert given.metrics["data"] == str(tmp_path / "corpus.txt")
    assert own.metrics["config"]["regenerate"] and not given.metrics["config"]["regenerate"]
    # The held-out positions are the target's text past each chunk's first PROMPT_TOKENS tokens.
    assert own.metrics["tokens"] <= 1200 and own.metrics["heldout_positions"] < given.metrics["heldout_positions"]
