"""The `specdec` command."""

import pytest
import torch

from specdec import cli
from specdec.cli import common


def test_models_lists_the_named_models(capsys):
    cli.main(["models"])
    out = capsys.readouterr().out
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert name in out


def test_generate_needs_a_prompt():
    with pytest.raises(SystemExit):
        cli.main(["generate", "--model", "smollm2-135m", "--prompt-lookup"])


@pytest.mark.real_model
@pytest.mark.parametrize("method", [["--prompt-lookup"], ["--lookahead", "--window", "3", "--ngram", "3"],
                                    ["--prompt-lookup", "--draft", "smollm2-135m"],
                                    ["--draft", "smollm2-135m", "--draft-tree", "3"],
                                    ["--draft", "smollm2-135m", "--draft-lookup", "4"]])
def test_generate_reports_and_matches_the_target(method, capsys):
    cli.main(["generate", "--model", "smollm2-135m", *method, "--chat", "--max-new-tokens", "24",
              "--prompt", "Repeat this line twice: the quick brown fox jumps over the lazy dog"])
    captured = capsys.readouterr()
    out = captured.out
    assert "speed-up:" in out and "acceptance rate:" in out and "mean accepted length" in out
    assert "identical to the target alone: yes" in out
    if "--prompt-lookup" in method and "--draft" in method:  # several proposer flags: one ensemble
        assert "speculative (ensemble of prompt lookup, draft model smollm2-135m)" in captured.err
    if "--draft-tree" in method:
        assert "speculative (draft model smollm2-135m, tree of 3 branches)" in captured.err
    if "--draft-lookup" in method:
        assert "speculative (draft model smollm2-135m, taking up to 4 copied tokens per pass)" in captured.err


@pytest.mark.real_model
def test_bench_writes_a_table_json_and_plot(tmp_path):
    import json

    # One short prompt: every method's row is what this test is for (the built-in sets' long
    # prompts, and the "mixed" rows of several sets, are test_bench_runs_the_sets_of_a_prompt_file's).
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Repeat: the cat sat on the mat, the cat sat on the mat.", "set": "editing"}\n')
    cli.main(["bench", "--model", "smollm2-135m", "--draft", "smollm2-135m", "--prompt-file", str(prompts),
              "--max-new-tokens", "6", "--draft-head-tokens", "20000", "--draft-trees", "2", "--out", str(tmp_path)])
    stem = "bench_smollm2-135m_float32"
    record = json.loads((tmp_path / f"{stem}.json").read_text())
    methods = {"plain", "hf_prompt_lookup", "hf_assisted", "specdec_one_token", "specdec_prompt_lookup",
               "specdec_lookahead", "specdec_draft", "specdec_draft_head20000", "specdec_draft_tree2",
               "specdec_draft_lookup", "specdec_hybrid"}
    assert {r["method"] for r in record["runs"]} == methods
    assert len(record["runs"]) == len(methods)
    assert all(r["new_tokens"] == 6 and r["identical_to_plain"] for r in record["runs"])
    assert all(r["identical_to_one_token"] for r in record["runs"] if r["method"].startswith("specdec"))
    assert "| editing | specdec_draft |" in (tmp_path / f"{stem}.md").read_text()
    assert (tmp_path / f"{stem}.png").stat().st_size > 0


def test_bench_rejects_a_bad_prompt_file_before_loading_models(tmp_path, monkeypatch):
    def no_models(args):
        raise AssertionError("models loaded before the prompt file was checked")

    monkeypatch.setattr(common, "load_models", no_models)
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(SystemExit, match=r"--prompt-file: .*prompts\.jsonl:2: not valid JSON"):
        cli.main(["bench", "--model", "smollm2-135m", "--prompt-file", str(path)])
    with pytest.raises(SystemExit, match="--prompt-file: .*missing.txt"):
        cli.main(["bench", "--model", "smollm2-135m", "--prompt-file", str(tmp_path / "missing.txt")])


@pytest.mark.real_model
def test_bench_runs_the_sets_of_a_prompt_file(tmp_path):
    import json

    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "Say hello.", "set": "greet"}\n{"prompt": "Count to five."}\n'
                    '{"prompt": "Say goodbye.", "set": "greet"}\n')
    cli.main(["bench", "--model", "smollm2-135m", "--prompt-file", str(path), "--prompts", "1",
              "--max-new-tokens", "4", "--methods", "specdec_prompt_lookup", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "bench_smollm2-135m_float32.json").read_text())
    assert record["meta"]["prompt_file"] == str(path)
    assert [(r["prompt_set"], r["prompt"]) for r in record["runs"] if r["method"] == "plain"] == [
        ("greet", 0), ("custom", 0)]
    assert {r["method"] for r in record["runs"]} == {"plain", "specdec_prompt_lookup"}
    # Every set, and all of them together.
    mixed = [s for s in record["summary"] if s["set"] == "mixed" and s["method"] == "specdec_prompt_lookup"]
    assert {s["set"] for s in record["summary"]} == {"greet", "custom", "mixed"}
    runs = [r for r in record["runs"] if r["method"] == "specdec_prompt_lookup"]
    assert mixed[0]["tok/s"] == pytest.approx(sum(r["new_tokens"] for r in runs) / sum(r["seconds"] for r in runs))
    with pytest.raises(SystemExit, match="no such rows"):
        cli.main(["bench", "--model", "smollm2-135m", "--prompt-file", str(path), "--methods", "specdec_nothing",
                  "--out", str(tmp_path)])


