import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Every op test runs on each device present: CPU here, CUDA too wherever a GPU exists.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param
