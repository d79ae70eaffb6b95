"""``dpfy experiment oso-fmnist``: the 002 autoencoder's size, and a smoke run of every method.

The smoke run is tiny (synthetic 8×8 images, 10 steps, k = 2, one run per method) and checks
the records the experiment writes, that resuming skips finished runs, and that each run's grid
(``runs`` runs like it, composed) stays within the per-grid budget by PLD, both as the record
says and by dp_accounting's PLD accountant on the events derived here.
"""

from __future__ import annotations

import json

import dp_accounting
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from experiments.oso_fmnist.main import load_records, run_specs
from experiments.oso_fmnist.grid import PRIVATE_METHODS, RunSpec, Settings, grid
from dpfy.models.conv_autoencoder import conv_autoencoder

# The layer list of the autoencoder's docstring: six 5×5 convolutions (in, out channels).
AE_CONVS = [(1, 12), (12, 16), (16, 48), (48, 16), (16, 12), (12, 1)]


def test_conv_autoencoder_has_the_paper_parameter_count():
    # weights k²·in·out plus out biases per convolution; Galli et al. 2024 Table 1: 48,705
    # parameters
    derived = sum(5 * 5 * c_in * c_out + c_out for c_in, c_out in AE_CONVS)
    assert derived == 48705
    model = conv_autoencoder((1, 28, 28))
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == \
        [(i, o, (5, 5)) for i, o in AE_CONVS]
    assert [type(m) for m in model.modules() if any(True for _ in m.parameters(False))] == \
        [nn.Conv2d] * len(AE_CONVS)                       # nothing else has parameters
    assert sum(p.numel() for p in model.parameters()) == derived
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 1, 28, 28)


def test_conv_autoencoder_refuses_other_shapes():
    with pytest.raises(ValueError, match="input_shape must be"):
        conv_autoencoder((3, 30, 30))


def _grid_epsilon_by_dp_accounting(record: dict, settings: Settings) -> float:
    """ε of ``runs`` composed runs of T Poisson-subsampled Gaussian steps at the record's ν.

    Online's two releases (ν_g = 1.01ν, ν_q = ν/√(1 − 1.01⁻²)) and FixedQuantile's two
    (σ_Δ, 2σ_b) see the same sample and whiten to one Gaussian with σ⁻² = Σ σ_r⁻² = ν⁻²
    (002 Proposition 1; tests/ledger_events.py), so every method's step is one Gaussian at ν.
    """
    step = dp_accounting.PoissonSampledDpEvent(
        settings.sample_rate, dp_accounting.GaussianDpEvent(record["noise_multiplier"]))
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.SelfComposedDpEvent(step, record["runs"] * record["steps"]))
    return acc.get_epsilon(settings.delta)


