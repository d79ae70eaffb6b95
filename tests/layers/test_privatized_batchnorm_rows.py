"""Privatized BatchNorm statistics: every release is the private batch's, one row per example,
and recorded (review regressions; dpfy.layers.privatized_batchnorm).

The recorded sensitivities A·√C and A²·√C hold when each example is one row of the layer's input
(its positions averaged before the clipping). Derivation for a layer fed T rows per example
(a sequence flattened to (B·T, C)): removing one example removes T clipped rows, so the sum
moves by up to T·A·√C, T times what the ledger records; the engine's rows check does not see
the layer when no gradient of it is used (affine=False, or frozen affine parameters). Such a
release, or one from a tensor that is not the loader's batch, must be refused before it is drawn.
A model made private that contains layers whose statistics were never attached (the converted
part is a sub-module of it) must refuse too: its steps would record no statistics release.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import PrivacyRefusal
from dpfy.layers.batchnorm_setup import attach_privatized_statistics
from dpfy.layers.privatized_batchnorm import privatized_batchnorm

X = torch.randn(40, 5, 3)  # (N, T, features): 5 positions per example
Y = torch.arange(40) % 2


class Sequence(nn.Module):
    """A linear layer per position, a BatchNorm1d over the positions, a mean-pooled head."""

    def __init__(self, *, flatten: bool, affine: bool = True) -> None:
        super().__init__()
        self.flatten = flatten
        self.a, self.bn, self.b = nn.Linear(3, 4), nn.BatchNorm1d(4, affine=affine), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)  # (B, T, C)
        if self.flatten:  # T rows per example
            b, t, c = h.shape
            h = self.bn(h.reshape(b * t, c)).reshape(b, t, c)
        else:  # (B, C, T): one row per example, its positions averaged
            h = self.bn(h.transpose(1, 2)).transpose(1, 2)
        return self.b(h).mean(1)


def _private(model: nn.Module, *, attach: bool = True, stats_of: nn.Module | None = None):
    stats = privatized_batchnorm(
        stats_of or model,
        bound=1.0,
        noise_multiplier=3.0,
        expected_batch_size=None if stats_of is None else 10.0,
    )
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    loader = DataLoader(TensorDataset(X, Y), batch_size=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the seed warning
        model, opt, loader = dpfy.make_private(model, opt, loader, noise_multiplier=1.0, seed=0)
    if attach:
        attach_privatized_statistics(stats, opt)
    return model, opt, loader, stats


def _train(model, opt, loader) -> None:
    for xb, yb in loader:
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("frozen", [False, True], ids=["affine_false", "frozen_affine"])
def test_several_rows_per_example_are_refused_before_the_release(frozen):
    torch.manual_seed(0)
    model = Sequence(flatten=True, affine=frozen)
    if frozen:
        model.bn.weight.requires_grad_(False)
        model.bn.bias.requires_grad_(False)
    model, opt, loader, stats = _private(model)
    with pytest.raises(PrivacyRefusal, match="one row per example"):
        _train(model, opt, loader)
    assert stats.releases_made == 0 and len(opt.ledger) == 0


def test_a_tensor_other_than_the_pending_batch_is_refused():
    torch.manual_seed(0)
    model, opt, loader, stats = _private(Sequence(flatten=False))
    xb, yb = next(iter(loader))
    with pytest.raises(PrivacyRefusal, match="one row per example"):
        model(X)  # all 40 examples, not the sampled batch the step records
    assert stats.releases_made == 0


def test_one_row_per_example_trains_and_records_every_release():
    """What is fine stays accepted: the (B, C, T) form, whose clipped per-example means are
    bounded by A·√C (the layer's own tests check the sums)."""
    torch.manual_seed(0)
    model, opt, loader, stats = _private(Sequence(flatten=False, affine=False))
    _train(model, opt, loader)
    assert len(opt.ledger) >= 1 and stats.releases_made == len(opt.ledger)
    for group in opt.ledger.step_groups:
        assert [r.mechanism for r in group.releases] == ["gradient", "bn_mean:bn", "bn_square:bn"]


def test_a_converted_sub_module_of_a_private_model_refuses_without_the_attach():
    """The statistics of a converted sub-module (expected batch size given, as for a loop of
    one's own) inside a model made private: its forward must refuse until they are attached."""
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Sequential(backbone, nn.Linear(4, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x[:, 0])  # the first position only

    model, opt, loader, stats = _private(Head(), attach=False, stats_of=backbone)
    with pytest.raises(PrivacyRefusal, match="attach_privatized_statistics"):
        _train(model, opt, loader)
    assert stats.releases_made == 0 and len(opt.ledger) == 0


class ZeroNoise:
    """No noise (the sums themselves are compared)."""

    def gaussian(self, like: torch.Tensor, std: float) -> torch.Tensor:
        return torch.zeros_like(like)


@pytest.mark.parametrize("bad", [float("nan"), "inf_and_minus_inf"])
def test_a_non_finite_example_moves_the_sums_by_at_most_the_sensitivity(bad):
    """clamp does not bound NaN: an example whose channel mean is NaN (a NaN value, or +inf and
    −inf at two positions) made the released sums NaN, folded into the running estimates that
    ship with the model: a deterministic trace of that example. Its clipped mean must stay in
    [−A, A] (and its mean of squares in [0, A²]) like any other example's."""
    model = nn.Sequential(nn.BatchNorm1d(2, affine=False))
    stats = privatized_batchnorm(model, bound=1.0, noise_multiplier=1.0, expected_batch_size=1.0)
    stats.noise = ZeroNoise()
    layer = model[0].train()
    h = torch.randn(6, 2, 4)
    mean1, var1 = (t.clone() for t in stats.statistics(layer, h))
    stats.commit()
    odd = torch.zeros(1, 2, 4)
    if bad == "inf_and_minus_inf":
        odd[0, :, 0], odd[0, :, 1] = float("inf"), float("-inf")
    else:
        odd[0, 0, 0] = bad
    mean2, _ = stats.statistics(layer, torch.cat([h, odd]))
    assert torch.isfinite(mean2).all()
    # b = 1 and no noise: the released mean is the sum; one example moves it by ≤ A·√C = √2
    assert (mean2 - mean1).norm().item() <= 2**0.5 * (1 + 1e-6)  # float32 sums of 7 terms
