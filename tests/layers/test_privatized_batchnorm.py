"""BatchNorm with privatized statistics (dpfy.layers.privatized_batchnorm, batchnorm_setup;
docs/guide/batchnorm.md).

What must hold, each checked against a computation written here or dp_accounting:
- the release is Σ_i clip(m_i) + N(0, (σ_bn·A√C)²) and Σ_i clip(q_i) + N(0, (σ_bn·A²√C)²),
  divided by the expected batch size (float64 sums and the noise stds derived in the tests);
- one example moves each sum by at most its sensitivity (A√C, A²√C), and exactly that much
  when its activations saturate the bound;
- the normalization uses released constants: other rows' outputs do not move with one example,
  the engine's probes accept the layer, and the per-example gradients equal the float64 loop;
- the ledger holds the gradient and two releases per layer at every step; ε composes them
  (larger than without them; equal to dp_accounting composing the same events); a calibrated
  run spends its target; the running estimates are folded from released values only;
- what the accounting does not cover is refused.
"""

from __future__ import annotations

import copy
import math

import dp_accounting
import pytest
import torch
from dp_accounting import rdp as dp_rdp
from torch import nn

import dpfy
import oracles
from dpfy.errors import PrivacyRefusal
from dpfy.grads import GradEngine
from dpfy.layers.batchnorm_setup import (
    attach_privatized_statistics,
    setup_batchnorm,
    split_noise_multiplier,
)
from dpfy.layers.privatized_batchnorm import PrivatizedBatchNorm, privatized_batchnorm
from layers.bn_cases import bn_cnn, make_private_quiet, train

A = 2.0  # the declared activation bound of these tests
X = torch.randn(60, 1, 6, 6)
Y = torch.arange(60) % 3


class ZeroNoise:
    """A test double of the noise generator: no noise, and the stds asked for."""

    def __init__(self) -> None:
        self.stds: list[float] = []

    def gaussian(self, like: torch.Tensor, std: float) -> torch.Tensor:
        self.stds.append(std)
        return torch.zeros_like(like)


def _standalone(model: nn.Module, sigma: float = 1.5, b: float = 10.0):
    stats = privatized_batchnorm(model, bound=A, noise_multiplier=sigma, expected_batch_size=b)
    stats.noise = ZeroNoise()
    return stats


def _layer_input(model: nn.Module, index: int, x: torch.Tensor) -> torch.Tensor:
    seen = []
    h = model[index].register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().double()))
    model(x)
    h.remove()
    return seen[0]


def test_release_is_the_clipped_sum_with_its_noise_over_b():
    torch.manual_seed(0)
    model = bn_cnn().train()
    stats = _standalone(model, sigma=1.5, b=10.0)
    x = X[:10] * 3  # activations beyond the bound A: the clipping acts
    h = _layer_input(model, 1, x)  # (10, 4, 6, 6), float64
    # float64, written here: per-example channel means clipped to [−A, A], squares to [0, A²]
    m = h.mean((2, 3)).clamp(-A, A)
    q = h.square().mean((2, 3)).clamp(max=A * A)
    mean, sq = m.sum(0) / 10.0, q.sum(0) / 10.0
    floor = 1.5 * A * A * math.sqrt(4) / 10.0  # the variance floor: σ·Δ_q / b
    used_mean, used_var = stats.current(model[1])
    torch.testing.assert_close(used_mean.double(), mean, rtol=1e-5, atol=1e-6)  # float32 path
    torch.testing.assert_close(
        used_var.double(), (sq - mean.square()).clamp(min=floor), rtol=1e-5, atol=1e-6
    )
    # noise stds: σ·A·√C and σ·A²·√C for C = 4 (first layer) and C = 8 (second)
    want = [1.5 * A * 2, 1.5 * A * A * 2, 1.5 * A * math.sqrt(8), 1.5 * A * A * math.sqrt(8)]
    assert stats.noise.stds == pytest.approx(want, rel=1e-12)
    assert stats.releases_made == 2


def test_one_example_moves_each_sum_by_at_most_its_sensitivity():
    torch.manual_seed(0)
    model = bn_cnn().train()
    stats = _standalone(model, b=1.0)  # b = 1: the released mean is the sum Σ_i clip(m_i)
    h = _layer_input(model, 1, X[:8]).float()  # the layer's input, (8, 4, 6, 6)
    mean1 = stats.statistics(model[1], h)[0].clone()
    for sign in (1.0, -1.0):
        stats.commit()  # a new step: a new release
        outlier = torch.full((1, 4, 6, 6), sign * 1e6)
        mean2 = stats.statistics(model[1], torch.cat([h, outlier]))[0]
        # the added example saturates every channel: its clipped mean is ±A per channel, so
        # the sum moves by exactly Δ_m = A·√C (float32 sums of 9 terms: relative rounding 1e-6)
        assert (mean2 - mean1).norm().item() == pytest.approx(A * math.sqrt(4), rel=1e-5)
        assert torch.allclose(mean2 - mean1, torch.full((4,), sign * A), atol=1e-5)


