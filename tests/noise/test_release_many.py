"""noisy_means: the step's sums released at once on the device path, with the per-tensor values.

On a device each per-tensor operation is a launch; :func:`dpfy.noise.release.noisy_means` draws
a group of tensors' noise in one generator call (each tensor's values starting at a sampler
block, as its own call would) and does the division and the addition as foreach operations. A
seeded run's noise must not change: the result is compared with :meth:`NoiseSource.noisy_mean`
tensor by tensor, forced onto the device path on the CPU (the same kernels elementwise, so
equal bit for bit on one machine).
"""

from __future__ import annotations

import pytest
import torch

from dpfy.native.gaussian import BLOCK
from dpfy.noise import NoiseSource, generator, release
from dpfy.noise.device_gaussian import DeviceChaChaGaussian


@pytest.fixture
def on_device(monkeypatch):
    """The device path on the CPU, with a small device chunk (a multiple of 2·BLOCK) so a
    tensor of a few thousand entries is drawn in several chunks, and a small pending bound."""
    monkeypatch.setattr(NoiseSource, "_on_device", lambda self, device: True)
    monkeypatch.setattr(generator, "DEVICE_CHUNK", 4 * BLOCK)
    monkeypatch.setattr(release, "DEVICE_CHUNK", 4 * BLOCK)
    monkeypatch.setattr(release, "PENDING", 6 * BLOCK)


def _sums():
    g = torch.Generator().manual_seed(1)
    shapes = [(3, 5), (7,), (9 * BLOCK + 3,), (2, 2 * BLOCK), ()]
    return [torch.randn(s, generator=g) for s in shapes]


@pytest.mark.parametrize("seed", [0, 7])
def test_the_same_values_as_one_call_per_tensor(on_device, seed):
    source = NoiseSource(seed)
    one = [source.noisy_mean(t, 1.3, 8.0, chunk=1) for t in _sums()]  # chunks: the device's
    many = release.noisy_means(NoiseSource(seed), _sums(), 1.3, 8.0)
    assert len(many) == len(one)
    for a, b in zip(many, one):
        assert a.shape == b.shape and torch.equal(a, b)


def test_in_place_and_exact_without_noise(on_device):
    sums = _sums()
    out = release.noisy_means(NoiseSource(0), sums, 0.0, 4.0)
    for t, r, o in zip(sums, _sums(), out):
        assert o is t
        assert torch.equal(t, r / 4.0)


def _keyed(source: NoiseSource) -> NoiseSource:
    """``source`` with its CPU "device" stream a ChaCha20 one under a fixed key (the secure
    device generator, made comparable across two sources)."""
    source._devices[torch.device("cpu")] = DeviceChaChaGaussian("cpu", key=bytes(range(32)))
    return source


def test_the_secure_chacha_stream_too(on_device):
    # counter-based: one call over the aligned group reads the blocks the per-tensor calls read
    one = _keyed(NoiseSource())
    want = [one.noisy_mean(t, 1.3, 8.0, chunk=1) for t in _sums()]
    got = release.noisy_means(_keyed(NoiseSource()), _sums(), 1.3, 8.0)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_one_generator_call_per_group(on_device, monkeypatch):
    calls = []
    normal = DeviceChaChaGaussian.normal

    def counted(self, n):
        calls.append(n)
        return normal(self, n)

    monkeypatch.setattr(DeviceChaChaGaussian, "normal", counted)
    monkeypatch.setattr(release, "PENDING", 1 << 20)  # every tensor fits one group
    shapes = [(3, 5), (7,), (), (2, 9)]
    release.noisy_means(_keyed(NoiseSource()), [torch.zeros(s) for s in shapes], 1.0, 1.0)
    # one call; each tensor starts at a multiple of 2·BLOCK = 512 values: 4 blocks in all
    assert calls == [4 * 2 * BLOCK]
