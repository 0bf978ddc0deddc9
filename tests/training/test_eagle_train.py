"""train_eagle: the held-out rollout's alignment, the training's losses per depth on the same
rollout, learning, resuming, files, the CLI."""

import doctest
import json
from dataclasses import asdict

import pytest
import torch
from support.models import random_drafter, tiny_lm
from support.training import CharTokenizer, repeating_text

import specdec
import specdec.training.eagle as eagle_train
import specdec.training.eagle_rollout as eagle_rollout
import specdec.training.loop as training_loop
from specdec import cli
from specdec.cli import common
from specdec.proposers.eagle.drafter import EagleDrafter
from specdec.training.eagle import EagleTrainConfig, depth_losses, vocabulary
from specdec.training.eagle_rollout import evaluate, rollout
from specdec.training.corpus import build_chunks
from specdec.training.features import Features, commonest_ids, extract_features


def test_docstring_examples():
    for module in (eagle_train, eagle_rollout, training_loop):
        result = doctest.testmod(module, extraglobs={"torch": torch})
        assert result.attempted > 0 and result.failed == 0, module.__name__


def _forward(target, ids):
    with torch.no_grad():
        hidden = target.model(ids[None]).last_hidden_state[0]  # after the final norm
    return hidden, target.lm_head(hidden).argmax(-1)


def _draft_alone(drafter, x, f, s, depth, g=None):
    """A draft from ``(f_s, x_{s+1})`` as decoding runs it: at each depth one causal pass over
    the real entries 0..s and the draft so far (its own features; the text's tokens, or with
    ``g`` the target's greedy tokens where learned)."""
    tokens, features, predicted = x[1: s + 2].tolist(), f[: s + 1], []
    for d in range(1, depth + 1):
        with torch.no_grad():
            p = drafter(torch.tensor([tokens]), features[None])[0, -1]
        predicted.append(p)
        if d < depth:  # the token for position s + d + 1
            tokens.append(int(g[s + d]) if g is not None and g[s + d] >= 0 else int(x[s + d + 1]))
            features = torch.cat([features, p[None]])
    return predicted


def _assert_same(predicted, expected):
    # The untrained drafter's features grow with depth (to thousands): float32 rounding.
    torch.testing.assert_close(predicted, expected, atol=1e-5 * float(expected.abs().max()), rtol=1e-5)


def test_rollout_drafts_from_each_position_as_a_draft_alone_would():
    target = tiny_lm(seed=2)
    drafter = random_drafter(target, seed=1, scale=1.0)  # attention that matters (a fresh drafter's adds nothing)
    x = torch.randint(3, 96, (24,), generator=torch.Generator().manual_seed(0))
    f, g = _forward(target, x)
    g[:5] = -1  # a prompt: its labels are not learned; on the greedy path the text's tokens are fed
    predicted = rollout(drafter, x, f, depth=4)
    on_greedy_path = rollout(drafter, x, f, depth=4, greedy=g)
    assert [p.shape for p in predicted] == [torch.Size([24 - d, 64]) for d in (1, 2, 3, 4)]
    torch.testing.assert_close(on_greedy_path[0], predicted[0])  # depth 1: the real entries alike
    for s in (0, 2, 3, 9, 19):
        for d, expected in enumerate(_draft_alone(drafter, x, f, s, depth=4), 1):
            _assert_same(predicted[d - 1][s], expected)
        for d, expected in enumerate(_draft_alone(drafter, x, f, s, depth=4, g=g), 1):
            _assert_same(on_greedy_path[d - 1][s], expected)
    assert not torch.allclose(on_greedy_path[1][5:], predicted[1][5:], atol=1e-3)  # the random target's
    # greedy tokens are not the text's
    # Not one causal pass over the depth-1 predictions shifted right (each entry's context its
    # neighbours' predictions): a draft's context is the real entries.
    with torch.no_grad():
        shifted = drafter(x[None, 2:23], predicted[0][None, :21], position_ids=torch.arange(1, 22)[None])[0]
    assert not torch.allclose(shifted, predicted[1][:21], atol=1e-3)


