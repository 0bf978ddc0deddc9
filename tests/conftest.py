import os

import pytest
from support import DEVICES

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param
