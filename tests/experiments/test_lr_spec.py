"""``dpfy experiment lr-fmnist``'s run spec and NonDP-GS: the spec survives JSON, holds no seed,
refuses settings that are not one of the two comparisons, and NonDP-GS's tuning cost is marked
as not accounted (Bu & Liu 2025, §5: the grid's best is chosen without charging the grid)."""

from __future__ import annotations

import json

import pytest

from experiments.lr_fmnist.baselines import nondp_gs
from experiments.lr_fmnist.spec import NONDP_GS_GRID, LrSpec


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
    dict(comparison="004", method="hyfree"),                              # no ε = ∞ row
    dict(comparison="004", method="noisy_max"),
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


def test_build_specs_orders_by_priority_with_hyfree_last_in_each_tier():
    from experiments.cli import build_parser
    args = build_parser().parse_args("lr-fmnist --seeds 2 --lr-epsilons 3 inf 1 "
                             "--lr-000-train-size 300 --lr-000-epochs 5".split())
    from experiments.lr_fmnist.main import build_specs
    specs = build_specs(args)
    labels = [s.label for s in specs]
    assert labels[:4] == [f"000 tanh_cnn {m} σ=2 rep 0"
                          for m in ("sgd", "adadp", "quantile", "time_decay")]
    assert specs[0].train_size == 300 and specs[0].epochs == 5 and specs[4].epochs == 3
    # tier 1 (ε = 3, ∞): HyFreeDP at ε = 3 after every other tier-1 run, before tier 2 (ε = 1)
    hy = labels.index("004 tanh_cnn hyfree ε=3 rep 0")
    assert labels.index("004 tanh_cnn default ε=∞ rep 0") < hy
    assert hy < labels.index("004 tanh_cnn adamw lr=5e-05 ε=1 rep 0")
    assert not any(s.method in ("dp_hyper", "hyfree") and s.epsilon is None for s in specs)
    assert sum(s.method == "adamw" for s in specs) == 2 * 3 * len(NONDP_GS_GRID)
    assert sum(s.comparison == "000" for s in specs) == 4              # 000: one replicate
    assert len({s.key() for s in specs}) == len(specs)