def test_a_batch_rollout_with_gradients_is_the_evaluation_rollout_of_each_chunk():
    target = tiny_lm(seed=2)
    drafter = random_drafter(target, seed=3, scale=1.0)
    gen = torch.Generator().manual_seed(5)
    chunks = [torch.randint(3, 96, (n,), generator=gen) for n in (20, 13)]
    forwards = [_forward(target, x) for x in chunks]
    ids = torch.zeros(2, 20, dtype=torch.long)
    hidden = torch.zeros(2, 20, 64)
    greedy = torch.full((2, 20), -1)
    for b, (x, (f, g)) in enumerate(zip(chunks, forwards)):  # right-padded, as the training batches
        ids[b, :len(x)], hidden[b, :len(x)], greedy[b, :len(x)] = x, f, g
    for feed in (None, greedy):
        batch = rollout(drafter, ids, hidden, depth=3, greedy=feed)  # with gradients
        assert all(p.requires_grad for p in batch) and [p.shape for p in batch] == [(2, 20 - d, 64) for d in (1, 2, 3)]
        for b, (x, (f, g)) in enumerate(zip(chunks, forwards)):
            with torch.no_grad():
                alone = rollout(drafter, x, f, depth=3, greedy=None if feed is None else g)  # as evaluate runs it
            for d, expected in enumerate(alone, 1):
                _assert_same(batch[d - 1][b, :len(x) - d].detach(), expected)
    # The gradient runs through the fed-back features: start s's depth-3 entry depends on its own
    # depth-1 and depth-2 predictions and on no other start's (their keys come from real entries).
    s = 7
    batch = rollout(drafter, ids, hidden, depth=3)
    grads = torch.autograd.grad(batch[2][0, s].sum(), batch[:2], retain_graph=True)
    for grad in grads:
        touched = grad.abs().sum(-1) > 0
        assert touched[0, s] and touched.sum() == 1
    drafter.zero_grad()
    batch[2].sum().backward()
    assert drafter.fc.weight.grad.abs().sum() > 0 and drafter.layer.mlp.down_proj.weight.grad.abs().sum() > 0


def test_the_loss_at_depth_d_scores_start_s_against_the_targets_of_position_s_plus_d():
    target = tiny_lm(seed=4)
    gen = torch.Generator().manual_seed(2)
    chunks = [torch.randint(3, 30, (n,), generator=gen) for n in (16, 11)]
    ids = torch.zeros(2, 16, dtype=torch.long)
    hidden = torch.zeros(2, 16, 64)
    labels = torch.full((2, 16), -1)
    for b, x in enumerate(chunks):
        f, g = _forward(target, x)
        ids[b, :len(x)], hidden[b, :len(x)], labels[b, :len(x)] = x, f, g
    labels[0, 2] = labels[1, 6] = -1  # not learned
    labels[0, 9] = 95                  # outside the drafter's ids: its feature is learned, its token not
    # 60 scattered ids (column c scores vocab[c]): the token loss is over columns, not ids.
    vocab = torch.tensor(sorted(set(range(0, 96, 3)) | set(labels[labels >= 0].tolist()[:30]) - {95}))
    column = {int(i): c for c, i in enumerate(vocab)}
    drafter = _copying_drafter(target, vocab_ids=vocab)  # every depth from s predicts f_s
    head = drafter.logits
    losses = depth_losses(drafter, head, ids, hidden, labels, depth=4)
    assert losses.shape == (4, 2)
    with torch.no_grad():
        for d in range(1, 5):
            predicted, wanted, label = [], [], []
            for b, x in enumerate(chunks):
                for s in range(len(x) - d):
                    if labels[b, s + d] >= 0:
                        predicted.append(hidden[b, s])
                        wanted.append(hidden[b, s + d])
                        label.append(int(labels[b, s + d]))
            predicted, wanted = torch.stack(predicted), torch.stack(wanted)
            scored = torch.tensor([i in column for i in label])
            assert 0 < scored.sum() < len(label)
            columns = torch.tensor([column[i] for i in label if i in column])
            expected = [torch.nn.functional.smooth_l1_loss(predicted, wanted),
                        torch.nn.functional.cross_entropy(head(predicted[scored]), columns)]
            torch.testing.assert_close(losses[d - 1], torch.stack(expected).float(), rtol=1e-5, atol=1e-6)
    # Depth 1 is the teacher-forced training: one causal pass over the real entries (f_t, x_{t+1}).
    drafter = random_drafter(target, 90, seed=1)  # ids 0..89: columns are ids
    predicted = drafter(ids[:, 1:], hidden[:, :-1])
    learned = labels[:, 1:] >= 0
    scored = learned & (labels[:, 1:] < 90)
    teacher_forced = torch.stack([
        torch.nn.functional.smooth_l1_loss(predicted[learned], hidden[:, 1:][learned]),
        torch.nn.functional.cross_entropy(drafter.logits(predicted[scored]), labels[:, 1:][scored])])
    torch.testing.assert_close(depth_losses(drafter, drafter.logits, ids, hidden, labels, depth=1)[0],
                               teacher_forced.float(), rtol=1e-5, atol=1e-6)


