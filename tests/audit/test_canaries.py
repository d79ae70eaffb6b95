"""Canaries through dpfy's real private step: a correct run's audit stays below its claimed ε,
a run whose noise is cut behind the ledger's back is caught."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import dpfy.noise
from dpfy.adaptive.base import REGISTRY
from dpfy.audit.canaries import CanaryDataset, CanaryGradients, CanarySet
from dpfy.audit.run import audit_result, audited_private_run
from dpfy.types.plan import StepPlan
from dpfy.train.epoch import run_epoch

DELTA = 1e-5


def _data(n: int = 100, features: int = 500, classes: int = 10):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(1)
    return TensorDataset(x, y)


def _audit(noise_scale: float, *, canaries: int = 1000, sigma: float = 8.0, epochs: int = 16):
    """Logistic regression (5,010 parameters) on 100 synthetic examples plus the included
    canaries, full-batch Poisson (q = 1), σ = 8, 16 steps: the claim is the Gaussian
    mechanism's μ = √16/8 = 0.5, ε ≈ 2 at δ = 1e-5. ``noise_scale`` multiplies the noise std
    the engine adds (the ledger still records σ)."""
    torch.manual_seed(0)
    model = nn.Linear(500, 10)
    draw = CanarySet.draw(model, canaries, torch.Generator().manual_seed(1))
    train = _data()
    audited = audited_private_run(
        model, torch.optim.SGD(model.parameters(), lr=0.1), train, canaries=draw,
        batch_size=len(train) + int(draw.included.sum()), epochs=epochs,
        noise_multiplier=sigma, max_grad_norm=1.0, seed=0)
    original = dpfy.noise.NoiseSource.noisy_mean

    def noisy_mean(self, total, std, normalizer, **kw):
        return original(self, total, std * noise_scale, normalizer, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpfy.noise.NoiseSource, "noisy_mean", noisy_mean)
        for _ in range(epochs):
            run_epoch(audited.private, delta=DELTA)
    assert audited.private.sample_rate == 1.0
    return audit_result(audited.private, draw, delta=DELTA)


def test_correct_run_stays_below_the_claim() -> None:
    result = _audit(1.0)
    assert result.steps == 16
    assert 0 <= result.one_run.epsilon <= result.claimed_epsilon
    assert 0 <= result.fdp.epsilon <= result.claimed_epsilon
    assert not result.exceeded


def test_noise_cut_behind_the_ledgers_back_is_caught() -> None:
    # σ × 0.2: the true mechanism is μ = 2.5 while the ledger claims μ = 0.5.
    result = _audit(0.2)
    assert result.one_run.epsilon > result.claimed_epsilon
    assert result.fdp.epsilon > result.claimed_epsilon
    assert result.exceeded


def test_directions_are_orthonormal_and_secretly_drawn() -> None:
    model = nn.Linear(30, 4)                                  # d = 124
    draw = CanarySet.draw(model, 20, torch.Generator().manual_seed(3))
    u = draw.directions.double()
    assert torch.allclose(u @ u.T, torch.eye(20, dtype=torch.float64), atol=1e-6)
    many = CanarySet.draw(model, 200, torch.Generator().manual_seed(3))  # m > d: i.i.d.
    assert torch.allclose(many.directions.norm(dim=1), torch.ones(200), atol=1e-6)
    assert 0 < int(CanarySet.draw(model, 200).included.sum()) < 200     # OS-seeded default


def test_transform_replaces_only_canary_rows_by_C_u() -> None:
    model = nn.Linear(3, 2)                                   # d = 8
    draw = CanarySet.draw(model, 4, torch.Generator().manual_seed(5))
    data = CanaryDataset(_data(5, 3, 2), draw, (torch.zeros(3), torch.tensor(0)))
    probe = CanaryGradients(draw, data)

    class Cursor:
        indices = torch.tensor([0, 5, 3, 5 + len(data.in_ids) - 1])
    probe.bind(Cursor())
    per_sample = {"weight": torch.ones(4, 2, 3), "bias": torch.ones(4, 2)}
    out = probe.transform(probe.init(), per_sample, StepPlan(step=0, sample_rate=1.0,
                                                              noise_multiplier=1.0, clip=0.5))
    flat = torch.cat([out["weight"].reshape(4, -1), out["bias"]], dim=1)
    assert torch.equal(flat[[0, 2]], torch.ones(2, 8))        # real rows untouched
    first, last = data.in_ids[0], data.in_ids[-1]
    assert torch.allclose(flat[1], 0.5 * draw.directions[first])
    assert torch.allclose(flat[3], 0.5 * draw.directions[last])
    assert torch.allclose(flat[[1, 3]].norm(dim=1), torch.full((2,), 0.5))


def test_not_a_training_method() -> None:
    assert CanaryGradients.registry_name not in REGISTRY
    from dpfy.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--method", "_audit_canaries", "--bogus"])


class _OnGPU(torch.Tensor):
    """A tensor on another device, as torch treats one: an operation that mixes it with a host
    float tensor of one or more dimensions raises ("Expected all tensors to be on the same
    device"); ``.cpu()`` brings it to the host and ``host.to(it)`` to the device; host indices
    and scalars may index or scale it (as on CUDA)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cpu:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).as_subclass(torch.Tensor)
        if func is torch.Tensor.to and any(isinstance(a, cls) for a in args[1:]):
            with torch._C.DisableTorchFunctionSubclass():  # moved to the device
                return func(*args, **kwargs).as_subclass(cls)
        leaves = [
            a
            for a in torch.utils._pytree.tree_flatten((args, kwargs))[0]
            if isinstance(a, torch.Tensor)
        ]
        with torch._C.DisableTorchFunctionSubclass():  # host values, not indices or scalars
            host = [
                t
                for t in leaves
                if not isinstance(t, cls) and t.dim() > 0 and t.is_floating_point()
            ]
        if host and any(isinstance(t, cls) for t in leaves):
            raise RuntimeError(f"Expected all tensors to be on the same device ({func})")
        return super().__torch_function__(func, types, args, kwargs)


