"""The DP-FedAvg server's run spec (issue 37 §1, §3): the server states its run with the same
:class:`dpfy.spec.RunSpec` that ``make_private`` builds, checked by the same checker.

A DP-FedAvg round is a ULS step whose units are users (``test_fedsgd_equals_uls.py``), so the
server's spec is compared with the spec ``make_private`` builds for a user-level ULS run with
the same users, rate, σ or target, δ, C and length: the expected value is the other entry
point's, not the server's. σ calibrated to a target is also checked against dp_accounting's
RDP accountant (an independent library), as ``test_fedavg_server.py`` checks it.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import dp_accounting
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import make
from dpfy.adaptive.base import Method
from dpfy.federated import DPFedAvgServer
from dpfy.privacy import Sampling
from dpfy.privacy.events import Poisson, UserLevelSampling
from dpfy.spec import Gaussian, RunSpec, UserUnit
from dpfy.types import ReleaseSpec

N_USERS, ROWS, Q, ROUNDS, DELTA, CLIP = 12, 3, 0.5, 4, 1e-3, 0.5


def _model():
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def _server(**kw):
    args = dict(
        num_users=N_USERS,
        user_sample_rate=Q,
        clip=CLIP,
        delta=DELTA,
        rounds=ROUNDS,
        accountant="rdp",
    )
    args.update(kw)
    return DPFedAvgServer(_model(), **args)


def _make_private_spec(**kw) -> RunSpec:
    """The spec make_private builds for the same user-level run: N_USERS users of ROWS rows,
    ULS at q_u = batch_size / N_USERS = Q, C = CLIP, δ, RDP, ROUNDS steps."""
    ids = torch.arange(N_USERS).repeat_interleave(ROWS)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(
        torch.randn(len(ids), 4, generator=g), torch.randint(0, 3, (len(ids),), generator=g)
    )
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the δ and seed notes
        _, opt, _ = dpfy.make_private(
            model,
            torch.optim.SGD(model.parameters(), lr=1.0),
            DataLoader(data, batch_size=int(Q * N_USERS)),
            max_grad_norm=CLIP,
            target_delta=DELTA,
            max_steps=ROUNDS,
            accountant="rdp",
            user_ids=ids,
            user_sampling="uls",
            **kw,
        )
    return opt.spec


def test_the_server_spec_is_a_user_level_uls_run_at_the_user_rate():
    spec = _server(noise_multiplier=1.3).spec
    assert isinstance(spec, RunSpec)
    assert isinstance(spec.unit, UserUnit) and spec.unit.sampling == "uls"
    assert spec.sampling.kind is Poisson
    assert spec.sampling.resolved == UserLevelSampling(Q, dataset_size=N_USERS)
    assert spec.sampling.resolved.sampling is Sampling.ULS
    assert spec.noise == Gaussian(1.3)
    assert spec.clipping.kind == "flat" and spec.clipping.max_grad_norm == CLIP
    acc = spec.accounting
    assert (acc.accountant, acc.delta, acc.max_steps, acc.target_epsilon, acc.epsilon_cap) == (
        "rdp",
        DELTA,
        ROUNDS,
        None,
        None,
    )
    json.dumps(spec.to_dict())  # the spec as JSON-readable values, for a report or config


def test_the_server_spec_equals_make_privates_for_the_same_user_level_run():
    assert _server(noise_multiplier=1.3, seed=5).spec == _make_private_spec(
        noise_multiplier=1.3, seed=5
    )


def test_a_calibrated_sigma_is_make_privates_and_meets_the_target_by_dp_accounting():
    server = _server(target_epsilon=3.0)
    sigma = server.spec.noise.noise_multiplier
    assert sigma == server.noise_multiplier
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(
        dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma)), ROUNDS
    )
    # the calibration's bracket is 1 % of the target wide (sigma_calibration's search)
    assert 2.95 <= acc.get_epsilon(DELTA) <= 3.0 + 1e-9
    expected = _make_private_spec(target_epsilon=3.0)
    # the one difference: make_private caps ε at the target (its guard refuses a step past
    # it); the server's guard stops at the planned rounds, with no ε cap
    assert expected.accounting.epsilon_cap == 3.0
    uncapped = dataclasses.replace(expected.accounting, epsilon_cap=None)
    assert server.spec == dataclasses.replace(expected, accounting=uncapped)


def test_the_quantile_method_sets_C_and_is_in_the_spec():
    method = make("quantile", initial_clip=0.5, count_noise_std=2.0)
    spec = _server(clip=None, noise_multiplier=1.0, method=method).spec
    assert spec.method is method and spec.clipping.max_grad_norm is None
    assert spec.to_dict()["method"] == "quantile"


def test_an_unknown_accountant_is_refused_when_the_server_is_built():
    """Before, the server took any accountant name and failed only when ε was read."""
    with pytest.raises(ValueError, match="accountant must be one of"):
        _server(noise_multiplier=1.0, accountant="prv")


def test_the_spec_checker_refuses_an_approximate_accountant_deciding_sigma():
    """GDP's CLT can under-report ε: the checker refuses it for a target ε with make_private's
    message (before, the calibrator refused it later, with its own)."""
    with pytest.raises(ValueError, match=r"accountant must be one of \['pld', 'rdp'\] when it"):
        _server(target_epsilon=3.0, accountant="gdp")


class _LossProbe(Method):
    """A method whose one release is a loss probe: DP-FedAvg computes no loss on the server."""

    def releases(self, state, plan):
        return {"probe": ReleaseSpec(1.0, 1.0, kind="loss", offsets={})}


def test_a_loss_probe_is_refused_when_the_server_is_built_not_at_its_first_round():
    with pytest.raises(ValueError, match="of kind 'values' in DP-FedAvg"):
        _server(noise_multiplier=1.0, method=_LossProbe())


def test_delta_is_held_to_the_users_as_make_private_holds_it():
    # the guide's rule (dpfy.privacy.delta_check): δ counted against N users; make_private
    # refuses δ ≥ 1/√N and warns at δ ≥ 1/N for a user-level run, and so does the server
    from dpfy.privacy.delta_check import DeltaWarning

    with pytest.raises(ValueError, match=r"delta must be < 1/√N = 0\.289 for N = 12 users"):
        _server(delta=0.3, noise_multiplier=1.0)
    with pytest.warns(DeltaWarning, match=r"delta = 0\.1 is >= 1/N = 0\.0833 for N = 12 users"):
        _server(delta=0.1, noise_multiplier=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeltaWarning)
        _server(noise_multiplier=1.0)  # δ = 1e-3 < 1/N
