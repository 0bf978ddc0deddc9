"""train_medusa: data, labels and their alignment, learning, caching and resuming, the CLI."""

import doctest
import json
from types import SimpleNamespace

import pytest
import torch
from support.models import tiny_lm
from support.training import CharTokenizer, repeating_text

import specdec
import specdec.training.loop as training_loop
import specdec.training.medusa as medusa_train
from specdec.training.features import commonest_ids
from specdec import cli
from specdec.cli import common
from specdec.proposers.medusa.heads import MedusaHeads
from specdec.training.corpus import Chunk, build_chunks
from specdec.training.features import Features, extract_features, head_targets
from specdec.training.medusa import TrainConfig


class ChatTokenizer:
    """Reversible (id = code point) with a chat template: for the data tests, no model."""

    chat_template = "<role>content"

    def __call__(self, text, add_special_tokens=True):
        return SimpleNamespace(input_ids=[ord(c) for c in text])

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        assert not tokenize
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def test_docstring_examples():
    result = doctest.testmod(medusa_train, extraglobs={"torch": torch})
    assert result.attempted > 0 and result.failed == 0


def test_head_k_learns_the_targets_token_for_t_plus_k_plus_1():
    # labels[t] is the target's token for position t + 1. Chunk A (positions 0-3) starts with
    # two masked labels (prompt tokens), chunk B is positions 4-6.
    features = Features(hidden=torch.zeros(7, 4), labels=torch.tensor([-1, -1, 13, 14, 21, 22, 23]),
                        offsets=torch.tensor([0, 4, 7]), heldout=torch.tensor([False, True]))
    assert head_targets(features, num_heads=2).tolist() == [
        [-1, 13], [13, 14], [14, -1], [-1, -1],  # never across into chunk B
        [22, 23], [23, -1], [-1, -1],
    ]


def test_features_and_labels_match_a_direct_forward(tmp_path):
    model = tiny_lm(seed=3)
    gen = torch.Generator().manual_seed(0)
    chunks = [Chunk(tuple(torch.randint(3, 96, (40,), generator=gen).tolist())),
              Chunk(tuple(torch.randint(3, 96, (33,), generator=gen).tolist()), start=3)]
    features, seconds = extract_features(model, chunks, heldout_every=2, cache_root=tmp_path, verbose=False)
    assert seconds > 0 and features.heldout.tolist() == [False, True]
    assert features.offsets.tolist() == [0, 40, 73] and features.hidden.dtype == torch.float16
    targets = head_targets(features, num_heads=3)
    for c, chunk in enumerate(chunks):
        ids = torch.tensor([chunk.ids])
        with torch.no_grad():
            greedy = model(ids).logits[0].argmax(-1)       # the target's token for t + 1
            hidden = model.model(ids).last_hidden_state[0]  # after the final norm
        span = slice(int(features.offsets[c]), int(features.offsets[c + 1]))
        torch.testing.assert_close(features.hidden[span].float(), hidden, atol=2e-3, rtol=2e-3)
        masked = max(chunk.start - 1, 0)  # labels of prompt tokens (position < start) are not learned
        assert (features.labels[span][:masked] == -1).all()
        assert features.labels[span][masked:].tolist() == greedy[masked:].tolist()
        n = len(chunk.ids)
        for k in (1, 2, 3):  # head k at t: the target's greedy token at position t + k + 1
            expected = [int(greedy[t + k]) if t + k < n and t + k >= masked else -1 for t in range(n)]
            assert targets[span, k - 1].tolist() == expected


