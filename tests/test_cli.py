"""The `specdec` command."""

import pytest

from specdec import cli


def test_models_lists_the_named_models(capsys):
    cli.main(["models"])
    out = capsys.readouterr().out
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert name in out


def test_generate_needs_a_prompt():
    with pytest.raises(SystemExit):
        cli.main(["generate", "--model", "smollm2-135m", "--prompt-lookup"])


@pytest.mark.real_model
def test_generate_with_prompt_lookup_reports_and_matches_the_target(capsys):
    cli.main(["generate", "--model", "smollm2-135m", "--prompt-lookup", "--chat", "--max-new-tokens", "24",
              "--prompt", "Repeat this line twice: the quick brown fox jumps over the lazy dog"])
    out = capsys.readouterr().out
    assert "speed-up:" in out and "acceptance rate:" in out and "mean accepted length" in out
    assert "identical to the target alone: yes" in out
