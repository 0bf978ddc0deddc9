import os

import pytest
from support import DEVICES, cuda_sim

os.environ.setdefault("HF_HUB_OFFLINE", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Workers of `pytest -n N` share the machine's cores: each takes its share of torch threads.
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _cuda_sim_routing(request):
    """On the simulated GPU (the cuda_sim device parameter), specdec's ops run its CUDA kernels.
    Tests of the ops' torch.library registration (opcheck, torch.compile, fake kernels) do not
    run there: they check specdec's registration, which the simulation does not change."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or not isinstance(callspec.params.get("device"), cuda_sim.SimDevice):
        yield
        return
    if any(word in request.node.name for word in ("opcheck", "compile", "fake")):
        pytest.skip("checks specdec's op registration, not the CUDA kernels")
    with cuda_sim.RouteToSimulation():
        yield