def test_rows_stay_their_own_and_the_rule_matches_the_loop():
    torch.manual_seed(0)
    model = bn_cnn().double().train()
    stats = _standalone(model)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, PrivatizedBatchNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    x, y = X[:12].double(), Y[:12]
    out = model(x)  # the release of this step
    other = x.clone()
    other[0] = other[0] * 100 + 7
    assert torch.equal(out[1:], model(other)[1:])  # the released statistics are constants
    plain = bn_cnn().train()
    assert not torch.equal(plain(x.float())[1:], plain(other.float())[1:])  # what it guards

    def loss(o, t):
        return nn.functional.cross_entropy(o, t, reduction="sum")

    # the reference: a copy whose BatchNorms normalize with the released statistics as
    # constants (eval mode with running estimates set to them), run one example at a time
    ref_model = copy.deepcopy(model)
    for mine, theirs in zip(model.modules(), ref_model.modules()):
        if isinstance(mine, PrivatizedBatchNorm):
            mean, var = stats.current(mine)
            theirs.running_mean, theirs.running_var = mean.clone(), var.clone()
            theirs.eval()
    ref = oracles.per_example_grads(ref_model, x, y, loss)
    eng = GradEngine(model, loss_reduction="sum")
    try:
        loss(model(x), y).backward()
        sq = eng.per_sample_sq_norms()
        routes = {r["module"]: r["rule"] for r in eng.explain()}
    finally:
        eng.detach()
    assert routes["1"].endswith("privatized_batchnorm.py")
    for name, g in ref.items():  # float64 both ways; only the summation order differs
        torch.testing.assert_close(sq[name], g.flatten(1).square().sum(1), rtol=1e-9, atol=1e-12)
    assert stats.releases_made == 2  # one release per layer for every forward of the step


def _run(*, bn_sigma=None, share=None, sigma=None, target=None, batch=20, epochs=2, seed=0):
    torch.manual_seed(seed)
    model = bn_cnn()
    stats = None
    if bn_sigma is not None or share is not None:
        stats = privatized_batchnorm(model, bound=A, noise_multiplier=bn_sigma, share=share)
    else:  # the same run without statistics releases: the GroupNorm swap
        model = dpfy.validate(model, fix=True)
    kw = {"noise_multiplier": sigma} if target is None else {"target_epsilon": target}
    model, opt, loader = make_private_quiet(
        model, X, Y, batch_size=batch, target_delta=1e-5, epochs=epochs, seed=seed, **kw
    )
    if stats is not None:
        attach_privatized_statistics(stats, opt, calibrated=target is not None)
    train(model, opt, loader, epochs)
    return model, opt, stats


def test_ledger_records_the_statistics_and_epsilon_composes_them():
    _, with_bn, stats = _run(sigma=1.0, bn_sigma=4.0)
    _, without, _ = _run(sigma=1.0)
    assert len(with_bn.ledger) == len(without.ledger) == 6  # 2 epochs of q = 1/3
    for g in with_bn.ledger:
        names = [r.mechanism for r in g.releases]
        assert names == ["gradient", "bn_mean:1", "bn_square:1", "bn_mean:5", "bn_square:5"]
        assert [r.noise_multiplier for r in g.releases] == [1.0, 4.0, 4.0, 4.0, 4.0]
    assert stats.releases_made == 6 * 2  # one per layer and logical batch
    eps_bn, eps = with_bn.epsilon(1e-5, "rdp"), without.epsilon(1e-5, "rdp")
    assert eps_bn > eps
    # dp_accounting on the same events: each step one Poisson-sampled Gaussian at
    # σ_eff = (σ_g⁻² + 4·σ_bn⁻²)^(−1/2) (Gaussians on one batch stack into one Gaussian
    # mechanism whose sensitivity is the root sum of squares of the σ-scaled ones)
    q = with_bn.ledger.step_groups[0].sample_rate
    sigma_eff = (1.0**-2 + 4 * 4.0**-2) ** -0.5
    acc = dp_rdp.RdpAccountant()
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma_eff)), 6
        )
    )
    assert eps_bn == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)  # the same RDP orders