def _copying_drafter(target, draft_vocab_size=32_768, vocab_ids=None):
    """A drafter whose prediction is its input feature: fc = [0 | I], the layer's attention and
    MLP outputs zero, so depth d from position s scores ``lm_head(f_s)`` (over ``vocab_ids``)."""
    drafter = EagleDrafter.for_target(target, draft_vocab_size, vocab_ids=vocab_ids)
    H = drafter.config.hidden_size
    with torch.no_grad():
        drafter.fc.weight.copy_(torch.cat([torch.zeros(H, H), torch.eye(H)], 1))
        drafter.layer.self_attn.o_proj.weight.zero_()
        drafter.layer.mlp.down_proj.weight.zero_()
    return drafter


@pytest.mark.parametrize("scattered", [False, True], ids=["all-ids", "scattered-ids"])
def test_held_out_accuracy_of_a_drafter_known_exactly(scattered):
    target = tiny_lm(seed=4)
    # Scattered: the drafter ranks 50 of the 96 ids; its candidates are ids, not columns.
    vocab = torch.randperm(96, generator=torch.Generator().manual_seed(5))[:50].sort().values if scattered else None
    gen = torch.Generator().manual_seed(1)
    chunks = [torch.randint(3, 20, (n,), generator=gen) for n in (30, 40, 33)]  # few ids: repeats
    forwards = [_forward(target, ids) for ids in chunks]
    labels = [g.to(torch.int32) for _, g in forwards]
    labels[2][:3] = -1  # not learned
    features = Features(hidden=torch.cat([h for h, _ in forwards]).half(), labels=torch.cat(labels),
                        offsets=torch.tensor([0, 30, 70, 103]), heldout=torch.tensor([False, True, True]))
    drafter = _copying_drafter(target, vocab_ids=vocab)
    accuracy, positions = evaluate(drafter, torch.cat(chunks), features, depth=3)
    # The copying drafter ignores its tokens: the same along the target's greedy path.
    torch.testing.assert_close(evaluate(drafter, torch.cat(chunks), features, depth=3, greedy_path=True)[0],
                               accuracy)

    hits, counts = torch.zeros(3, 10), torch.zeros(3)
    for c in (1, 2):  # depth d from s predicts the target's token for position s + d + 1: labels[s + d]
        span = slice(int(features.offsets[c]), int(features.offsets[c + 1]))
        hidden, lab = features.hidden[span].float(), features.labels[span].long()
        scores = target.lm_head(hidden)
        ranked = (vocab[scores[:, vocab].topk(10, -1).indices] if scattered
                  else scores.topk(10, -1).indices)  # the copying drafter's candidates at s
        for d in (1, 2, 3):
            for s in range(len(lab) - d):
                if lab[s + d] >= 0:
                    counts[d - 1] += 1
                    hits[d - 1] += ranked[s] == lab[s + d]
    assert positions == counts[0] == 39 + 30
    torch.testing.assert_close(accuracy, hits / counts[:, None])
    assert accuracy[0].sum() > 0 and accuracy.sum() < 3  # neither always right nor never


