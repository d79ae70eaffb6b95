"""issue 38 §3: ``make_private(individual_accounting=K)`` and ``dpfy train --individual-accounting
K`` record the clipped norms, and ``dpfy account --individual RUN_DIR`` works on the run.

Numbers come from derivations and an independent library: the norms from a float64 loop of
autograd per example, the run's ε from dp_accounting's RDP accountant; the bound
max_i ε_i ≤ ε from ‖clip(g_i)‖ ≤ C ⇒ σC/‖clip(g_i)‖ ≥ σ and RDP monotone in the noise
multiplier (a larger multiplier never costs more).
"""

import copy
import json

import dp_accounting
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.cli import main
from dpfy.individual_tracking import NORMS_FILE, save_norms

FAST = [
    "--dataset",
    "digits",
    "--model",
    "logreg",
    "--epochs",
    "2",
    "--batch-size",
    "128",
    "--lr",
    "1.0",
    "--clip",
    "1.0",
    "--threads",
    "1",
    "--no-progress",
    "--seed",
    "3",
    "--accountant",
    "rdp",
]


def per_example_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def _train(tmp_path, k):
    torch.manual_seed(0)
    x, y = torch.randn(40, 5), torch.randint(0, 3, (40,))
    model = nn.Linear(5, 3)
    start = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    kw = {} if k is None else {"individual_accounting": k}
    model, opt, loader = dpfy.make_private(
        model,
        opt,
        DataLoader(TensorDataset(x, y), batch_size=10),
        noise_multiplier=1.0,
        max_grad_norm=0.3,
        seed=7,
        loss_fn=per_example_loss,
        **kw,
    )
    for xb, yb in loader:
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    return x, y, start, model, opt


def test_make_private_records_the_clipped_norms_and_leaves_training_unchanged(tmp_path):
    x, y, start, model, opt = _train(tmp_path, k=2)
    _, _, _, plain, plain_opt = _train(tmp_path, k=None)
    # never used in training: the same seeded run, tracked or not, ends at the same weights
    for p, q in zip(model.parameters(), plain.parameters()):
        assert torch.equal(p, q)
    assert opt.ledger.to_json() == plain_opt.ledger.to_json()
    path = save_norms(opt, tmp_path)
    assert save_norms(plain_opt, tmp_path / "none") is None
    with np.load(path) as f:
        ratios, k = f["ratios"], int(f["refresh_every"])
    steps = opt.ledger.num_steps
    assert k == 2 and ratios.shape == (-(-steps // 2), 40)
    # row 0: the initial model's per-example gradient norms, a float64 loop, / C capped at 1
    m64 = copy.deepcopy(start).double()
    want = []
    for i in range(40):
        m64.zero_grad()
        F.cross_entropy(m64(x[i : i + 1].double()), y[i : i + 1]).backward()
        want.append(
            min(1.0, float(torch.cat([p.grad.flatten() for p in m64.parameters()]).norm()) / 0.3)
        )
    # float32 gradients of O(1) values: relative error ~1e-6; 1e-5 leaves room
    np.testing.assert_allclose(ratios[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"loss_fn": None}, "loss_fn must be given"),
        ({"individual_accounting": 0}, "individual_accounting must be an integer K >= 1"),
        ({"clipping": "per_layer"}, "clipping must be 'flat'"),
    ],
)
def test_refusals_name_the_fix(kw, match):
    model = nn.Linear(5, 3)
    args = {
        "noise_multiplier": 1.0,
        "max_grad_norm": 0.3,
        "loss_fn": per_example_loss,
        "individual_accounting": 2,
        **kw,
    }
    ds = TensorDataset(torch.randn(40, 5), torch.randint(0, 3, (40,)))
    with pytest.raises(ValueError, match=match):
        dpfy.make_private(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            DataLoader(ds, batch_size=10),
            **args,
        )


def test_train_flag_then_account_individual(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", *FAST, "--individual-accounting", "3", "--out", str(out)]) == 0
    assert (out / NORMS_FILE).is_file()
    capsys.readouterr()
    ledger = json.loads((out / "ledger.json").read_text())
    delta = json.loads((out / "summary.json").read_text())["delta"]
    assert main(["account", "--individual", str(out), "--delta", str(delta)]) == 0
    printed = capsys.readouterr().out
    assert "| 0.5 |" in printed and "data-dependent" in printed
    assert main(["account", "--individual", str(out), "--delta", str(delta), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    worst = max(res["quantiles"].values())
    # the run's ε, independently: T Poisson-subsampled Gaussians (q, σ) in dp_accounting's RDP
    (group,) = ledger["groups"]
    (release,) = group["releases"]
    acc = dp_accounting.rdp.RdpAccountant(DEFAULT_RDP_ORDERS)
    acc.compose(
        dp_accounting.PoissonSampledDpEvent(
            group["sample_rate"], dp_accounting.GaussianDpEvent(release["noise_multiplier"])
        ),
        ledger["num_steps"],
    )
    run_eps = acc.get_epsilon(delta)
    assert res["run_epsilon"] == pytest.approx(run_eps, rel=1e-9)
    # ρ_i ≤ 1 ⇒ σ/ρ_i ≥ σ ⇒ ε_i ≤ ε; equality where an example stays clipped throughout
    assert worst <= run_eps * (1 + 1e-12)
    assert min(res["quantiles"].values()) < worst  # the norms do vary: some examples unclipped


def test_individual_budgets_refused():
    from dpfy.train.config import TrainConfig

    with pytest.raises(ValueError, match="individual_accounting must be unset with --individual"):
        TrainConfig(
            dataset="digits",
            individual="scale",
            budgets="1,2",
            budget_fractions="0.5,0.5",
            epsilon=None,
            individual_accounting=2,
        )


def test_resume_refused():
    """The norms recorded before an interruption are not in the checkpoint: refused."""
    from types import SimpleNamespace

    from dpfy.train.config import TrainConfig
    from dpfy.train.trainer import _resume

    stored = TrainConfig(dataset="digits", individual_accounting=2).to_dict()
    ckpt = SimpleNamespace(config=stored, notes={})
    with pytest.raises(ValueError, match="individual_accounting must be unset to resume"):
        _resume(None, ckpt, None, None, None, False, print)  # type: ignore[arg-type]
