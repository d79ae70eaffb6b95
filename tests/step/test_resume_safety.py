"""Issue 30 §1 and §4: checkpoints never replay noise or rewind the ledger, the budget guard
survives a load, GDP is read only on request, a seed warns, and the report's route table does
not depend on the last batch.

Each test fails on the code before the fix (checked against main at 0efc571).
"""

from __future__ import annotations

import io
import warnings

import dp_accounting
import pytest
import torch
import torch.nn.functional as F
from dp_accounting.pld import pld_privacy_accountant
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import BudgetExhausted, PrivacyRefusal, SeedWarning

N, B, DELTA = 40, 8, 1e-5      # q = 8/40 = 0.2, 5 logical batches per epoch


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(N, 6, generator=g), torch.randint(0, 3, (N,), generator=g))


def _build(*, init=123, lr=0.05, **kwargs):
    """A fresh model (same init for the same ``init``), SGD, private."""
    torch.manual_seed(init)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    kwargs.setdefault("noise_multiplier", 1.0)
    return dpfy.make_private(model, opt, DataLoader(_data(), batch_size=B), **kwargs)


def _train(model, opt, dl, steps, loss=None):
    """``steps`` logical steps (one physical batch each), restarting the loader as needed."""
    done = 0
    while done < steps:
        for x, y in dl:
            opt.zero_grad()
            out = model(x)
            (loss(out) if loss is not None else F.cross_entropy(out, y)).backward()
            opt.step()
            done += 1
            if done == steps:
                return


def _checkpoint(model, opt):
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _resume(ckpt, **kwargs):
    model, opt, dl = _build(**kwargs)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    return model, opt, dl


# -- §1.1 a secure checkpoint never replays noise ----------------------------------------------

def test_two_continuations_from_one_secure_checkpoint_add_different_noise():
    model, opt, dl = _build(seed=None, lr=1.0)
    _train(model, opt, dl, 2)
    ckpt = _checkpoint(model, opt)
    assert "state" not in ckpt["optimizer"]["noise"]   # no ChaCha20 key in the file
    updates = []
    for _ in range(2):   # two branches (two learning rates, a resume after a crash, ...)
        m, o, d = _resume(ckpt, seed=None, lr=1.0)
        before = [p.detach().clone() for p in m.parameters()]
        # a zero loss: every clipped gradient is 0, so each update is the noise alone (/b);
        # before the fix both branches drew the same key and counter: equal updates, and the
        # difference of two branches' real releases held no noise at all
        _train(m, o, d, 1, loss=lambda out: 0.0 * out.sum(1).mean())  # zero, a mean over examples
        updates.append(torch.cat([(p.detach() - q).flatten()
                                  for p, q in zip(m.parameters(), before)]))
    assert updates[0].abs().min() > 0 and updates[1].abs().min() > 0
    assert not torch.equal(updates[0], updates[1])
    # same law: both are N(0, (σC/b)²) per coordinate, σ = 1, C = 1, b = 8 (loose bound)
    for u in updates:
        assert 0.05 < float(u.std()) < 0.3


