"""The update rule, the noise on the sum, and logical vs physical batches.

Documented normalizer (docs/engine.md): with Poisson sampling at rate q over N examples,
p.grad = (Σ_{i∈batch} clip(g_i) + N(0, (σC)²)) / b with b = qN, the expected batch size.
So with SGD(lr=1), no momentum and σ = 0, one step moves θ by exactly −Σ_i clip(g_i)/b.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
import oracles
from model_cases import loader


def one_step(model, opt, dl, loss_fn=F.cross_entropy):
    for x, y in dl:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if dl.cursor.last:
            return x, y


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("clip", [0.05, 100.0])  # every example clipped / none clipped
def test_sgd_step_is_exactly_minus_clipped_sum_over_b(toy, reduction, clip):
    model, ds = toy
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = dpfy.make_private(model, opt, loader(ds, 8), noise_multiplier=0.0,
                                           max_grad_norm=clip, seed=1, loss_reduction=reduction)
    ref_model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    ref_model.load_state_dict(before)
    loss_fn = (F.cross_entropy if reduction == "mean" else
               lambda o, t: F.cross_entropy(o, t, reduction="sum"))
    x, y = one_step(model, opt, dl, loss_fn)
    assert x.shape[0] > 0
    grads = oracles.per_example_grads(ref_model, x, y, loss_fn if reduction == "sum" else
                                      lambda o, t: F.cross_entropy(o, t, reduction="sum"))
    expected_sum = oracles.clipped_sum(grads, clip)  # Σ_i clip(g_i), float64
    b = 8 / 64 * 64  # b = qN with q = batch_size / N = 8/64
    for n, p in model.named_parameters():
        want = before[n].double() - expected_sum[n] / b
        torch.testing.assert_close(p.detach().double(), want, rtol=1e-6, atol=1e-7)


def _noise_samples(clipping: str, max_grad_norm, sigma: float) -> torch.Tensor:
    """Noise actually added to the sum: b·p.grad − Σ clip(g_i), over a 5050-coordinate model."""
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(40, 100), torch.randint(0, 50, (40,)))
    model = nn.Sequential(nn.Linear(100, 50))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=4),
                                       noise_multiplier=sigma, max_grad_norm=max_grad_norm,
                                       clipping=clipping, seed=3)
    out = []
    for k, (x, y) in enumerate(dl):
        if k == 4:
            break
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        # the clipped sum the engine will noise, recomputed independently from the float64 loop
        grads = oracles.per_example_grads(model, x, y,
                                          lambda o, t: F.cross_entropy(o, t, reduction="sum"))
        opt.step()
        b = dl.sampler.normalizer
        if clipping == "flat":
            s = oracles.clipped_sum(grads, max_grad_norm)
        else:  # per layer: each parameter group clipped on its own (here: one Linear = 1 layer)
            s = oracles.clipped_sum(grads, max_grad_norm[0])
        for n, p in model.named_parameters():
            out.append((p.grad.double() * b - s[n]).flatten())
    return torch.cat(out)


def test_noise_std_on_the_sum_is_sigma_times_c():
    # as optax checks it: expected_std = l2_norm_clip · noise_multiplier, on 4 × 5050 draws
    z = _noise_samples("flat", 0.7, 2.0)
    assert abs(float(z.std()) / (2.0 * 0.7) - 1) < 0.03  # 20k draws: std error ≈ 0.5%
    assert abs(float(z.mean())) < 0.05


def test_per_layer_noise_follows_total_sensitivity():
    # one layer with C_1 = 0.4: Δ = sqrt(Σ C_k²) = 0.4
    z = _noise_samples("per_layer", [0.4], 1.5)
    assert abs(float(z.std()) / (1.5 * 0.4) - 1) < 0.03


def test_physical_batches_give_the_same_update_and_one_ledger_step(toy):
    model_a, ds = toy
    model_b = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    model_b.load_state_dict(model_a.state_dict())
    runs = []
    for model, phys in ((model_a, None), (model_b, 3)):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        model, opt, dl = dpfy.make_private(model, opt, loader(ds, 16), noise_multiplier=1.0,
                                           max_grad_norm=1.0, seed=7,
                                           max_physical_batch_size=phys)
        physical = 0
        for x, y in dl:
            assert phys is None or x.shape[0] <= phys
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            physical += 1
        runs.append((model, opt, physical))
    (ma, oa, pa), (mb, ob, pb) = runs
    assert pb > pa == 4  # 64 examples, q = 16/64: 4 logical batches per epoch
    assert oa.ledger.to_dict() == ob.ledger.to_dict() and ob.step_count == 4
    for pa_, pb_ in zip(ma.parameters(), mb.parameters()):
        torch.testing.assert_close(pa_, pb_, rtol=1e-5, atol=1e-6)


def test_empty_poisson_batch_still_steps_with_noise_only():
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(20, 3), torch.randint(0, 2, (20,)))
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=1),
                                       noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    sizes = []
    for x, y in dl:  # q = 1/20: about a third of the 20 batches are empty
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sizes.append(x.shape[0])
    assert 0 in sizes and opt.step_count == len(sizes) == 20
    assert opt.ledger.num_steps == 20
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_lr_scale_and_step_info_from_schedule(toy):
    from dataclasses import replace

    from dpfy.adaptive.base import Method

    class Halve(Method):
        """σ_t = 1 + t, C_t = 0.5, lr × 0.5: a plan the step must follow exactly."""

        sets = frozenset({"noise_multiplier", "clip", "lr_scale"})

        def plan(self, state, plan):
            return replace(plan, noise_multiplier=1.0 + plan.step, clip=0.5, lr_scale=0.5)

    model, ds = toy
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    model, opt, dl = dpfy.make_private(model, opt, loader(ds, 8), max_grad_norm=1.0,
                                       method=Halve(), seed=0)
    for k, (x, y) in enumerate(dl):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        info = opt.last_step_info
        assert info["noise_multiplier"] == 1.0 + k and info["clip"] == 0.5
        assert info["lr_scale"] == 0.5 and info["sample_rate"] == 8 / 64
        assert "mean_grad_norm_nonprivate" in info
        if k == 2:
            break
    assert opt.param_groups[0]["lr"] == 0.2  # restored after each step
    sigmas = [r.noise_multiplier for g in opt.ledger for r in g.releases]
    assert sigmas == [1.0, 2.0, 3.0]


def test_torch_lr_scheduler_drives_the_private_optimizer(toy):
    model, ds = toy
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model, opt, dl = dpfy.make_private(model, opt, loader(ds, 16), noise_multiplier=1.0, seed=0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for x, y in dl:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
    assert opt.step_count == 4 and opt.param_groups[0]["lr"] == 0.5 ** 4


def test_extra_release_declared_by_a_method_is_noised_recorded_and_handed_back(toy):
    # A quantile-style count (Andrew et al. 2021, centred): Σ_i (1[‖g_i‖ ≤ C] − ½), sensitivity ½,
    # noise std 0.25 -> noise multiplier 0.5 in the ledger next to the gradient's σ.
    from dpfy.adaptive.base import Method
    from dpfy.types import ReleaseSpec

    seen = []

    class Count(Method):
        def releases(self, state, plan):
            return {"unclipped": ReleaseSpec(
                sensitivity=0.5, noise_std=0.25,
                values=lambda norms: (norms.total <= plan.clip).double() - 0.5)}  # (B,) sensitive

        def update(self, state, released):
            seen.append(released.sums["unclipped"])
            return state

    model, ds = toy
    ref = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the reference stays valid
    model, opt, dl = dpfy.make_private(model, opt, loader(ds, 16), noise_multiplier=1.0,
                                       max_grad_norm=1.0, method=Count(), seed=0,
                                       max_physical_batch_size=5)
    exact = []
    count = 0.0
    for x, y in dl:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        g = oracles.per_example_grads(ref, x, y,
                                      lambda o, t: F.cross_entropy(o, t, reduction="sum"))
        count += float(((oracles.per_example_norms(g) <= 1.0).double() - 0.5).sum())
        opt.step()
        if dl.cursor.last:
            exact.append(count)
            count = 0.0
    assert len(seen) == len(exact) == 4
    noise = torch.tensor(seen) - torch.tensor(exact)
    assert float(noise.abs().max()) < 5 * 0.25  # N(0, 0.25²) once per logical batch
    assert float(noise.abs().max()) > 0  # and it was noised
    (group,) = list(opt.ledger)
    assert [(r.mechanism, r.noise_multiplier) for r in group.releases] == [
        ("gradient", 1.0), ("unclipped", 0.5)]


def test_a_plan_field_the_method_does_not_declare_is_refused(toy):
    # The step compares each plan field before and after method.plan with the fields the
    # method declares in `sets`: a declaration that disagrees with the code cannot pass.
    from dataclasses import replace

    from dpfy.adaptive.base import Method
    from dpfy.errors import PrivacyRefusal

    class Sneaky(Method):
        sets = frozenset({"clip"})

        def plan(self, state, plan):
            return replace(plan, noise_multiplier=plan.noise_multiplier / 2)

    model, ds = toy
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = dpfy.make_private(model, opt, loader(ds, 16), noise_multiplier=1.0,
                                       method=Sneaky(), seed=0)
    x, y = next(iter(dl))
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(PrivacyRefusal, match=r"Sneaky.*\['noise_multiplier'\].*sets"):
        opt.step()
    assert opt.ledger.num_steps == 0
