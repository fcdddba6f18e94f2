"""``--flush-denormal``: the task turns on torch's flush-to-zero, and only when asked."""

import pytest
import torch
from conftest import build_task_model

DENORMAL = 1e-39  # below float32's smallest normal number (1.18e-38)


def _flushes() -> bool:
    return float(torch.tensor([DENORMAL], dtype=torch.float32) * 1.0) == 0.0


@pytest.fixture
def restore_flush():
    yield
    torch.set_flush_denormal(False)


def test_flush_denormal_is_off_by_default_and_on_when_asked(odd_dict_dir, restore_flush):
    torch.set_flush_denormal(False)
    build_task_model(odd_dict_dir)
    assert not _flushes()
    build_task_model(odd_dict_dir, "--flush-denormal")
    assert _flushes()
