"""``dpfy experiment idp-fmnist``: a smoke run of every variant on tiny synthetic data.

One run per variant (64 synthetic 1×28×28 images, batch 16, one epoch = 4 steps). Checks the
record's fields, that resuming skips finished runs, and each group's ε: an IDP group's ε by RDP
(the calibration accountant) is at most its budget, and its ε by PLD equals dp_accounting's PLD
of the Poisson-subsampled Gaussian at the group's own (q_p, σ_p) over the run's steps; a uniform
run's groups share the run's ε (the strictest variant's is ≤ min ε_p).
"""

from __future__ import annotations

import dp_accounting
import pytest
import torch

from experiments.idp_fmnist.main import run_specs
from experiments.idp_fmnist.spec import VARIANTS, IdpSpec

# Half of Case 1's budgets {1, 2, 3} (the fractions are Case 1's): every check here holds for
# any budgets, and the larger σ's they need make the RDP calibrations and PLD grids cheaper
# (this file: 25.5 -> 22.2 s of CPU).
BUDGETS, FRACTIONS = (0.5, 1.0, 1.5), (0.34, 0.43, 0.23)
N, BATCH = 64, 16


def _pld_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.SelfComposedDpEvent(step, steps))
    return acc.get_epsilon(delta)


@pytest.fixture(scope="module")
def records(tmp_path_factory, tiny_images):
    torch.set_num_threads(1)
    data = tiny_images(N)
    specs = [IdpSpec(case="tiny", budgets=BUDGETS, fractions=FRACTIONS, variant=v, epochs=1,
                     batch_size=BATCH, train_size=N, test_size=32, lr=0.5)
             for v in VARIANTS]
    out = tmp_path_factory.mktemp("idp")
    recs = run_specs(specs, results=out / "r.jsonl", log=out / "log", data=data)
    again = run_specs(specs, results=out / "r.jsonl", log=out / "log", data=data)
    assert again == recs                                   # resumed: nothing re-run
    return {r["spec"]["variant"]: r for r in recs}


def test_one_record_per_variant_with_its_fields(records):
    assert sorted(records) == sorted(VARIANTS)
    for r in records.values():
        assert r["steps"] == 4 and r["sample_rate"] == BATCH / N
        assert 0 <= r["test_accuracy"] <= 100 and "seed" not in r["spec"]
        assert [g["budget"] for g in r["groups"]] == list(BUDGETS)
        assert sum(g["examples"] for g in r["groups"]) == N
        assert [g["examples"] for g in r["groups"]] == [22, 27, 15]   # round(r_p·64), ties up
        for g in r["groups"]:
            assert {"epsilon_pld", "epsilon_rdp", "sample_rate", "noise_multiplier",
                    "train_accuracy", "fraction"} <= set(g)
        assert (r["group_ledgers"] is None) == r["spec"]["variant"].startswith("uniform")


@pytest.mark.parametrize("variant", ["idp-sample", "idp-scale"])
def test_idp_groups_spend_at_most_their_budget(records, variant):
    r = records[variant]
    for g in r["groups"]:
        assert g["epsilon_rdp"] <= g["budget"]
        assert g["epsilon_pld"] == pytest.approx(
            _pld_epsilon(g["sample_rate"], g["noise_multiplier"], r["steps"], 1e-5), rel=1e-3)
    if variant == "idp-sample":     # higher budget, higher rate; one σ
        rates = [g["sample_rate"] for g in r["groups"]]
        assert rates == sorted(rates) and len({g["noise_multiplier"] for g in r["groups"]}) == 1
    else:                           # one rate; higher budget, less effective noise
        sigmas = [g["noise_multiplier"] for g in r["groups"]]
        assert sigmas == sorted(sigmas, reverse=True)
        assert len({g["sample_rate"] for g in r["groups"]}) == 1


def test_uniform_runs_account_every_group_alike(records):
    strict, weighted = records["uniform-strict"], records["uniform-weighted"]
    for r in (strict, weighted):
        assert len({g["epsilon_pld"] for g in r["groups"]}) == 1
    assert strict["groups"][0]["epsilon_rdp"] <= min(BUDGETS)
    weighted_budget = sum(e * f for e, f in zip(BUDGETS, FRACTIONS))
    assert weighted["groups"][0]["epsilon_rdp"] <= weighted_budget
    assert weighted["groups"][0]["epsilon_rdp"] > min(BUDGETS)     # overspends group 0