def test_training_on_a_repetitive_text_drafts_far_above_chance(tmp_path, capsys):
    # Weights of a trained model's scale (features about 1 per dimension): those of tiny_lm's
    # default (0.3) make features chaotic functions of the context, hundreds wide.
    model = tiny_lm(seed=0, init=0.02)
    out = tmp_path / "drafter"
    drafter = specdec.train_eagle(model, CharTokenizer(), out, num_tokens=3000, draft_vocab_size=96,
                                  regenerate=False, data=repeating_text(tmp_path), chunk_tokens=128, epochs=8, lr=3e-3,
                                  data_dtype="float32", cache_dir=tmp_path / "cache")  # the features read below
    m = drafter.metrics
    assert m["heldout_positions"] > 200 and m["heldout_in_vocab"] == 1.0
    assert m["top1"][0] > 0.9 and min(m["top1"][:4]) > 0.7 and m["top1"][4] > 0.4  # chance: 1/96
    assert drafter.rank_accuracy.shape == (5, 10) and (drafter.rank_accuracy.sum(1) <= 1 + 1e-6).all()
    torch.testing.assert_close(torch.tensor(m["top5"]), drafter.rank_accuracy[:, :5].sum(1))
    assert m["config"] == asdict(EagleTrainConfig(num_tokens=3000, draft_vocab_size=96, chunk_tokens=128,
                                                  epochs=8, lr=3e-3, regenerate=False, data_dtype="float32"))
    # The same drafter before training (the target's last layer, fc adding the token's embedding).
    chunks, _ = build_chunks(CharTokenizer(), repeating_text(tmp_path), num_tokens=3000, chunk_tokens=128)
    features, seconds = extract_features(model, chunks, 10, tmp_path / "cache", verbose=False)
    assert seconds is None  # the training's, from the cache
    untrained, _ = evaluate(EagleDrafter.for_target(model, 96), torch.tensor([i for c in chunks for i in c.ids]),
                            features)
    assert (untrained[:, 0] < 0.1).all() and (drafter.rank_accuracy[:, 0] > untrained[:, 0] + 0.3).all()
    # The target is as it was: nothing trained, no gradients left on it.
    assert all(p.requires_grad and p.grad is None for p in model.parameters())

    printed = capsys.readouterr().out
    assert "[eagle] epoch 8: held-out top-1 at depths 1-5" in printed and "depth  predicts  top-1" in printed
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["top1"] == m["top1"] and saved["rank_accuracy"] == drafter.rank_accuracy.tolist()

    loaded = EagleDrafter.load(out)  # the files round trip
    assert loaded.metrics == json.loads(json.dumps(m)) and torch.equal(loaded.rank_accuracy, drafter.rank_accuracy)
    for name, value in drafter.weights().items():
        assert torch.equal(loaded.weights()[name], value), name
    x, f = torch.randint(3, 96, (2, 7)), torch.randn(2, 7, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded.attach(model).logits(loaded(x, f)), drafter.logits(drafter(x, f)))

    with pytest.raises(ValueError, match="hidden size 64; this target's is 32"):
        loaded.attach(tiny_lm(seed=0, hidden_size=32))
    with pytest.raises(ValueError, match="96 token ids; this target scores 128"):
        loaded.attach(tiny_lm(seed=0, vocab=128))


@pytest.mark.parametrize("mixed_precision", [True, False])
@pytest.mark.parametrize("native", [True, False])
def test_mixed_precision_computes_the_losses_in_bfloat16_where_the_device_has_it(tmp_path, monkeypatch,
                                                                                mixed_precision, native):
    seen = []

    def recording(*args):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return depth_losses(*args)

    monkeypatch.setattr(eagle_train, "depth_losses", recording)
    monkeypatch.setattr(training_loop, "bf16_packable", lambda: native)
    model = tiny_lm(seed=0, init=0.02)
    drafter = specdec.train_eagle(model, CharTokenizer(), tmp_path / "d", num_tokens=600, draft_vocab_size=96,
                                  regenerate=False, data=repeating_text(tmp_path), chunk_tokens=128, epochs=1,
                                  mixed_precision=mixed_precision, cache_dir=tmp_path / "cache", verbose=False)
    assert seen and set(seen) == {torch.bfloat16 if mixed_precision and native else None}
    assert drafter.fc.weight.dtype == torch.float32 and drafter.metrics["config"]["mixed_precision"] == mixed_precision


