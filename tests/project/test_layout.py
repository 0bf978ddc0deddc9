"""The package's layers import one way (cli, integrations -> training, proposers -> loop -> model
-> ops), no module imports another's private names, and a proposer author's types import
without transformers."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "specdec"
# Each layer and the layers it may import (besides itself and the package's top-level modules).
ALLOWED = {
    "ops": set(),
    "model": {"ops"},
    "loop": {"ops", "model"},
    "proposers": {"ops", "model", "loop"},
    "training": {"ops", "model", "loop", "proposers"},
    "integrations": {"ops", "model", "loop", "proposers", "training"},
    "cli": {"ops", "model", "loop", "proposers", "training", "integrations"},
}


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every `import specdec...` and `from specdec... import names` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdec"):
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("specdec")]
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down_the_layers_and_take_no_private_names(path):
    own = path.relative_to(PACKAGE).parts[0]
    for module, names in imports(path):
        target = layer_of(module)
        if own in ALLOWED and target is not None and target != own:
            assert target in ALLOWED[own], f"{path.name}: the {own} layer imports {module}"
        # specdec._C is the compiled library, imported for its side effect of registering the ops
        private = [n for n in names if n.startswith("_") and n != "_C"]
        assert not private, f"{path.name} imports private names {private} from {module}"


def test_the_reference_imports_nothing_of_ours():
    assert imports(PACKAGE / "ops" / "reference.py") == []


def test_the_proposer_protocol_imports_without_transformers():
    code = ("import sys, specdec.loop.protocol, specdec.loop.options; "
            "assert 'transformers' not in sys.modules, sorted(m for m in sys.modules if 'transformers' in m)")
    subprocess.run([sys.executable, "-c", code], check=True)
