"""Put tests/ on the path, so every test directory can import the shared oracles
(``oracles.py``: the float64 per-example loop; ``ledger_events.py``: ε by dp_accounting;
``model_cases.py``: the model zoo the grads and step tests run), and the shared fixtures."""

import os
import random
import sys
import zlib
from pathlib import Path

# torch's OpenMP threads (GNU libgomp) spin while they wait for each other unless told to
# sleep. The suite runs one xdist worker per core, each with torch's default of one thread per
# core, so a thread often waits for a peer that is off the CPU, and spinning burned CPU time
# for nothing: tests/grads with -n 2 took 50.6 s of CPU (27.8 s wall), 27.6 s (16.9 s) with
# PASSIVE. Only how idle threads wait changes: not the thread count, so not a route or a sum's
# order. libgomp reads the variable when torch loads it, hence before ``import torch``; the
# processes that tests start inherit it. A value set by the caller wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pytest
import torch
from hypothesis import settings
from torch import nn

from dpfy.noise.generator import _secure_words
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent / "data"))  # fake_idx, from any directory

from device_index import indexed_device  # noqa: E402  (tests/ is on the path from here on)

# Property tests draw the same examples on every run and have no per-example time limit (a
# loaded CI machine is not a bug); DPFY_FUZZ_RANDOM=1 draws fresh ones (docs/fuzzing.md).
settings.register_profile(
    "dpfy",
    deadline=None,
    derandomize=os.environ.get("DPFY_FUZZ_RANDOM") != "1",
    database=None,
)
settings.load_profile("dpfy")


@pytest.fixture(autouse=True)
def _reproducible_randomness(request, monkeypatch):
    """Every test draws the same randomness on every run, wherever xdist schedules it.

    A CI gate that passes or fails by the draw is no gate: a statistical test with a 0.999
    acceptance region fails one run in a thousand. So each test starts from seeds derived from
    its own node id, for torch, numpy and ``random``, and ``os.urandom`` becomes a seeded
    stream for the test (mixed with the process id, so a forked child still draws other bytes
    than its parent, as the secure generators' fork tests require). The library code is
    unchanged: it still calls ``os.urandom`` for every secure draw. A test that must read the
    OS's entropy marks itself ``@pytest.mark.os_entropy``.
    """
    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    if request.node.get_closest_marker("os_entropy") is not None:
        return
    streams: dict[int, np.random.Generator] = {}

    def seeded_urandom(n: int) -> bytes:
        pid = os.getpid()
        if pid not in streams:
            streams[pid] = np.random.default_rng([seed, pid & 0xFFFFFFFF])
        return streams[pid].bytes(n)

    monkeypatch.setattr(os, "urandom", seeded_urandom)
    # secure_uniform's process-wide stream is keyed at its first use: start it afresh, so its
    # key comes from this test's stream and not from whichever test ran first in the worker.
    monkeypatch.setattr(_secure_words, "_source", None)


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
    """A device the test runs on, as a ``torch.device`` with its index (``cpu``, then
    ``cuda:<current>`` if present), so ``tensor.device == device`` holds for tensors made there."""
    return indexed_device(request.param)


@pytest.fixture(autouse=True)
def _torch_process_settings():
    """Each test starts with the worker's torch thread count and default device, whatever the
    tests before it in the same xdist worker did. The count chooses routes (the fused ghost-norm
    kernel runs only on one thread), so a test that left it at 1 changed what later tests ran:
    issue 35 §1's worker crashes appeared only in that order."""
    threads, default = torch.get_num_threads(), torch.get_default_device()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if torch.get_default_device() != default:
        torch.set_default_device(default)


@pytest.fixture
def interrupt(monkeypatch):
    """``interrupt(cfg, out, after_epochs=k)``: run the TrainConfig ``cfg`` and stop it after k
    epochs (the training and command-line tests)."""
    import dpfy.train.trainer as trainer_mod
    from dpfy.train import train

    def run(cfg, out: Path, *, after_epochs: int) -> None:
        real, calls = trainer_mod.run_epoch, []

        def crash(*args, **kwargs):
            calls.append(1)
            if len(calls) > after_epochs:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(trainer_mod, "run_epoch", crash)
        try:
            with pytest.raises(KeyboardInterrupt):
                train(cfg, out=out, progress=False, echo=lambda s: None)
        finally:
            monkeypatch.setattr(trainer_mod, "run_epoch", real)

    return run
