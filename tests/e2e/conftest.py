"""Fixtures shared by the end-to-end tests."""

import pytest
import torch


@pytest.fixture
def fresh_dynamo():
    """Each torch.compile test starts with dynamo's caches and counters and the flydsl backend's records empty."""
    from torch._dynamo.utils import counters
    from translator.frontends import compile_backend

    torch._dynamo.reset()
    counters.clear()
    compile_backend.reset()
    yield
    torch._dynamo.reset()
