"""``dpfy experiment lr-fmnist``'s run spec and NonDP-GS: the spec survives JSON, holds no seed,
refuses settings that are not one of the two comparisons, and NonDP-GS's tuning cost is marked
as not accounted (004 §5.1: the grid's best is chosen without charging the grid)."""

from __future__ import annotations

import json

import pytest

from dpfy.experiments.lr_baselines import nondp_gs
from dpfy.experiments.lr_spec import NONDP_GS_GRID, LrSpec


def test_spec_round_trips_through_json_and_holds_no_seed():
    specs = [LrSpec(comparison="004", method="adamw", epsilon=3.0, lr=1e-3),
             LrSpec(comparison="004", method="hyfree", epsilon=1.0, model="groupnorm_cnn"),
             LrSpec(comparison="004", method="default"),                       # ε = ∞
             LrSpec(comparison="000", method="time_decay", noise_multiplier=2.0)]
    for s in specs:
        back = LrSpec.from_dict(json.loads(json.dumps(s.to_dict())))
        assert back == s and back.key() == s.key()
        assert not any("seed" in k for k in s.to_dict())
    assert len({s.key() for s in specs}) == len(specs)
    assert not specs[2].private and specs[0].private and specs[3].private


@pytest.mark.parametrize("kw", [
    dict(comparison="004", method="adamw", epsilon=3.0),                  # no grid lr
    dict(comparison="004", method="hyfree", epsilon=3.0, lr=1e-3),        # lr only for adamw
    dict(comparison="000", method="sgd"),                                 # 000 needs σ
    dict(comparison="000", method="sgd", noise_multiplier=2.0, epsilon=1.0),
    dict(comparison="004", method="time_decay", epsilon=3.0),             # a 000 method
    dict(comparison="004", method="adamw", epsilon=float("inf"), lr=1e-3),  # ∞ is None
])
def test_spec_refuses_what_is_not_a_run_of_either_comparison(kw):
    with pytest.raises(ValueError, match="must be"):
        LrSpec(**kw)


def _record(lr: float, acc: float) -> dict:
    spec = LrSpec(comparison="004", method="adamw", epsilon=3.0, lr=lr)
    return {"spec": spec.to_dict(), "test_accuracy": acc, "epsilon_pld": 2.999}


def test_nondp_gs_is_the_best_grid_point_and_is_marked_not_accounted():
    accs = [60.0, 71.0, 80.5, 79.0, 40.0]
    got = nondp_gs([_record(lr, a) for lr, a in zip(NONDP_GS_GRID, accs)])
    assert got["test_accuracy"] == 80.5 and got["lr"] == 5e-4
    assert got["complete_grid"] and got["accounted"] is False
    assert "NOT accounted" in got["tuning_cost"]
    # the ε shown is one run's, never presented as the grid's
    assert got["epsilon_one_run"] == 2.999
    assert not nondp_gs([_record(1e-3, 50.0)])["complete_grid"]
