"""Post-release loss probes: losses at offsets that are a function of this step's released
gradient, on the same batch, noised, and handed to ``postprocess`` (its ``probed``) before the
optimizer steps.

Derivation used below: the model is a bias-free linear map with one output, ℓ_i(w) = w·x_i, so
at the candidate w − g̃ the batch's loss sum is Σ_i (w − g̃)·x_i, computed here from the released
gradient g̃ (``StepOutcome.noisy_gradient``) and the batch — not by the code under test.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import Method
from dpfy.types import ReleaseSpec
from dpfy.errors import PrivacyRefusal

STD, BOUND, N, D = 1e-4, 50.0, 12, 3


def linear_loss(model, batch):
    return model(batch[0]).reshape(-1)          # ℓ_i = w·x_i, (B,)


def minus_gradient(gradient):
    return {n: -g for n, g in gradient.items()}


class Probing(Method):
    """Probes the loss at θ − g̃ after the release."""

    def __init__(self, scale=0.0, bound=BOUND):
        self.scale, self.bound, self.probed, self.seen = scale, bound, [], []

    def releases(self, state, plan):
        return {"candidate": ReleaseSpec(self.bound, STD, kind="loss", offsets=minus_gradient,
                                         label="the loss sum at θ − g̃")}

    def update(self, state, released):
        self.seen.append(released)
        return state


class AlongGradient(Probing):
    """... and hands SGD ``scale``·g̃."""

    def postprocess(self, state, gradient, plan, probed, expected_batch_size):
        self.probed.append((dict(probed), expected_batch_size))
        return {n: g * self.scale for n, g in gradient.items()}


class NoSelection(Probing):
    """Declares the post-release probe but never reads it (no postprocess)."""


def _run(method, steps=2, **kw):
    torch.manual_seed(0)
    x = torch.randn(N, D)
    model = nn.Linear(D, 1, bias=False)
    model, opt, dl = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=1.0),
        DataLoader(TensorDataset(x, torch.zeros(N)), batch_size=N), poisson_sampling=False,
        noise_multiplier=1.0, max_grad_norm=1.0, method=method, seed=0, loss_fn=linear_loss,
        loss_reduction="sum", **kw)   # the loop's loss is a sum over the batch
    weights = []
    while opt.step_count < steps:            # one logical batch per pass
        for batch_x, _ in dl:
            if not opt.step_count and not weights or opt.updated:
                weights.append(model.weight.detach().clone())
            opt.zero_grad()
            model(batch_x).sum().backward()
            opt.step()
    return model, opt, x, weights


def test_probe_is_evaluated_at_the_released_gradient_and_reaches_the_method_before_the_step():
    method = AlongGradient(scale=0.0)
    model, opt, x, weights = _run(method)
    assert len(method.seen) == 2
    for released, w, (probed, b) in zip(method.seen, weights, method.probed):
        g = released.noisy_gradient["weight"]
        expected = float(((w - g) @ x.T).sum())                 # Σ_i (w − g̃)·x_i
        assert probed["candidate"] == pytest.approx(expected, abs=6 * STD)
        assert released.sums["candidate"] == probed["candidate"]
        assert b == N
    # scale 0: the step the optimizer took is the method's, not the raw g̃
    assert torch.equal(model.weight, weights[0])


def test_the_gradient_handed_to_the_optimizer_is_the_methods():
    method = AlongGradient(scale=2.0)
    model, _, _, weights = _run(method, steps=1)
    g = method.seen[0].noisy_gradient["weight"]
    assert torch.allclose(model.weight, weights[0] - 2.0 * g)


def test_ledger_records_the_post_release_probe_with_its_declared_noise():
    _, opt, _, _ = _run(AlongGradient())
    (group,) = list(opt.ledger)
    assert group.count == 2
    assert [(r.mechanism, r.noise_multiplier) for r in group.releases] == [
        ("gradient", 1.0), ("candidate", STD / BOUND)]


def test_a_split_logical_batch_is_refused_naming_the_fix_and_nothing_is_released():
    with pytest.raises(PrivacyRefusal, match="one physical batch.*max_physical_batch_size"):
        _run(AlongGradient(), max_physical_batch_size=5)


def test_a_method_that_would_drop_the_probes_is_refused():
    assert not NoSelection().implements("postprocess")
    with pytest.raises(PrivacyRefusal, match="must implement postprocess"):
        _run(NoSelection())


def test_post_release_losses_are_clipped_to_the_declared_sensitivity():
    method = AlongGradient(bound=0.05)
    _, _, x, weights = _run(method, steps=1)
    g = method.seen[0].noisy_gradient["weight"]
    expected = float(((weights[0] - g) @ x.T).clamp(-0.05, 0.05).sum())
    assert method.probed[0][0]["candidate"] == pytest.approx(expected, abs=6 * STD)


def test_the_per_step_sensitivity_assertion_covers_post_release_probes():
    from dpfy.noise import NoiseSource
    from dpfy.types.plan import StepPlan
    from dpfy.step.sums import StepSums

    spec = ReleaseSpec(1.0, STD, kind="loss", offsets=minus_gradient)
    sums = StepSums(plan=StepPlan(0, 1.0, 1.0, 1.0), specs={"candidate": spec})
    with pytest.raises(PrivacyRefusal, match="within its declared sensitivity 1"):
        sums.release_probes({"candidate": torch.tensor([0.5, 1.5])}, NoiseSource(0), "test")
