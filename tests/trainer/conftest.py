"""Trainer tests run single-threaded on tiny local models."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # Tiny tensors: more threads only add contention on a shared 2-core machine.
    torch.set_num_threads(1)