def test_full_batch_epsilon_equals_dp_accounting_without_the_collapse():
    """q = 1: dp_accounting composes the releases themselves, no σ_eff derivation used."""
    _, opt, _ = _run(sigma=2.0, bn_sigma=5.0, batch=60, epochs=3)
    assert opt.ledger.step_groups[0].sample_rate == 1.0 and len(opt.ledger) == 3
    step = dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(2.0)] + [dp_accounting.GaussianDpEvent(5.0)] * 4
    )
    acc = dp_rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(step, 3))
    assert opt.epsilon(1e-5, "rdp") == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_calibrated_run_spends_its_target_with_the_statistics():
    _, opt, stats = _run(target=2.0, share=0.2)
    g = opt.ledger.step_groups[0]
    sigma_g, sigma_bn = g.releases[0].noise_multiplier, g.releases[1].noise_multiplier
    # the split: the statistics take 20 % of the step's precision, the gradient 80 %
    assert 4 * sigma_bn**-2 == pytest.approx(0.2 * (sigma_g**-2 + 4 * sigma_bn**-2), rel=1e-12)
    assert stats.noise_multiplier == sigma_bn
    eps = opt.epsilon(1e-5)
    assert eps <= 2.0 and eps == pytest.approx(2.0, abs=0.01)  # calibration's tolerance


def test_running_statistics_are_folded_from_released_values_only():
    torch.manual_seed(0)
    model = bn_cnn()
    stats = privatized_batchnorm(model, bound=A, noise_multiplier=3.0)
    model, opt, loader = make_private_quiet(model, X, Y, noise_multiplier=1.0, seed=0)
    attach_privatized_statistics(stats, opt)
    model.train()
    model(X * 50)  # a training forward outside the loader: nothing folded
    assert torch.equal(model[1].running_mean, torch.zeros(4))
    xb, yb = next(iter(loader))
    nn.functional.cross_entropy(model(xb), yb).backward()
    released, released_var = (t.clone() for t in stats.current(model[1]))
    opt.step()
    # momentum 0.1 from the neutral start (0, 1): one step folds 0.1 × the released values
    torch.testing.assert_close(model[1].running_mean, 0.1 * released, rtol=0, atol=1e-7)
    torch.testing.assert_close(model[1].running_var, 0.9 + 0.1 * released_var, rtol=0, atol=1e-7)
    model.eval()
    before = stats.releases_made
    with torch.no_grad():
        model(X)  # eval: the running estimates, no release
    assert stats.releases_made == before


def test_split_noise_multiplier_derivations():
    # calibrated: σ_g⁻² + k σ_bn⁻² = σ_eff⁻², with the share f on the statistics
    g, b = split_noise_multiplier(2.0, 4, share=0.25, calibrated=True)
    assert g**-2 + 4 * b**-2 == pytest.approx(2.0**-2, rel=1e-12)
    assert 4 * b**-2 == pytest.approx(0.25 * 2.0**-2, rel=1e-12)
    g, b = split_noise_multiplier(2.0, 4, bn_noise_multiplier=10.0, calibrated=True)
    assert b == 10.0 and g**-2 == pytest.approx(0.25 - 4 / 100, rel=1e-12)
    with pytest.raises(ValueError, match="bn_noise_multiplier"):
        split_noise_multiplier(2.0, 4, bn_noise_multiplier=3.0, calibrated=True)
    # not calibrated: σ_g given, σ_bn from the share of the step's precision
    g, b = split_noise_multiplier(2.0, 4, share=0.5, calibrated=False)
    assert g == 2.0 and 4 * b**-2 == pytest.approx(2.0**-2, rel=1e-12)


def test_refusals():
    model = bn_cnn()
    with pytest.raises(PrivacyRefusal, match="max_physical_batch_size"):
        setup_batchnorm(model, "privatized", bn_bound=1.0, max_physical_batch_size=8)
    with pytest.raises(ValueError, match="bn_bound"):
        setup_batchnorm(bn_cnn(), "privatized")
    with pytest.raises(ValueError, match="public_data"):
        setup_batchnorm(bn_cnn(), "public", bn_bound=1.0)
    with pytest.raises(ValueError, match="exactly one"):
        privatized_batchnorm(bn_cnn(), bound=1.0, noise_multiplier=1.0, share=0.1)
    with pytest.raises(ValueError, match="bound"):
        privatized_batchnorm(bn_cnn(), bound=-1.0, noise_multiplier=1.0)


def test_a_copy_releases_nothing_and_normalizes_with_its_running_estimates():
    """dpfy.validate(model, example_input=...) runs a deep copy in training mode: the copy's
    layers belong to no PrivatizedStatistics, so they must not release (nothing would record
    it) nor compute batch statistics; they use the running estimates, as in eval mode."""
    owned = bn_cnn()
    stats = privatized_batchnorm(owned, bound=1.0, noise_multiplier=1.0, expected_batch_size=4)
    twin = copy.deepcopy(owned)
    with pytest.warns(UserWarning, match="belongs to no PrivatizedStatistics"):
        train_out = twin.train()(X[:4])
    with torch.no_grad():
        assert torch.equal(train_out, twin.eval()(X[:4]))
    assert stats.releases_made == 0
    with pytest.warns(UserWarning, match="releases nothing"):
        assert dpfy.validate(owned, example_input=X[:4]) == []


