"""Fixtures for the kernel tests."""

import pytest
import torch


@pytest.fixture
def poison_empty(monkeypatch):
    """Fill every floating-point `torch.empty` with NaN, so a kernel that skips part of
    its output fails instead of passing on whatever memory held before."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        tensor = real_empty(*args, **kwargs)
        if tensor.is_floating_point() and tensor.element_size() > 1:
            tensor.fill_(float("nan"))
        return tensor

    monkeypatch.setattr(torch, "empty", empty)