def test_the_vocabulary_is_the_commonest_training_labels_then_the_lowest_others(tmp_path):
    model = tiny_lm(seed=0, init=0.02)
    settings = dict(num_tokens=1500, regenerate=False, data=repeating_text(tmp_path), chunk_tokens=100,
                    cache_dir=tmp_path / "cache")
    drafter = specdec.train_eagle(model, CharTokenizer(), tmp_path / "d", draft_vocab_size=6, epochs=1,
                                  verbose=False, **settings)
    chunks, _ = build_chunks(CharTokenizer(), settings["data"], num_tokens=1500, chunk_tokens=100)
    features, _ = extract_features(model, chunks, 10, tmp_path / "cache", verbose=False)
    entries = [features.labels[int(a) + 1: int(b)] for a, b in zip(features.offsets[:-1], features.offsets[1:])]
    train = torch.cat([e for e, held in zip(entries, features.heldout) if not held])
    held = torch.cat([e for e, h in zip(entries, features.heldout) if h])
    assert drafter.vocab_ids.tolist() == sorted(vocabulary(train, 6, 96).tolist())
    common = commonest_ids(train, 6)
    assert set(common.tolist()) <= set(drafter.vocab_ids.tolist())
    in_vocab = torch.isin(held[held >= 0], drafter.vocab_ids).float().mean()
    assert drafter.metrics["heldout_in_vocab"] == pytest.approx(float(in_vocab))
    assert in_vocab > (held[held >= 0] < 6).float().mean()  # more than the lowest 6 ids would cover


def test_resume_continues_an_interrupted_run_and_reuses_the_cached_features(tmp_path, monkeypatch):
    model = tiny_lm(seed=1)
    forwards = []
    model.get_decoder().register_forward_hook(lambda *args: forwards.append(1))
    settings = dict(num_tokens=1500, draft_vocab_size=90, regenerate=False, data=repeating_text(tmp_path),
                    chunk_tokens=100,
                    epochs=3, train_depth=2, batch_size=2, lr=3e-3, cache_dir=tmp_path / "cache", verbose=False)
    whole = specdec.train_eagle(model, CharTokenizer(), tmp_path / "whole", **settings)
    assert len(forwards) == 15  # one per chunk, the first time

    forwards.clear()
    save = training_loop.save_checkpoint

    def stop_after_one_epoch(drafter, optimizer, checkpoint, state):
        save(drafter, optimizer, checkpoint, state)
        raise KeyboardInterrupt

    monkeypatch.setattr(training_loop, "save_checkpoint", stop_after_one_epoch)
    with pytest.raises(KeyboardInterrupt):
        specdec.train_eagle(model, CharTokenizer(), tmp_path / "resumed", **settings)
    monkeypatch.setattr(training_loop, "save_checkpoint", save)
    assert json.loads((tmp_path / "resumed" / "checkpoint" / "state.json").read_text())["epoch"] == 1
    with pytest.raises(ValueError, match=r"train_eagle\(resume=True\).*\(lr differ\)"):
        specdec.train_eagle(model, CharTokenizer(), tmp_path / "resumed", resume=True, **{**settings, "lr": 1e-3})
    with pytest.raises(ValueError, match=r"\(draft_vocab_size, epochs differ\)"):
        specdec.train_eagle(model, CharTokenizer(), tmp_path / "resumed", resume=True,
                            **{**settings, "epochs": 4, "draft_vocab_size": 80})
    with pytest.raises(ValueError, match=r"\(train_depth differ\)"):
        specdec.train_eagle(model, CharTokenizer(), tmp_path / "resumed", resume=True, **{**settings, "train_depth": 1})
    resumed = specdec.train_eagle(model, CharTokenizer(), tmp_path / "resumed", resume=True, **settings)
    assert forwards == []  # the target never ran again: the features came from the cache
    untrained = EagleDrafter.for_target(model, 90).weights()
    for name, value in whole.weights().items():
        assert torch.equal(resumed.weights()[name], value), name
    assert any(not torch.equal(untrained[name], value) for name, value in whole.weights().items())
    assert resumed.metrics["top1"] == whole.metrics["top1"]