def test_a_seeded_resume_stays_bit_identical_and_warns():
    model, opt, dl = _build(seed=5)
    _train(model, opt, dl, 2)
    ckpt = _checkpoint(model, opt)
    runs = []
    for _ in range(2):
        with pytest.warns(SeedWarning, match="undo the privacy"):
            m, o, d = _resume(ckpt, seed=5)
        _train(m, o, d, 2)
        runs.append([p.detach().clone() for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


# -- §1.2 the ledger never goes backwards, and belongs to its model ----------------------------

def test_an_earlier_state_cannot_rewind_the_ledger():
    model, opt, dl = _build(seed=1)
    _train(model, opt, dl, 5)
    early = _checkpoint(model, opt)
    _train(model, opt, dl, 5)
    spent = opt.ledger.to_dict()
    # restore-best-checkpoint: model and optimizer of step 5 into the run at step 10
    model.load_state_dict(early["model"])
    with pytest.raises(PrivacyRefusal, match="must not be shorter.*5 steps.*released 10.*"
                                             "load only the model"):
        opt.load_state_dict(early["optimizer"])
    assert opt.ledger.to_dict() == spent and opt.ledger.num_steps == 10  # nothing changed
    assert opt.step_count == 10


def test_reloading_the_state_it_is_in_is_allowed():
    model, opt, dl = _build(seed=1)
    _train(model, opt, dl, 3)
    ckpt = _checkpoint(model, opt)
    opt.load_state_dict(ckpt["optimizer"])
    _train(model, opt, dl, 1)
    assert opt.ledger.num_steps == 4


def test_a_ledger_that_does_not_extend_this_one_is_refused():
    model, opt, dl = _build(seed=1)
    _train(model, opt, dl, 2)
    other_model, other_opt, other_dl = _build(seed=2, noise_multiplier=3.0)
    _train(other_model, other_opt, other_dl, 4)
    other = _checkpoint(other_model, other_opt)
    model.load_state_dict(other["model"])
    with pytest.raises(PrivacyRefusal, match="must begin with the 2 steps"):
        opt.load_state_dict(other["optimizer"])
    assert opt.ledger.num_steps == 2


def test_an_optimizer_state_beside_other_weights_is_refused():
    model, opt, dl = _build(seed=1)
    _train(model, opt, dl, 3)
    ckpt = _checkpoint(model, opt)
    fresh_model, fresh_opt, _ = _build(seed=1, init=7)   # other weights, model not loaded
    with pytest.raises(PrivacyRefusal, match=r"model.load_state_dict\(ckpt\['model'\]\)"):
        fresh_opt.load_state_dict(ckpt["optimizer"])
    assert fresh_opt.ledger.num_steps == 0
    fresh_model.load_state_dict(ckpt["model"])   # the ordinary resume: model, then optimizer
    fresh_opt.load_state_dict(ckpt["optimizer"])
    assert fresh_opt.ledger.num_steps == 3


def test_an_older_format_is_refused_with_the_fix():
    model, opt, dl = _build(seed=1)
    state = {**opt.state_dict(), "format": "dpfy-optimizer/3"}
    with pytest.raises(ValueError, match="start a new run"):
        opt.load_state_dict(state)


# -- §1.3 the budget guard survives a load -----------------------------------------------------

def test_a_run_built_for_epsilon_1_stays_under_it_after_a_load():
    # Warm-started from a checkpoint written without a horizon (noise_multiplier only): before
    # the fix max_steps became the checkpoint's None and this run trained to ε ≈ 1.9
    pre_model, pre_opt, pre_dl = _build(seed=1, noise_multiplier=4.0)
    _train(pre_model, pre_opt, pre_dl, 2)
    ckpt = _checkpoint(pre_model, pre_opt)
    model, opt, dl = _build(seed=1, noise_multiplier=None, target_epsilon=1.0,
                            target_delta=DELTA, epochs=2)
    assert opt.max_steps == 10 and opt.epsilon_cap == 1.0
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    assert opt.max_steps == 10 and opt.epsilon_cap == 1.0 and opt.ledger.num_steps == 2
    with pytest.raises(BudgetExhausted):
        _train(model, opt, dl, 20)
    assert opt.step_count <= 10 and opt.epsilon(DELTA) <= 1.0


def test_a_checkpoints_guard_holds_in_a_run_built_without_one():
    model, opt, dl = _build(seed=1, noise_multiplier=None, target_epsilon=1.0,
                            target_delta=DELTA, epochs=2)
    _train(model, opt, dl, 2)
    ckpt = _checkpoint(model, opt)
    model2, opt2, dl2 = _resume(ckpt, seed=1, noise_multiplier=opt.noise_multiplier)
    assert opt2.max_steps == 10 and opt2.epsilon_cap == 1.0 and opt2.target_delta == DELTA
    with pytest.raises(BudgetExhausted):
        _train(model2, opt2, dl2, 20)
    assert opt2.step_count == 10 and opt2.epsilon(DELTA) <= 1.0


def test_caps_at_different_deltas_are_refused():
    model, opt, dl = _build(seed=1, epsilon_cap=3.0, target_delta=DELTA)
    ckpt = _checkpoint(model, opt)
    _, opt2, _ = _build(seed=1, epsilon_cap=3.0, target_delta=1e-6)
    with pytest.raises(ValueError, match="checkpoint's target_delta"):
        opt2.load_state_dict(ckpt["optimizer"])


# -- §4 smaller holes ---------------------------------------------------------------------------

def test_gdp_epsilon_needs_approximate_and_comes_with_the_rigorous_one():
    model, opt, dl = _build(seed=1, noise_multiplier=0.8, accountant="gdp")
    _train(model, opt, dl, 10)
    with pytest.raises(ValueError, match="approximate=True"):
        opt.epsilon(DELTA)
    approx = opt.epsilon(DELTA, approximate=True)
    # the rigorous ε beside it, from dp_accounting's PLD accountant called here directly
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(B / N, dp_accounting.GaussianDpEvent(0.8)),
                10)
    assert approx.rigorous == pytest.approx(acc.get_epsilon(DELTA), rel=1e-2)
    assert approx.rigorous_accountant == "pld" and "rigorous" in repr(approx)
    assert opt.epsilon(DELTA, accountant="pld") == approx.rigorous
    assert isinstance(opt.epsilon(DELTA, accountant="pld", approximate=True), float)


def test_make_private_warns_for_a_seed_only():
    with pytest.warns(SeedWarning, match=r"seed=3\).*undo the privacy"):
        _build(seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SeedWarning)
        _build(seed=None)


class _Tokens(nn.Module):
    """One Linear(4, 4) over every position: ghost for T² < 16, per-sample otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x).mean(1)


@pytest.mark.parametrize("length", [2, 8])
def test_the_route_table_does_not_depend_on_the_last_batch(length):
    # a batch padded to its longest sequence: T = 2 would take the ghost route, T = 8 not;
    # before the fix the report's table stated the last training batch's route
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(16, length, 4), torch.randint(0, 4, (16,)))
    model = _Tokens()
    model, opt, dl = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                       DataLoader(ds, batch_size=8), noise_multiplier=1.0)
    _train(model, opt, dl, 2)
    for rows in (opt.grads.explain(), opt.grads.explain_planned()):
        assert [r["route"] for r in rows] == ["ghost or per-sample, by size per batch"]
    # a step refused after its forward/backward leaves captures: the report ignores them
    opt.max_steps = opt.step_count
    x, y = next(iter(dl))
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(BudgetExhausted):
        opt.step()
    assert [r["route"] for r in opt.grads.explain_planned()] == [
        "ghost or per-sample, by size per batch"]
