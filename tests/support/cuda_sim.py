"""The CUDA simulation as a test device (docs/cuda_simulation.md).

When ``SPECDEC_CUDA_SIM_LIB`` names the simulation's library (tools/cuda_sim.sh sets it), the op
tests run once more on the device ``cuda_sim``: their tensors stay on the CPU, and every
``torch.ops.specdec`` op they call runs the CUDA kernels of ``torch.ops.specdec_cuda_sim``
instead (the kernels of csrc/cuda, compiled by the host compiler and run by the simulator), as on
a GPU: without the CPU kernels' value checks and with the CUDA tolerances."""

from __future__ import annotations

import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

LIBRARY = os.environ.get("SPECDEC_CUDA_SIM_LIB")


class SimDevice(str):
    """The device argument of a test on the simulated GPU: the string "cpu" to torch (where its
    tensors live), equal to "cuda_sim" and to nothing else in a test's comparisons, so that
    `device == "cpu"` branches (value checks, exact draws) take their CUDA side."""

    def __new__(cls) -> "SimDevice":
        return super().__new__(cls, "cpu")

    def __eq__(self, other: object) -> bool:
        return other == "cuda_sim"

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__


class RouteToSimulation(TorchDispatchMode):
    """Runs every specdec op through its simulated CUDA kernel."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "specdec":
            func = getattr(getattr(torch.ops.specdec_cuda_sim, func._opname), func._overloadname)
        return func(*args, **(kwargs or {}))


def load() -> bool:
    """Loads the simulation's library when it is given; returns whether it is."""
    if LIBRARY:
        torch.ops.load_library(LIBRARY)
    return bool(LIBRARY)