def test_a_private_run_without_the_attach_is_refused():
    """Statistics that a step would not record must not be released: a model made private
    whose privatized statistics were never attached refuses its first training forward."""
    torch.manual_seed(0)
    model = bn_cnn()
    stats = privatized_batchnorm(model, bound=A, noise_multiplier=3.0, expected_batch_size=20)
    model, opt, loader = make_private_quiet(model, X, Y, noise_multiplier=1.0, seed=0)
    xb, _ = next(iter(loader))
    with pytest.raises(PrivacyRefusal, match="attach_privatized_statistics"):
        model(xb)
    assert stats.releases_made == 0 and len(opt.ledger) == 0


def test_physical_batches_are_refused_at_the_forward():
    torch.manual_seed(0)
    model = bn_cnn()
    stats = privatized_batchnorm(model, bound=A, noise_multiplier=3.0)
    model, opt, loader = make_private_quiet(
        model, X, Y, noise_multiplier=1.0, seed=0, max_physical_batch_size=4
    )
    attach_privatized_statistics(stats, opt)
    xb, _ = next(iter(loader))
    with pytest.raises(PrivacyRefusal, match="one physical batch"):
        model(xb)
    assert len(opt.ledger) == 0 and stats.releases_made == 0


def test_correlated_noise_and_a_second_attach_are_refused():
    torch.manual_seed(0)
    model = bn_cnn()
    stats = privatized_batchnorm(model, bound=A, noise_multiplier=3.0)
    _, dp_opt, _ = make_private_quiet(
        model, X, Y, noise_multiplier=1.0, seed=0, noise="tree", epochs=1
    )
    with pytest.raises(ValueError, match="gaussian"):
        attach_privatized_statistics(stats, dp_opt)
    _, plain_opt, _ = _run(sigma=1.0, bn_sigma=2.0, epochs=1)
    with pytest.raises(ValueError, match="once"):
        attach_privatized_statistics(stats, plain_opt)


@pytest.mark.parametrize("pre_swapped", [False, True])
def test_setup_and_finish_as_make_private_calls_them(pre_swapped):
    """The two calls make_private makes around building the run (setup before the engine,
    finish after the optimizer): a calibrated run spends its target with the statistics."""
    torch.manual_seed(0)
    model = bn_cnn()
    if pre_swapped:  # the user converted the model; make_private's batchnorm= is None
        privatized_batchnorm(model, bound=A, share=0.3)
        setup = setup_batchnorm(model, None)
    else:
        setup = setup_batchnorm(model, "privatized", bn_bound=A, bn_share=0.3)
    model, opt, loader = make_private_quiet(
        model, X, Y, target_epsilon=1.0, target_delta=1e-5, epochs=1, seed=0
    )
    setup.finish(opt, calibrated=True)
    train(model, opt, loader)
    assert [r.mechanism for r in opt.ledger.step_groups[0].releases][1:] == [
        "bn_mean:1",
        "bn_square:1",
        "bn_mean:5",
        "bn_square:5",
    ]
    assert opt.epsilon(1e-5) == pytest.approx(1.0, abs=0.01) and opt.epsilon(1e-5) <= 1.0


def test_an_empty_poisson_batch_releases_noise_only():
    model = bn_cnn().train()
    stats = _standalone(model, sigma=1.0, b=5.0)
    out = model(torch.zeros(0, 1, 6, 6))
    assert out.shape == (0, 3) and stats.releases_made == 2
    mean, _ = stats.current(model[1])
    assert torch.equal(mean, torch.zeros(4))  # Σ over no rows, zero noise from the double


def test_the_engines_row_probes_accept_the_layer():
    """Bound to a batch, the engine runs its row-identity (eval) and perturbation (training
    mode, forward and backward) probes at the first training forward; the probe forwards reuse
    the step's released statistics (no new release) and find no row mixing."""
    torch.manual_seed(0)
    model = bn_cnn().train()
    stats = _standalone(model)
    forwards = []
    model.register_forward_hook(lambda m, a, o: forwards.append(m.training))
    eng = GradEngine(model, loss_reduction="sum")
    try:
        eng.bind_batch(12)
        nn.functional.cross_entropy(model(X[:12]), Y[:12], reduction="sum").backward()
        assert eng.preflight() == []
    finally:
        eng.detach()
    assert len(forwards) >= 3 and forwards.count(True) >= 2  # the probes ran, in both modes
    assert stats.releases_made == 2  # one per layer: the probe forwards reused them
