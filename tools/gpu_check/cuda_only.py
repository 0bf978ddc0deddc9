"""pytest plugin of the GPU check (tools/gpu_check.sh, step b): keeps only the tests that run on
CUDA, i.e. those whose parametrisation holds the device "cuda" (the op tests' and decoder tests'
``device`` fixture and parameters: tests/support/ops.DEVICES, which lists "cuda" when torch sees
a GPU). The CPU runs of the same tests are CI's. Load it with ``-p cuda_only`` with
tools/gpu_check on the Python path. No test selected is an error (exit 5), not a pass.
"""

from __future__ import annotations


def _on_cuda(item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    return any(str(value) == "cuda" for value in callspec.params.values())


def pytest_collection_modifyitems(config, items):
    keep = [item for item in items if _on_cuda(item)]
    dropped = [item for item in items if not _on_cuda(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
