"""Shared test settings: one torch thread everywhere (tiny models run fastest on one thread, and CI has two cores)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
