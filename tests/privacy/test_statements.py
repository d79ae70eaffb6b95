"""Every statement of ε names its unit of privacy and neighbouring relation, and an accountant
that does not apply to a mechanism is left out with the reason (issue 35 §3).

The ε values are dp_accounting's (RDP and PLD of the user-level Poisson-subsampled Gaussian);
the unit and relation are what the sampler recorded, derived here from the sampling asked for.
The same statements on the command line (`dpfy account`, `dpfy calibrate`):
tests/cli/test_statements_cli.py."""

from __future__ import annotations

import dp_accounting
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.privacy.ledger import Ledger, Sampling


def _uls_optimizer():
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(120, 4, generator=g), torch.randint(0, 2, (120,), generator=g))
    model = nn.Linear(4, 2)
    model, opt, dl = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=6),
        noise_multiplier=1.5, user_ids=torch.arange(120) % 30, user_sampling="uls",
        max_examples_per_user=4, accountant="rdp")
    for i, (x, y) in enumerate(dl):
        if i == 3:
            break
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return opt


def test_optimizer_states_its_unit_and_keeps_epsilon_a_float():
    opt = _uls_optimizer()
    eps = opt.epsilon(1e-5)
    assert type(eps) is float                         # compatibility: a bare number
    acc = dp_accounting.rdp.RdpAccountant()           # 30 users, 6 expected per step: q = 0.2
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.5)), 3)
    assert eps == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    text = opt.privacy_statement(1e-5)
    assert text.startswith(f"ε = {eps:.4g} at δ = 1e-05 for user-level add-or-remove adjacency")
    assert "one user added or removed, with all of their examples" in text and "RDP" in text


# σ of the ELS ledgers: at 2 (not 1) the mixture's PLD builds quicker; what is left out does
# not depend on σ
ELS_SIGMA = 2.0


def test_the_privacy_report_of_an_els_run_leaves_gdp_out():
    from dpfy.privacy.report import PrivacyReport

    ledger = Ledger.homogeneous(sample_rate=0.05, noise_multiplier=ELS_SIGMA, steps=40,
                                sampling=Sampling.ELS, max_examples_per_user=4, dataset_size=100)
    report = PrivacyReport.from_ledger(ledger, delta=1e-5, accountant="pld")
    assert set(report.epsilons) == {"pld", "rdp"} and "gdp" in report.left_out
    assert "| GDP | left out | the GDP CLT is derived for the subsampled Gaussian" in \
        report.to_markdown()
    assert report.to_dict()["left_out"]["gdp"] == report.left_out["gdp"]
    with pytest.raises(ValueError, match="accountant must be one that applies to this ledger"):
        PrivacyReport.from_ledger(ledger, delta=1e-5, accountant="gdp")


@pytest.mark.parametrize("eps, shown", [(1.00049, "1.001"), (8.0004, "8.001"), (2.998, "2.998")])
def test_a_statement_never_shows_a_smaller_epsilon(eps, shown):
    """Regression (adversarial review): ``:.4g`` rounded 1.00049 down to "1". Expected strings
    derived by hand: four significant digits, rounded up."""
    from dpfy.privacy.statement import epsilon_statement

    text = epsilon_statement(eps, 1e-5, unit="example", adjacency="add_or_remove")
    assert text.startswith(f"ε = {shown} at δ = 1e-05 ")