def test_training_on_a_repetitive_text_predicts_far_above_chance(tmp_path):
    model = tiny_lm(seed=0)
    out = tmp_path / "heads"
    heads = specdec.train_medusa(model, CharTokenizer(), out, num_heads=3, num_tokens=3000, vocab_size=64,
                                 regenerate=False, data=repeating_text(tmp_path), chunk_tokens=128, epochs=10,
                                 lr=1e-2, cache_dir=tmp_path / "cache", verbose=False)
    m = heads.metrics
    chance = 1 / heads.config.vocab_size
    assert chance < 0.1 and m["heldout_positions"] > 200
    assert m["top1"][0] > 0.8 and min(m["top1"]) > 0.5
    assert heads.rank_accuracy.shape == (3, 10)
    torch.testing.assert_close(torch.tensor(m["top5"]), heads.rank_accuracy[:, :5].sum(1))
    assert (heads.rank_accuracy.sum(1) <= 1 + 1e-6).all()

    saved = json.loads((out / "metrics.json").read_text())
    assert saved["top1"] == m["top1"] and saved["rank_accuracy"] == heads.rank_accuracy.tolist()
    loaded = MedusaHeads.load(out)
    assert loaded.metrics["top1"] == m["top1"] and loaded.config.target_vocab_size == 96
    h = torch.randn(4, 64)
    torch.testing.assert_close(loaded.attach(model)(h), heads(h))


def test_the_vocabulary_is_the_commonest_training_labels():
    labels = torch.tensor([7, 7, 7, 3, 3, 9, -1, 5, 5, 5, 5])
    assert commonest_ids(labels, 3).tolist() == [5, 7, 3]
    assert commonest_ids(labels, 10).tolist() == [5, 7, 3, 9]


def test_resume_continues_an_interrupted_run_and_reuses_the_cached_features(tmp_path, monkeypatch):
    model = tiny_lm(seed=1)
    forwards = []
    model.get_decoder().register_forward_hook(lambda *args: forwards.append(1))
    settings = dict(num_heads=2, num_tokens=1500, regenerate=False, data=repeating_text(tmp_path), chunk_tokens=100,
                    epochs=3, data_dtype="float32",  # the passes on the hooked model itself
                    lr=1e-2, cache_dir=tmp_path / "cache", verbose=False)
    whole = specdec.train_medusa(model, CharTokenizer(), tmp_path / "whole", **settings)
    assert len(forwards) == 15  # one per chunk, the first time

    forwards.clear()
    save = training_loop.save_checkpoint

    def stop_after_one_epoch(heads, optimizer, checkpoint, state):
        save(heads, optimizer, checkpoint, state)
        raise KeyboardInterrupt

    monkeypatch.setattr(training_loop, "save_checkpoint", stop_after_one_epoch)
    with pytest.raises(KeyboardInterrupt):
        specdec.train_medusa(model, CharTokenizer(), tmp_path / "resumed", **settings)
    monkeypatch.setattr(training_loop, "save_checkpoint", save)
    assert json.loads((tmp_path / "resumed" / "checkpoint" / "state.json").read_text())["epoch"] == 1
    with pytest.raises(ValueError, match="lr differ"):
        specdec.train_medusa(model, CharTokenizer(), tmp_path / "resumed", resume=True, **{**settings, "lr": 1e-3})
    resumed = specdec.train_medusa(model, CharTokenizer(), tmp_path / "resumed", resume=True, **settings)
    assert forwards == []  # the target never ran again: features came from the cache
    assert resumed.state_dict().keys() == whole.state_dict().keys()
    for name, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    assert resumed.metrics["top1"] == whole.metrics["top1"]


def test_text_and_jsonl_data(tmp_path):
    tok = ChatTokenizer()
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "x" * 90}) + "\n\n" + json.dumps({"text": "y" * 50}) + "\n")
    (tmp_path / "b.txt").write_text("z" * 40)
    cfg = dict(chunk_tokens=64, num_tokens=10_000)
    chunks, source = build_chunks(tok, [tmp_path / "a.jsonl", str(tmp_path / "b.txt")], **cfg)
    # Used as given (no chat template): 64-token windows; the 26-token rest of "x" is too short.
    assert ["".join(map(chr, c.ids)) for c in chunks] == ["x" * 64, "y" * 50, "z" * 40]
    assert all(c.start == 0 for c in chunks) and "a.jsonl" in source
    assert [len(c.ids) for c in build_chunks(tok, tmp_path / "a.jsonl", chunk_tokens=64,
                                             num_tokens=100)[0]] == [64, 36]  # cut at num_tokens

    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        build_chunks(tok, tmp_path / "bad.jsonl", **cfg)
    (tmp_path / "bad.jsonl").write_text('{"content": "ok"}\n')
    with pytest.raises(ValueError, match=r'bad\.jsonl:1: expected an object \{"text"'):
        build_chunks(tok, tmp_path / "bad.jsonl", **cfg)
    with pytest.raises(FileNotFoundError, match="missing.txt not found"):
        build_chunks(tok, tmp_path / "missing.txt", **cfg)
    with pytest.raises(ValueError, match="a training and a held-out chunk are needed"):
        build_chunks(tok, tmp_path / "b.txt", **cfg)


