"""Fail loudly: every refusal names the problem and the fix (the parameter, the constraint, the
value received and what to do)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import BudgetExhausted, PrivacyRefusal


def data(n=40, d=4):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, d, generator=g), torch.randint(0, 2, (n,), generator=g))


def private(model, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kw.setdefault("noise_multiplier", 1.0)
    return dpfy.make_private(model, opt, DataLoader(data(), batch_size=8), seed=0, **kw)


def train(model, opt, dl, steps=100):
    for k, (x, y) in enumerate(dl):
        if k == steps:
            break
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def test_batchnorm_is_refused_with_the_fix_and_validate_fixes_it():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    with pytest.raises(ValueError, match=r"BatchNorm1d.*dpfy.validate\(model, fix=True\)"):
        private(model)
    assert any("BatchNorm1d" in p for p in dpfy.validate(model))
    fixed = dpfy.validate(model, fix=True)
    assert isinstance(fixed[1], nn.GroupNorm) and isinstance(model[1], nn.BatchNorm1d)
    assert dpfy.validate(fixed) == []
    m, opt, dl = private(fixed)
    train(m, opt, dl, 2)
    assert opt.step_count == 2


def test_ghost_engine_names_the_unsupported_layer():
    model = nn.Sequential(nn.Linear(4, 4), nn.PReLU(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"'1' of type PReLU.*route='auto'"):
        private(model, route="ghost")
    assert dpfy.validate(model, route="ghost") != []
    private(model, route="auto")  # vmap for the PReLU only


def test_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match=r"route must be one of \['auto', 'ghost', 'vmap'\]"):
        private(nn.Linear(4, 2), route="fast")
    with pytest.raises(ValueError, match=r"clipping must be one of"):
        private(nn.Linear(4, 2), clipping="hard")
    with pytest.raises(ValueError, match=r"accountant"):
        private(nn.Linear(4, 2), accountant="moments")


def test_sigma_and_target_both_or_neither():
    with pytest.raises(ValueError, match="not both"):
        private(nn.Linear(4, 2), target_epsilon=1.0, target_delta=1e-5, epochs=1)
    with pytest.raises(ValueError, match="noise_multiplier must be given"):
        private(nn.Linear(4, 2), noise_multiplier=None)
    with pytest.raises(ValueError, match="target_delta"):
        private(nn.Linear(4, 2), noise_multiplier=None, target_epsilon=1.0, epochs=1)


def test_zero_noise_warns_that_nothing_is_private():
    with pytest.warns(UserWarning, match="NOT private"):
        m, opt, dl = private(nn.Linear(4, 2), noise_multiplier=0.0)
    train(m, opt, dl, 1)
    assert opt.epsilon(1e-5) == float("inf")


def test_schedule_without_sigma_raises_at_step():
    from dpfy.adaptive.base import Method
    m, opt, dl = private(nn.Linear(4, 2), noise_multiplier=None, method=Method())
    with pytest.raises(ValueError, match="noise_multiplier must be > 0"):
        train(m, opt, dl, 1)


def test_budget_guard_refuses_step_t_plus_one_and_replan_is_explicit():
    m, opt, dl = private(nn.Linear(4, 2), noise_multiplier=None, target_epsilon=2.0,
                         target_delta=1e-5, epochs=1)
    assert opt.max_steps == 5  # q = 8/40, ⌈1/q⌉ = 5 steps
    train(m, opt, dl)
    with pytest.raises(BudgetExhausted, match=r"max_steps = 5.*optimizer.max_steps"):
        train(m, opt, dl, 1)
    assert opt.step_count == 5 and opt.ledger.num_steps == 5
    opt.max_steps = 6
    assert opt.epsilon_cap == 2.0  # a target ε is a cap too (issue 30 §1)
    with pytest.raises(BudgetExhausted, match="epsilon_cap = 2.0"):
        train(m, opt, dl, 1)
    opt.epsilon_cap = 2.5
    train(m, opt, dl, 1)
    assert opt.step_count == 6


def test_calibrated_run_spends_at_most_the_target():
    m, opt, dl = private(nn.Linear(4, 2), noise_multiplier=None, target_epsilon=2.0,
                         target_delta=1e-5, epochs=2)
    train(m, opt, dl)
    train(m, opt, dl)
    eps = opt.epsilon(1e-5)
    assert 1.9 < eps <= 2.0  # calibration tolerance 1e-3 on σ


def test_epsilon_cap_stops_training():
    m, opt, dl = private(nn.Linear(4, 2), noise_multiplier=2.0, epsilon_cap=1.5,
                         target_delta=1e-5)
    with pytest.raises(BudgetExhausted, match="epsilon_cap = 1.5"):
        for _ in range(20):
            train(m, opt, dl)
    assert 5 < opt.step_count < 20  # σ=2, q=0.2: ε(5 steps) ≈ 1.21, ε(20) ≈ 2.22 (PLD)
    assert opt.epsilon(1e-5) <= 1.5
    opt.ledger.record_step(sampling=opt.sampler.sampling, sample_rate=opt.sampler.sample_rate,
                           releases=[dpfy.Release("gradient", 2.0)])
    assert opt.epsilon(1e-5) > 1.5  # the refused step really would have crossed the cap


def test_step_needs_a_batch_from_the_private_loader():
    m, opt, dl = private(nn.Linear(4, 2))
    x, y = data().tensors
    opt.zero_grad()
    F.cross_entropy(m(x[:8]), y[:8]).backward()
    # a batch dpfy did not sample cannot be accounted: a PrivacyRefusal (README)
    with pytest.raises(PrivacyRefusal, match="loader returned by make_private"):
        opt.step()


def test_optimizer_must_cover_exactly_the_trainable_parameters():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"1.weight.*requires_grad_\(False\)"):
        dpfy.make_private(model, opt, DataLoader(data(), batch_size=8), noise_multiplier=1.0)
    # the refusal left the model untouched
    assert all(p.requires_grad for p in model.parameters())


def test_frozen_parameters_are_left_alone():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    before = model[0].weight.detach().clone()
    opt = torch.optim.SGD(model[1].parameters(), lr=0.1)
    m, opt, dl = dpfy.make_private(model, opt, DataLoader(data(), batch_size=8),
                                   noise_multiplier=1.0, seed=0)
    train(m, opt, dl, 2)
    assert torch.equal(before, model[0].weight)


def test_tied_weights_train_on_the_default_and_vmap_engines():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))[:, :2]

    m, opt, dl = private(Tied())          # tests/grads/test_shapes_as_shipped.py: exactness
    train(m, opt, dl, 1)
    m, opt, dl = private(Tied(), route="vmap")
    train(m, opt, dl, 1)


def test_model_made_private_twice_is_refused():
    model = nn.Linear(4, 2)
    private(model)
    with pytest.raises(ValueError, match="has not made private yet"):
        private(model)


def test_dropout_in_a_vmap_unit_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2))
    m, opt, dl = private(model, route="vmap")
    with pytest.raises(ValueError, match="Dropout.*route='ghost'"):
        train(m, opt, dl, 1)
    m2, opt2, dl2 = private(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2)))
    train(m2, opt2, dl2, 1)  # fine with layer rules: the real forward's masks are used


def test_per_layer_thresholds_count_must_match_layers():
    with pytest.raises(ValueError, match=r"one threshold per layer"):
        private(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), clipping="per_layer",
                max_grad_norm=[1.0, 1.0, 1.0])


def test_public_names_resolve():
    for name in dpfy.__all__:
        getattr(dpfy, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert callable(dpfy.make_private) and callable(dpfy.validate)


def test_layer_vmap_cannot_handle_is_named():
    class Noisy(nn.Module):
        """Has parameters, no rule, and draws randomness inside forward: vmap refuses."""

        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.w + torch.rand_like(x)

    model = nn.Sequential(nn.Linear(4, 4), Noisy(), nn.Linear(4, 2))
    m, opt, dl = private(model)
    with pytest.raises(ValueError, match=r"module '1' \(Noisy\) must be supported by torch.func"):
        train(m, opt, dl, 1)


def test_two_batches_before_one_step_are_refused():
    # per-sample gradients would pair example i of both batches: sensitivity 2C, not C
    m, opt, dl = private(nn.Linear(4, 2))
    it = iter(dl)
    for _ in range(2):
        x, y = next(it)
        F.cross_entropy(m(x), y).backward()
    with pytest.raises(PrivacyRefusal, match="batches per optimizer.step\\(\\) must be exactly 1"):
        opt.step()


def test_abandoned_logical_batch_is_not_merged_into_the_next():
    # 40 examples, q = 8/40, physical batches of 1: breaking out after one physical batch and
    # starting a new pass must not sum two logical batches into one release
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    m, opt, dl = dpfy.make_private(model, opt, DataLoader(data(), batch_size=8),
                                   noise_multiplier=1.0, seed=0, max_physical_batch_size=1)
    for x, y in dl:
        F.cross_entropy(m(x), y).backward()
        opt.step()
        if not dl.cursor.last:
            break
    with pytest.raises(ValueError, match="logical batch must be finished"):
        train(m, opt, dl, 1)
    assert opt.ledger.num_steps == opt.step_count
    train(m, opt, dl, 3)  # the discarded partial sum left nothing behind


class _GRUModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.g, self.h = nn.GRU(4, 5, batch_first=True), nn.Linear(5, 2)

    def forward(self, x):
        return self.h(self.g(x)[0][:, -1])


class _AttentionDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.MultiheadAttention(4, 2, dropout=0.1, batch_first=True)
        self.h = nn.Linear(4, 2)

    def forward(self, x):
        return self.h(self.a(x, x, x)[0][:, 0])


@pytest.mark.parametrize("model, cause", [
    (_GRUModel, r"module 'g' \(GRU\).*dpfy.validate\(model, fix=True\)"),
    (_AttentionDropout, r"module 'a' \(MultiheadAttention\).*dropout randomness under vmap is "
                        r"the cause.*dpfy.validate\(model, fix=True\)"),
])
def test_unswapped_recurrent_and_attention_dropout_name_cause_and_fix(model, cause):
    """An unswapped nn.GRU or attention dropout under the vmap route names the module, the cause
    and the fix (the DP replacement), not a raw torch.func error."""
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(40, 3, 4), torch.randint(0, 2, (40,)))
    m = model()
    m, opt, dl = dpfy.make_private(m, torch.optim.SGD(m.parameters(), lr=0.1),
                                   DataLoader(ds, batch_size=8), noise_multiplier=1.0,
                                   max_grad_norm=1.0, max_steps=3)
    xb, yb = next(iter(dl))
    opt.zero_grad()
    F.cross_entropy(m(xb), yb).backward()
    with pytest.raises(ValueError, match=cause):
        opt.step()


def test_import_dpfy_registers_the_layer_replacements_for_validate_fix():
    """A plain `import dpfy` (fresh process: no test imported dpfy.layers) lets
    validate(fix=True) swap an nn.GRU for its DP replacement."""
    import subprocess
    import sys
    code = ("import dpfy, torch.nn as nn\n"
            "m = dpfy.validate(nn.Sequential(nn.GRU(4, 5)), fix=True)\n"
            "print(type(m[0]).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "DPGRU"


def test_a_second_step_on_one_batch_is_a_privacy_refusal():
    # the batch's clipped gradients were already released: a second release of them would
    # spend a step the ledger does not record
    m, opt, dl = private(nn.Linear(4, 2))
    x, y = next(iter(dl))
    F.cross_entropy(m(x), y).backward()
    opt.step()
    F.cross_entropy(m(x), y).backward()
    with pytest.raises(PrivacyRefusal, match="must be called once per batch"):
        opt.step()