def test_canaries_score_and_replace_gradients_on_a_gpu() -> None:
    """``dpfy audit`` trains on the GPU where there is one (``--device auto``): the canaries'
    directions are drawn on the host, the per-example and released gradients are on the
    device. Before, the projection multiplied the two and the replacement wrote host rows into
    device gradients: both refused by torch across devices (emulated by ``_OnGPU``)."""
    model = nn.Linear(3, 2)  # d = 8
    draw = CanarySet.draw(model, 4, torch.Generator().manual_seed(5))
    data = CanaryDataset(_data(5, 3, 2), draw, (torch.zeros(3), torch.tensor(0)))
    probe = CanaryGradients(draw, data)

    class Cursor:
        indices = torch.tensor([0, 5])

    probe.bind(Cursor())
    per_sample = {
        "weight": torch.ones(2, 2, 3).as_subclass(_OnGPU),
        "bias": torch.ones(2, 2).as_subclass(_OnGPU),
    }
    plan = StepPlan(step=0, sample_rate=1.0, noise_multiplier=1.0, clip=0.5)
    out = probe.transform(probe.init(), per_sample, plan)
    flat = torch.cat([out["weight"].reshape(2, -1), out["bias"]], dim=1).cpu()
    assert torch.allclose(flat[1], 0.5 * draw.directions[data.in_ids[0]])
    released = {n: t[1].cpu().as_subclass(_OnGPU) for n, t in out.items()}
    scores = draw.project(released).cpu()
    want = draw.directions.double() @ flat[1].double()  # ⟨0.5·u_j0, u_j⟩, on the host
    # float32 dot products of d = 8 terms of unit vectors scaled by 0.5: error ≤ 8·2⁻²⁴·0.5
    assert torch.allclose(scores, want, rtol=0, atol=8 * 2.0**-24)