@pytest.fixture
def one_thread():
    """One torch thread, as the experiment's workers use (tiny convolutions on a shared machine
    are many times slower with an intra-op pool)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_smoke_run_of_every_method_records_and_stays_within_the_grid_budget(tmp_path,
                                                                            one_thread):
    torch.manual_seed(0)       # the synthetic data only; the runs themselves are unseeded
    settings = Settings(train_size=500, test_size=40, batch_size=50, epochs=1, k=2,
                        eval_every=5)
    images = torch.randn(540, 1, 8, 8)
    labels = torch.randint(0, 10, (540,))
    data = (TensorDataset(images[:500], labels[:500]), TensorDataset(images[500:], labels[500:]))
    eps = 1.0                  # ν ≥ 2: PLD calibration stays fast
    specs = [grid(m, eps, settings)[0] for m in PRIVATE_METHODS] + [grid("nodp", None,
                                                                         settings)[0]]
    results, log = tmp_path / "oso.jsonl", tmp_path / "log"
    records = run_specs(specs, results=results, log=log, workers=1, data=data)

    assert [r["key"] for r in records] == [s.key() for s in specs]
    assert "seed" not in results.read_text()            # no seed is ever published
    for spec, r in zip(specs, records):
        assert RunSpec.from_dict(json.loads(json.dumps(r["spec"]))) == spec
        assert r["steps"] == settings.steps == 10 and r["evals"][0][0] == 0
        assert r["evals"][-1][0] == 10 and len(r["evals"]) == 3       # steps 0, 5, 10
        assert r["best"] == min(v for _, v in r["evals"])              # MSE: lower is better
        if spec.method == "nodp":
            assert r["noise_multiplier"] is None and "epsilon_grid_pld" not in r
            continue
        assert r["runs"] == {"online": 2, "threshold": 4, "quantile": 10, "adamwosm": 2}[
            spec.method]                                               # grid sizes at k = 2
        assert r["epsilon_run_pld"] < r["epsilon_grid_pld"] <= eps * (1 + 1e-9)
        # dp_accounting's PLD (its own discretization) on the events derived above
        assert _grid_epsilon_by_dp_accounting(r, settings) <= eps + 1e-3
        assert len(r["trace"]["clip"]) == 10
    # Online started at C₀ = 0.1 and moved by at most e^{±ρ_c} per step (its first step: none)
    online = records[0]
    rate = settings.online_rate
    clips = online["trace"]["clip"]
    assert clips[0] == pytest.approx(0.1)
    assert all(abs(torch.log(torch.tensor(b / a))) <= rate + 1e-9
               for a, b in zip(clips, clips[1:]))

    lines = len(results.read_text().splitlines())
    run_specs(specs, results=results, log=log, workers=1, data=data)      # resume: nothing to do
    assert len(results.read_text().splitlines()) == lines == len(load_records(results))


def test_method_filter_gives_002s_k7_online_grid_alone():
    from experiments.oso_fmnist.main import grid_specs, seed_specs

    settings = Settings(k=7)
    specs = grid_specs(settings, [2.0, 4.0], ["online"])
    # Galli et al. 2024's log-uniform grid: log_grid(-2.5, 1.5, 7) is numpy's logspace; 7 runs
    # share each grid's ε
    assert [s.lr for s in specs] == pytest.approx(list(np.logspace(-2.5, 1.5, 7)) * 2)
    assert {(s.method, s.runs) for s in specs} == {("online", 7)}
    assert [s.epsilon for s in specs] == [2.0] * 7 + [4.0] * 7
    assert all(s.method != "nodp" for s in grid_specs(settings, [1.0], ["threshold"]))
    records = [_record(s, best=float(i)) for i, s in enumerate(specs)]
    records.append(_record(grid("adamwosm", 2.0, settings)[0], best=0.0))
    assert {(s.method, s.epsilon, s.lr, s.replicate) for s in
            seed_specs(records, settings, 3, ["online"])} == {
        ("online", 2.0, specs[0].lr, 1), ("online", 2.0, specs[0].lr, 2),
        ("online", 4.0, specs[7].lr, 1), ("online", 4.0, specs[7].lr, 2)}   # lowest MSE


def _record(spec: RunSpec, best: float) -> dict:
    """A finished run's record with made-up values (what the report reads of it)."""
    private = spec.method != "nodp"
    rec = {"key": spec.key(), "spec": spec.to_dict(), "steps": 2, "diverged": False,
           "evals": [(0, 50.0), (2, best)], "final": best, "best": best, "seconds": 0.0,
           "noise_multiplier": 1.0 if private else None, "runs": spec.runs}
    if private:
        rec.update(epsilon_run_pld=0.5, epsilon_grid_pld=spec.epsilon,
                   trace={"step": [1, 2], "clip": [0.1, 0.1], "lr_scale": [1.0, 0.9]})
    return rec


def test_classifier_and_k7_summaries_get_their_own_files_and_the_classifier_maximizes(
        tmp_path):
    from experiments.oso_fmnist.report import stem, summarize

    clf = Settings(task="classifier")
    online = grid("online", 1.0, clf)
    records = [_record(s, best=b) for s, b in zip(online, [60.0, 85.0, 70.0, 10.0, 10.0])]
    paths = summarize(records, clf, tmp_path)
    assert [p.name for p in paths] == ["oso_fmnist_classifier_tables.md",
                                       "oso_fmnist_classifier_metric_vs_eps.png",
                                       "oso_fmnist_classifier_online_trajectories.png"]
    text = paths[0].read_text()
    assert "| 1 | Online | 5 (5) |" in text and "ρ=0.03162 | 85.0000 |" in text  # accuracy: max
    assert "002 Table 3 (k = 7) |" not in text           # Galli et al.: no F-MNIST classifier
    assert stem(Settings()) == "oso_fmnist"               # the committed autoencoder files
    assert stem(Settings(k=7)) == "oso_fmnist_k7"
    assert stem(Settings(task="classifier", k=7)) == "oso_fmnist_classifier_k7"
    assert not (tmp_path / "oso_fmnist_tables.md").exists()
