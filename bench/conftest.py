import sys
from pathlib import Path

# The benchmarks reuse the tests' seeded input generators (tests/support/ops.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
