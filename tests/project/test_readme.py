"""The README's code runs: its Python blocks execute in order (on the SmolLM2 demo model), its
`specdec` command lines parse with the CLI's own parser, and CI runs its test command."""

import re
import shlex
from pathlib import Path

import pytest

from specdec.cli import commands as cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, re.S)


def commands() -> list[list[str]]:
    """The README's shell command lines, split at `&&`."""
    lines = [line for lang, body in BLOCKS if lang == "bash" for line in body.strip().splitlines()]
    return [shlex.split(part, comments=True) for line in lines for part in line.split("&&")]


def test_ci_runs_the_readme_test_command():
    test_command = [body.strip() for lang, body in BLOCKS if lang == "bash" and "pytest" in body]
    assert len(test_command) == 1
    assert test_command[0] in (ROOT / ".ci" / "run").read_text()


def test_specdec_command_lines_parse():
    specdec_lines = [c for c in commands() if Path(c[0]).name == "specdec"]
    assert len(specdec_lines) >= 2
    for argv in specdec_lines:
        args = cli.build_parser().parse_args(argv[1:])
        assert args.command == argv[1] and callable(args.func)


@pytest.mark.real_model
def test_python_blocks_run():
    namespace: dict = {}
    python = [body for lang, body in BLOCKS if lang == "python"]
    assert len(python) >= 3
    for body in python:
        exec(compile(body, "README.md", "exec"), namespace)