def test_bad_lookahead_settings_exit_with_a_message_before_loading_models(monkeypatch):
    def no_models(args):
        raise AssertionError("models loaded before the lookahead settings were checked")

    monkeypatch.setattr(common, "load_models", no_models)
    for flag, value, match in [("--window", "0", "window must be >= 1"), ("--ngram", "1", "ngram must be >= 2"),
                               ("--guess-set", "-1", "guess_set must be >= 0")]:
        with pytest.raises(SystemExit, match=f"specdec generate: Lookahead: {match}"):
            cli.main(["generate", "--model", "smollm2-135m", "--lookahead", flag, value, "--prompt", "x"])


def test_bad_draft_tree_exits_before_loading_models(monkeypatch, capsys):
    monkeypatch.setattr(common, "load_models", lambda args: pytest.fail("models loaded"))
    with pytest.raises(SystemExit):
        cli.main(["generate", "--model", "smollm2-135m", "--draft", "x", "--draft-tree", "0", "--prompt", "x"])
    assert "--draft-tree: must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["generate", "--model", "smollm2-135m", "--draft", "x", "--draft-lookup", "-1", "--prompt", "x"])
    assert "--draft-lookup: must be >= 0" in capsys.readouterr().err


def test_typical_needs_sampling():
    with pytest.raises(SystemExit, match="--sample"):
        cli.main(["generate", "--model", "smollm2-135m", "--prompt-lookup", "--typical", "0.09",
                  "--prompt", "hi", "--no-accelerate"])


@pytest.mark.real_model
def test_generate_typical_says_lossy_and_caps_candidates(capsys, monkeypatch):
    import specdec

    seen = {}
    real = specdec.generate

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(specdec, "generate", spy)
    cli.main(["generate", "--model", "smollm2-135m", "--prompt-lookup", "--chat", "--max-new-tokens", "8",
              "--sample", "--typical", "0.09", "--num-draft-tokens", "3",
              "--prompt", "Repeat this line twice: the quick brown fox jumps over the lazy dog"])
    assert "lossy: typical acceptance" in capsys.readouterr().out
    assert seen["typical"] == specdec.TypicalAcceptance(0.09, 0.3)
    assert seen["method"].max_draft_tokens == 3


@pytest.mark.real_model
def test_bench_eagle_rows_alone_and_with_prompt_lookup(tmp_path):
    import json

    import specdec

    # An untrained drafter: the rows' exactness does not depend on what it drafts.
    target, _ = specdec.models.load("smollm2-135m")
    specdec.EagleDrafter.for_target(target, 4096).save(tmp_path / "drafter")
    prompts = tmp_path / "p.txt"
    prompts.write_text("Repeat: the cat sat on the mat, the cat sat on the mat.\n")
    cli.main(["bench", "--model", "smollm2-135m", "--prompt-file", str(prompts), "--max-new-tokens", "8",
              "--eagle", str(tmp_path / "drafter"), "--out", str(tmp_path),
              "--methods", "specdec_one_token", "specdec_eagle", "specdec_eagle_hybrid"])
    runs = json.loads((tmp_path / "bench_smollm2-135m_float32.json").read_text())["runs"]
    assert {r["method"] for r in runs} == {"plain", "specdec_one_token", "specdec_eagle", "specdec_eagle_hybrid"}
    assert all(r["new_tokens"] == 8 and r["identical_to_plain"] for r in runs)


@pytest.mark.real_model
def test_bench_medusa_with_a_typical_sweep(tmp_path):
    import json

    import specdec

    target, _ = specdec.models.load("smollm2-135m")
    heads_dir = tmp_path / "heads"
    specdec.MedusaHeads.for_target(target, 2, torch.arange(4096)).save(heads_dir)
    prompts = tmp_path / "p.txt"
    prompts.write_text("Write a Python function that adds two numbers.\n")
    cli.main(["bench", "--model", "smollm2-135m", "--prompt-file", str(prompts), "--max-new-tokens", "8",
              "--medusa", str(heads_dir), "--typical-sweep", "0.09,0.3", "--out", str(tmp_path),
              "--methods", "specdec_medusa", "specdec_medusa_sampled", "specdec_medusa_typical0.09",
              "specdec_medusa_typical0.3"])
    runs = json.loads((tmp_path / "bench_smollm2-135m_float32.json").read_text())["runs"]
    by = {r["method"]: r for r in runs}
    assert set(by) >= {"specdec_medusa", "specdec_medusa_sampled", "specdec_medusa_typical0.09",
                       "specdec_medusa_typical0.3"}
    assert by["specdec_medusa"]["identical_to_plain"] and by["specdec_medusa"]["greedy_prefix"] == 1.0
    assert all(0 <= r["greedy_prefix"] <= 1 for r in runs if r["greedy_prefix"] is not None)
