"""Helpers shared by the tests (tests/ is on sys.path: tests/conftest.py sits there), by topic:

- support.ops: seeded random inputs for the op tests, comparisons, contract checks, DEVICES;
- support.models: tiny random-weight causal LMs (no download);
- support.passes: token trees and passes of the model layer;
- support.decoding: prompts, HF's greedy reference, the greedy-identity and sampling checks;
- support.proposers: Medusa heads for tests, recording wrappers, every method by name;
- support.training: a one-id-per-character tokenizer and a repeating text for the trainings;
- support.cuda_sim: the simulated GPU as a test device (docs/cuda_simulation.md).

``from support import X`` still gives the op helpers (the benchmarks in bench/ use them)."""

from support.ops import *  # noqa: F401,F403
