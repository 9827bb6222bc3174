"""Shared test setup: GPU tests skip cleanly on machines without one."""

from __future__ import annotations

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
# Small CPU tensors: one thread avoids oversubscription on 2-core CI machines (a tiny case went
# from 0.02 s to 0.65 s under load with torch's default threads).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