def test_default_data_is_installed_python_code_as_chat_answers():
    chunks, source = build_chunks(ChatTokenizer(), None, num_tokens=3000, chunk_tokens=300)
    assert source == "Python sources of the installed packages (chat-wrapped)"
    assert 2700 <= sum(len(c.ids) for c in chunks) <= 3000 and len(chunks) >= 10
    prompts = set()
    for chunk in chunks:
        text = "".join(map(chr, chunk.ids))
        prompt, answer = text[: chunk.start], text[chunk.start:]
        assert prompt.startswith("<user>Write the Python module ") and prompt.endswith(".<assistant>")
        assert len(answer) >= 32 and len(chunk.ids) <= 300
        prompts.add(prompt)
    assert len(prompts) == len(chunks)  # one window per file


def test_cli_train_medusa_passes_its_flags(tmp_path, monkeypatch):
    calls = {}

    def load_models(args, packing=None):
        calls["prepared"] = None if args.no_accelerate else packing
        return "target", "tokenizer", None

    monkeypatch.setattr(common, "load_models", load_models)
    monkeypatch.setattr(medusa_train, "train_medusa", lambda *a, **kw: calls.update(args=a, kwargs=kw))
    data = tmp_path / "d.txt"
    data.write_text("text")
    cli.main(["train-medusa", "--model", "smollm2-135m", "--out", str(tmp_path / "o"), "--heads", "4",
              "--tokens", "5000", "--vocab-size", "1000", "--data", str(data), "--resume"])
    assert calls["args"] == ("target", "tokenizer", str(tmp_path / "o"))
    assert calls["kwargs"] == dict(num_heads=4, num_tokens=5000, vocab_size=1000, data=[str(data)],
                                   num_layers=1, epochs=TrainConfig().epochs, regenerate=True,
                                   data_dtype=TrainConfig().data_dtype, resume=True)
    assert calls["prepared"].kernel == "onednn"  # features over whole chunks: the fastest wide products
    cli.main(["train-medusa", "--model", "smollm2-135m", "--out", "o"])
    defaults = TrainConfig()
    assert calls["kwargs"]["num_heads"] == defaults.num_heads and calls["kwargs"]["data"] is None
    assert calls["kwargs"]["num_tokens"] == defaults.num_tokens and calls["kwargs"]["resume"] is False
    cli.main(["train-medusa", "--model", "smollm2-135m", "--out", "o", "--no-regenerate", "--data-dtype", "float32"])
    assert calls["kwargs"]["regenerate"] is False and calls["kwargs"]["data_dtype"] == "float32"


def test_cli_train_medusa_checks_data_before_loading_the_model(tmp_path, monkeypatch):
    def no_models(*args):
        raise AssertionError("the model was loaded before --data was checked")

    monkeypatch.setattr(common, "load_models", no_models)
    with pytest.raises(SystemExit, match="--data: no such file: .*missing.txt"):
        cli.main(["train-medusa", "--model", "smollm2-135m", "--out", str(tmp_path),
                  "--data", str(tmp_path / "missing.txt")])


def test_cached_heads_train_once_then_load(tmp_path, monkeypatch):
    model = tiny_lm(seed=0)
    kw = dict(cache_dir=tmp_path, num_tokens=600, vocab_size=32, data=repeating_text(tmp_path, 60),
              chunk_tokens=64, epochs=1, verbose=False)
    first = medusa_train.cached_heads(model, CharTokenizer(), "tiny/model-float32", **kw)
    assert (tmp_path / "medusa-heads" / "tiny_model-float32" / "config.json").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("trained again instead of loading the cached heads")

    monkeypatch.setattr(medusa_train, "train_medusa", no_training)
    again = medusa_train.cached_heads(model, CharTokenizer(), "tiny/model-float32", **kw)
    h = torch.randn(2, 64)
    torch.testing.assert_close(again(h), first(h))
