"""BatchNorm with public statistics (dpfy.layers.public_batchnorm, docs/guide/batchnorm.md).

What must hold: the statistics are the public batch's (checked against a float64 computation
written here); no private row moves them, and each private row's output depends on that row and
the public data only (a row-identity probe: changing example 0 leaves every other row's output
bit for bit, which a plain BatchNorm fails); the per-example gradients of the affine parameters
equal the float64 per-example loop (tests/oracles.py); a private run refreshes the statistics
after each update, and the buffer guard accepts it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
import oracles
from dpfy.errors import PrivacyRefusal
from dpfy.grads import GradEngine
from dpfy.layers import PublicBatchNorm, public_batchnorm
from layers.bn_cases import bn_cnn


PUBLIC = torch.randn(40, 1, 6, 6) * 2 + 1  # declared public inputs
PRIVATE = torch.randn(12, 1, 6, 6)


def test_statistics_are_the_public_batch():
    torch.manual_seed(0)
    model = bn_cnn()
    stats = public_batchnorm(model, PUBLIC, batch_size=40)  # one batch: the whole public set
    bn = model[1]
    assert isinstance(bn, PublicBatchNorm) and isinstance(model[5], PublicBatchNorm)
    # float64, written here: the first BatchNorm's input is conv(public), reduced over (B, H, W)
    h = model[0].double()(PUBLIC.double())
    model[0].float()
    torch.testing.assert_close(bn.public_mean.double(), h.mean((0, 2, 3)), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        bn.public_var.double(), h.var((0, 2, 3), correction=0), rtol=1e-5, atol=1e-6
    )
    # running estimate after one public batch: momentum 0.1 from (0, 1), unbiased variance
    n = 40 * 6 * 6
    want = 0.9 + 0.1 * h.var((0, 2, 3), correction=0) * n / (n - 1)
    torch.testing.assert_close(bn.running_var.double(), want, rtol=1e-5, atol=1e-6)
    assert stats.refreshes == 1 and stats.description == "public data"


def test_private_rows_do_not_move_statistics_and_rows_stay_own():
    """The probe: two different private batches, same statistics; and row identity."""
    torch.manual_seed(0)
    model = bn_cnn()
    public_batchnorm(model, PUBLIC, batch_size=16)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = model(PRIVATE)
    other = PRIVATE.clone()
    other[0] = other[0] * 100 + 7  # an outlier in row 0 only
    out2 = model(other)
    after = model.state_dict()
    for k, v in before.items():
        assert torch.equal(v, after[k]), k  # no statistic moved with the private rows
    assert not torch.equal(out[0], out2[0])
    assert torch.equal(out[1:], out2[1:])  # rows 1.. depend on their own example + public data
    # the same probe fails on a plain BatchNorm (what the test guards against)
    plain = bn_cnn().train()
    assert not torch.equal(plain(PRIVATE)[1:], plain(other)[1:])


@pytest.mark.parametrize("route", ["auto", "vmap"])
def test_per_example_gradients_equal_the_loop(route):
    torch.manual_seed(0)
    model = bn_cnn()
    stats = public_batchnorm(model, PUBLIC, batch_size=16)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, PublicBatchNorm):
                m.weight.uniform_(0.5, 1.5)  # away from (1, 0)
                m.bias.uniform_(-0.5, 0.5)
    model = model.double().train()
    stats.refresh()  # statistics of the new weights (float64 public batch)
    x, y = PRIVATE.double(), torch.arange(12) % 3

    def loss(out, y):
        return nn.functional.cross_entropy(out, y, reduction="sum")

    ref = oracles.per_example_grads(model, x, y, loss)
    eng = GradEngine(model, route=route, loss_reduction="sum")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # vmap's functional_call is no stale update
            loss(model(x), y).backward()
            sq = eng.per_sample_sq_norms()
        routes = {r["module"]: r["rule"] for r in eng.explain()}
    finally:
        eng.detach()
    if route == "auto":  # each PublicBatchNorm takes its rule, not the vmap fallback
        assert routes["1"].endswith("public_batchnorm.py")
        assert routes["5"].endswith("public_batchnorm.py")
    for name, g in ref.items():
        # float64 both ways; only the summation order differs
        torch.testing.assert_close(sq[name], g.flatten(1).square().sum(1), rtol=1e-9, atol=1e-12)


def test_plain_batchnorm_still_refused():
    model = bn_cnn()
    loader = DataLoader(TensorDataset(PRIVATE, torch.arange(12) % 3), batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(PrivacyRefusal, match="BatchNorm"):
        dpfy.make_private(model, opt, loader, noise_multiplier=1.0)


def test_private_run_refreshes_after_each_update():
    torch.manual_seed(0)
    model = bn_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # built before the swap: params shared
    stats = public_batchnorm(model, PUBLIC, batch_size=8, description="the test's public set")
    loader = DataLoader(TensorDataset(PRIVATE, torch.arange(12) % 3), batch_size=4)
    model, opt, loader = dpfy.make_private(model, opt, loader, noise_multiplier=1.0, seed=1)
    first = model[1].public_mean.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fresh statistics at every forward: no warning
        steps = 0
        for x, y in loader:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            steps += opt.updated
    assert steps >= 1 and stats.refreshes == 1 + steps
    assert not torch.equal(first, model[1].public_mean)  # new weights, new public batch
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(PRIVATE)).all()  # inference: the running public estimates


def test_stale_statistics_warn():
    model = bn_cnn()
    public_batchnorm(model, PUBLIC)
    with torch.no_grad():
        model[0].weight.add_(1.0)  # an update without a refresh
    with pytest.warns(UserWarning, match="older than the parameters"):
        model(PRIVATE)


def test_refusals():
    with pytest.raises(ValueError, match="BatchNorm"):
        public_batchnorm(nn.Sequential(nn.Linear(2, 2)), PUBLIC)
    with pytest.raises(ValueError, match="container"):
        public_batchnorm(nn.BatchNorm1d(3), PUBLIC)


def test_running_statistics_carry_nothing_from_a_private_forward():
    """Regression (adversarial review): the conversion copied the BatchNorm's running estimates,
    so a train-mode forward on private data before it (a warm-up, a shape check) stayed in the
    eval-mode statistics that ship with the model. Derivation: from the neutral start (0, 1)
    one public batch gives running_mean = 0.1·mean(public) exactly, whatever ran before."""
    torch.manual_seed(0)
    warm, fresh = bn_cnn(), bn_cnn()
    fresh.load_state_dict(warm.state_dict())
    warm.train()
    warm(PRIVATE * 50 + 30)  # private batch statistics far from the public ones
    public_batchnorm(warm, PUBLIC, batch_size=40)
    public_batchnorm(fresh, PUBLIC, batch_size=40)
    for a, b in zip(warm.modules(), fresh.modules()):
        if isinstance(a, PublicBatchNorm):
            assert torch.equal(a.running_mean, b.running_mean)
            assert torch.equal(a.running_var, b.running_var)
