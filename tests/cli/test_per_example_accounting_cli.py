"""`dpfy account --individual RUN_DIR` (individual accounting, Yu et al.): the per-example ε a
run's saved norms give equal NormTracker.epsilons on the same ledger and norms, the output says
the ε are data-dependent, and the individual-only flags are refused without --individual. (The
accounting against dp_accounting: tests/privacy/test_per_example_accounting.py.)"""

import numpy as np
import pytest

from dpfy.privacy import Ledger
from dpfy.privacy.per_example_accounting import DATA_DEPENDENT_WARNING
from dpfy.types.sampling import Sampling

Q, SIGMA, T = 0.1, 1.1, 20  # a short homogeneous run on 100 examples


def _ledger(sampling=Sampling.POISSON):
    return Ledger.homogeneous(sample_rate=Q, noise_multiplier=SIGMA, steps=T, sampling=sampling,
                              dataset_size=100)  # fmt: skip


def test_cli_account_individual(tmp_path, capsys):
    import json

    import torch
    import torch.nn.functional as F
    from torch import nn

    from dpfy.cli import main
    from dpfy.norm_tracker import NormTracker

    torch.manual_seed(0)
    x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
    tracker = NormTracker(nn.Linear(4, 2), F.cross_entropy, x, y, clip=0.5, refresh_every=5)
    for _ in range(T):
        tracker.before_step()
    (tmp_path / "ledger.json").write_text(_ledger().to_json())
    tracker.save(tmp_path / "per_example_norms.npz")
    assert main(["account", "--individual", str(tmp_path), "--delta", "1e-5", "--rounding",
                 "0.01", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    direct = tracker.epsilons(_ledger(), delta=1e-5, rounding=0.01)
    assert out["run_epsilon"] == pytest.approx(direct.run_epsilon, rel=1e-12)
    assert out["quantiles"]["1.0"] == pytest.approx(direct.epsilons.max(), rel=1e-12)
    assert "not a privacy guarantee" in out["note"]
    assert main(["account", "--individual", str(tmp_path), "--delta", "1e-5"]) == 0
    assert DATA_DEPENDENT_WARNING in capsys.readouterr().out
    assert main(["account", "--ledger", str(tmp_path), "--delta", "1e-5", "--histogram",
                 str(tmp_path / "h.png")]) == 2  # fmt: skip
    assert "histogram must be unset without --individual" in capsys.readouterr().err
    assert main(["account", "--individual", str(tmp_path), "--delta", "1e-5", "--all-orders",
                 "--json"]) == 0  # fmt: skip
    every = tracker.epsilons(_ledger(), delta=1e-5, orders="all")
    assert json.loads(capsys.readouterr().out)["quantiles"]["0.5"] == pytest.approx(
        float(np.quantile(every.epsilons, 0.5)), rel=1e-12
    )
    assert main(["account", "--ledger", str(tmp_path), "--delta", "1e-5", "--all-orders"]) == 2
    assert "--all-orders must be unset without --individual" in capsys.readouterr().err
