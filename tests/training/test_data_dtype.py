"""Both trainings run the target's passes over their data in ``data_dtype`` and cache the data
under it, so the defaults of ``train_medusa`` and ``train_eagle`` make and read one cache."""

import pytest
import torch
from support.models import tiny_lm
from support.training import CharTokenizer, repeating_text

import specdec
import specdec.training.loop as training_loop
from specdec.training.eagle import EagleTrainConfig
from specdec.training.medusa import TrainConfig

TRAININGS = {  # a call that trains for a second, the trained module's float32 weight
    "medusa": (lambda **kw: specdec.train_medusa(num_heads=2, vocab_size=96, **kw),
               lambda heads: heads.heads[0][0].linear.weight),
    "eagle": (lambda **kw: specdec.train_eagle(draft_vocab_size=96, **kw),
              lambda drafter: drafter.fc.weight),
}


@pytest.mark.parametrize("training", TRAININGS)
@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("data_dtype", ["auto", "float32", "bfloat16"])
def test_the_data_runs_on_a_bfloat16_copy_of_a_float32_target_where_the_device_multiplies_it(
        tmp_path, monkeypatch, training, native, data_dtype):
    train, weight = TRAININGS[training]
    passes = []

    extract = training_loop.extract_features

    def recording(model, *args):
        passes.append(next(model.parameters()).dtype)
        return extract(model, *args)

    monkeypatch.setattr(training_loop, "extract_features", recording)
    monkeypatch.setattr(training_loop, "bf16_packable", lambda: native)
    model = tiny_lm(seed=0, init=0.02)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trained = train(model=model, tokenizer=CharTokenizer(), out_dir=tmp_path / "d", num_tokens=600, regenerate=False,
                    data=repeating_text(tmp_path), chunk_tokens=128, epochs=1, data_dtype=data_dtype,
                    cache_dir=tmp_path / "cache", verbose=False)
    expected = "bfloat16" if data_dtype == "bfloat16" or (data_dtype == "auto" and native) else "float32"
    assert passes == [getattr(torch, expected)] and trained.metrics["data_dtype"] == expected
    # The features are cached under the dtype they were computed in; the target is as it was and
    # the trained module float32, made from it.
    assert [p.name.split("-")[1] for p in (tmp_path / "cache" / "medusa-features").iterdir()] == [expected]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert {p.dtype for p in model.parameters()} == {weight(trained).dtype} == {torch.float32}


def test_the_two_trainings_read_one_cache_with_their_defaults(tmp_path):
    model = tiny_lm(seed=0, init=0.02)
    settings = dict(num_tokens=600, regenerate=False, data=repeating_text(tmp_path), chunk_tokens=128, epochs=1,
                    cache_dir=tmp_path / "cache", verbose=False)
    forwards = []
    model.get_decoder().register_forward_hook(lambda *args: forwards.append(1))
    specdec.train_medusa(model, CharTokenizer(), tmp_path / "heads", data_dtype="float32", **settings)
    made = len(forwards)
    specdec.train_eagle(model, CharTokenizer(), tmp_path / "drafter", data_dtype="float32", **settings)
    assert made > 0 and len(forwards) == made  # the drafter's training ran no pass over the data
    assert len(list((tmp_path / "cache" / "medusa-features").iterdir())) == 1
    defaults = {f: (getattr(TrainConfig(), f), getattr(EagleTrainConfig(), f))
                for f in ("num_tokens", "chunk_tokens", "heldout_every", "regenerate", "data_dtype", "seed")}
    assert all(medusa == eagle for medusa, eagle in defaults.values()), defaults


@pytest.mark.parametrize("config", [TrainConfig, EagleTrainConfig])
def test_a_data_dtype_that_is_not_a_floating_dtype_is_refused(config):
    with pytest.raises(ValueError, match="data_dtype must be one of auto, float32, bfloat16, float16, got 'int8'"):
        config(data_dtype="int8")
