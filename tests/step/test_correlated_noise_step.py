"""make_private(noise="tree" | "bandmf"): the private step with a correlated mechanism —
b = 1 BandMF is DP-SGD, a seeded checkpoint resumes the noise stream bit for bit, the report
names the mechanism, and what the accounting cannot cover is refused."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive.base import Method
from dpfy.errors import PrivacyRefusal
from dpfy.privacy.report import PrivacyReport
from dpfy.types import ReleaseSpec


class SetsSigma(Method):
    """A method that writes σ into the plan (refused with correlated noise)."""

    sets = frozenset({"noise_multiplier"})

    def init(self):
        return None

    def plan(self, state, plan):
        return replace(plan, noise_multiplier=2.0)

    def update(self, state, released):
        return state


class CountsClipped(Method):
    """A method with one extra noisy release per step (a count)."""

    def init(self):
        return None

    def releases(self, state, plan):
        return {"count": ReleaseSpec(sensitivity=1.0, noise_std=10.0,
                                     values=lambda norms: (norms.total > 0.5).double())}

    def update(self, state, released):
        return state


def build(noise, bands=None, seed=5, physical=None, **kw):
    torch.manual_seed(123)
    ds = TensorDataset(torch.randn(48, 6), torch.randint(0, 3, (48,)))
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kw.setdefault("noise_multiplier", 1.3)
    return dpfy.make_private(model, opt, DataLoader(ds, batch_size=4), seed=seed,
                             max_physical_batch_size=physical, noise=noise, bands=bands, **kw)


def run(model, opt, dl, logical_steps):
    it = iter(dl)
    done = 0
    while done < logical_steps:
        try:
            x, y = next(it)
        except StopIteration:     # a pass ended: the next one starts
            it = iter(dl)
            continue
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        done += dl.cursor.last


@pytest.mark.parametrize("noise,bands", [("tree", None), ("bandmf", 3)])
def test_seeded_resume_continues_the_correlated_stream(noise, bands):
    model, opt, dl = build(noise, bands, seed=11, physical=3, max_steps=20)
    run(model, opt, dl, 7)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    run(model, opt, dl, 8)          # crosses the tree's restart at step 12
    want = [p.detach().clone() for p in model.parameters()]

    model2, opt2, dl2 = build(noise, bands, seed=999, physical=3, max_steps=20)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=False)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    run(model2, opt2, dl2, 8)
    for a, b in zip(want, model2.parameters()):
        assert torch.equal(a, b)
    assert opt2.ledger.to_dict() == opt.ledger.to_dict()


def test_one_band_trains_and_accounts_like_dp_sgd():
    model, opt, dl = build("bandmf", 1, max_steps=6)
    run(model, opt, dl, 6)
    group = opt.ledger.step_groups[0]
    assert group.sampling.value == "cyclic_poisson" and group.sample_rate == 4 / 48
    plain = dpfy.privacy.Ledger.homogeneous(sample_rate=4 / 48, noise_multiplier=1.3, steps=6)
    assert opt.epsilon(1e-5) == pytest.approx(
        dpfy.privacy.accountants.epsilon(plain, delta=1e-5, accountant="pld"), rel=1e-9)


def test_report_names_mechanism_sampling_and_assumption():
    model, opt, dl = build("bandmf", 4, max_steps=8)
    run(model, opt, dl, 8)
    text = PrivacyReport.from_ledger(opt.ledger, delta=1e-5).to_markdown()
    assert "**Noise mechanism:** `bandmf` on `cyclic_poisson`" in text
    assert "b = 4 bands" in text and "held by construction" in text
    model, opt, dl = build("tree", max_steps=3)
    run(model, opt, dl, 3)
    text = PrivacyReport.from_ledger(opt.ledger, delta=1e-5).to_markdown()
    assert "`tree` on `shuffle`" in text and "restarted every 12 steps" in text


def test_refusals():
    with pytest.raises(ValueError, match="bands"):
        build("gaussian", 4)
    with pytest.raises(ValueError, match="noise"):
        build("laplace")
    with pytest.raises(ValueError, match="sample_rates"):
        build("tree", sample_rates=[0.1] * 48)
    with pytest.raises(ValueError, match="does not set σ"):
        build("tree", noise_multiplier=None, method=SetsSigma())


def test_methods_with_extra_releases_are_refused_at_the_release():
    model, opt, dl = build("bandmf", 2, method=CountsClipped())
    x, y = next(iter(dl))
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(PrivacyRefusal, match="releases only the gradient sum"):
        opt.step()


@pytest.mark.parametrize("clipping,clip", [("per_layer", 1.0), ("automatic", 1.0)])
def test_composes_with_clipping_policies(clipping, clip):
    model, opt, dl = build("bandmf", 2, clipping=clipping, max_grad_norm=clip, max_steps=3)
    before = [p.detach().clone() for p in model.parameters()]
    run(model, opt, dl, 3)
    assert opt.ledger.num_steps == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_bandmf_without_bands_takes_the_documented_default():
    """Issue 35 §3: noise="bandmf" without bands= was refused. The default is
    b = min(8, ⌊N/B⌋) (dpfy.sampling.cyclic.default_bands): 8 of the 48 // 4 = 12 bands cyclic
    Poisson allows here, and ⌊N/B⌋ when that is smaller (48 // 16 = 3)."""
    _, _, dl = build("bandmf")
    assert dl.sampler.bands == 8
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(48, 6), torch.randint(0, 3, (48,)))
    model = nn.Linear(6, 3)
    _, _, dl = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 DataLoader(ds, batch_size=16), noise_multiplier=1.3,
                                 noise="bandmf")
    assert dl.sampler.bands == 3