def test_missing_files_and_bad_settings(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        EagleDrafter.load(tmp_path / "nothing")
    model = tiny_lm(seed=0)
    drafter = EagleDrafter.for_target(model, 50)
    drafter.save(tmp_path / "d")
    (tmp_path / "d" / "drafter.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no drafter.safetensors"):
        EagleDrafter.load(tmp_path / "d")
    with pytest.raises(ValueError, match="depth must be >= 1"):
        EagleTrainConfig(depth=0)
    with pytest.raises(ValueError, match="lr must be > 0"):
        EagleTrainConfig(lr=0.0)
    with pytest.raises(ValueError, match="train_depth must be >= 1, got 0"):
        specdec.train_eagle(model, CharTokenizer(), tmp_path / "o", train_depth=0)
    for decay in (0.0, 1.5):
        with pytest.raises(ValueError, match=f"depth_decay must be in \\(0, 1\\], got {decay}"):
            EagleTrainConfig(depth_decay=decay)
    with pytest.raises(ValueError, match="chunk_tokens must be >= 32"):
        specdec.train_eagle(model, CharTokenizer(), tmp_path / "o", chunk_tokens=8)


def test_cached_eagle_trains_once_then_loads(tmp_path, monkeypatch):
    model = tiny_lm(seed=0)
    kw = dict(cache_dir=tmp_path, num_tokens=600, draft_vocab_size=32, data=repeating_text(tmp_path, 60),
              chunk_tokens=64, epochs=1, verbose=False)
    first = eagle_train.cached_eagle(model, CharTokenizer(), "tiny/model-float32", **kw)
    assert (tmp_path / "eagle-drafters" / "tiny_model-float32" / "config.json").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("trained again instead of loading the cached drafter")

    monkeypatch.setattr(eagle_train, "train_eagle", no_training)
    again = eagle_train.cached_eagle(model, CharTokenizer(), "tiny/model-float32", **kw)
    x, f = torch.randint(3, 96, (1, 5)), torch.randn(1, 5, 64)
    with torch.no_grad():
        torch.testing.assert_close(again.logits(again(x, f)), first.logits(first(x, f)))


def test_cli_train_eagle_passes_its_flags(tmp_path, monkeypatch):
    calls = {}

    def load_models(args, packing=None):
        calls["prepared"] = None if args.no_accelerate else packing
        return "target", "tokenizer", None

    monkeypatch.setattr(common, "load_models", load_models)
    monkeypatch.setattr(eagle_train, "train_eagle", lambda *a, **kw: calls.update(args=a, kwargs=kw))
    data = tmp_path / "d.txt"
    data.write_text("text")
    cli.main(["train-eagle", "--model", "smollm2-135m", "--out", str(tmp_path / "o"), "--tokens", "5000",
              "--draft-vocab-size", "1000", "--data", str(data), "--epochs", "3", "--train-depth", "2", "--resume",
              "--no-regenerate", "--no-mixed-precision", "--data-dtype", "float32"])
    assert calls["args"] == ("target", "tokenizer", str(tmp_path / "o"))
    assert calls["kwargs"] == dict(num_tokens=5000, draft_vocab_size=1000, data=[str(data)], epochs=3,
                                   train_depth=2, regenerate=False, mixed_precision=False, data_dtype="float32",
                                   resume=True)
    assert calls["prepared"].kernel == "onednn"  # features over whole chunks: the fastest wide products
    cli.main(["train-eagle", "--model", "smollm2-135m", "--out", "o"])
    defaults = EagleTrainConfig()
    assert calls["kwargs"] == dict(num_tokens=defaults.num_tokens, draft_vocab_size=defaults.draft_vocab_size,
                                   data=None, epochs=defaults.epochs, train_depth=defaults.train_depth,
                                   regenerate=defaults.regenerate, mixed_precision=defaults.mixed_precision,
                                   data_dtype=defaults.data_dtype, resume=False)
    assert defaults.regenerate  # the target's own text, unless --no-regenerate

    def no_models(*args):
        raise AssertionError("the model was loaded before --data was checked")

    monkeypatch.setattr(common, "load_models", no_models)
    with pytest.raises(SystemExit, match="specdec train-eagle: --data: no such file: .*missing.txt"):
        cli.main(["train-eagle", "--model", "smollm2-135m", "--out", str(tmp_path),
                  "--data", str(tmp_path / "missing.txt")])
