"""Put tests/ on the path, so every test directory can import the shared oracles
(``oracles.py``: the float64 per-example loop; ``ledger_events.py``: ε by dp_accounting;
``model_cases.py``: the model zoo the grads and step tests run), and the shared fixtures."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def toy():
    """A tiny classification set and MLP (fast end-to-end tests)."""
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    return model, ds


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    """No C compiler and an empty library cache: the compiled samplers cannot be built."""
    from dpfy.native import build
    monkeypatch.setenv("CC", "dpfy-no-such-compiler")
    monkeypatch.setenv("DPFY_CACHE_DIR", str(tmp_path))
    build.load.cache_clear()
    yield
    build.load.cache_clear()


# The devices a test parametrized over ``device`` runs on: the CPU always, CUDA where
# torch sees a GPU (skipped cleanly elsewhere). benchmarks/gpu.py runs the CUDA ones.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ),
]


@pytest.fixture(params=DEVICES)
def device(request):
    """A device the test runs on, as a ``torch.device``: ``cpu``, then ``cuda`` if present."""
    return torch.device(request.param)
