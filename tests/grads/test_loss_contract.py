"""The loss contract, checked at the first step and by ``validate``: the loss backpropagated must
be the mean (or sum, as ``loss_reduction`` says) of per-example losses from the model's output,
with no term autograd cannot differentiate and no divisor that depends on the batch.

Expected outcomes are derived here from the definition of each loss, not from dpfy: e.g.
``reduction="sum"`` is B·mean, so under ``loss_reduction="mean"`` the engine would read each
example's gradient B times too large; an L2 term on held parameters has no autograd path."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import PrivacyRefusal

warnings.filterwarnings("ignore", message="noise_multiplier=0")
# torch's own warning on a broadcasting loss (the cases below that broadcast on purpose)
pytestmark = pytest.mark.filterwarnings("ignore:Using a target size")


def _run(loss, *, reduction="mean", steps=2):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, DataLoader(data, batch_size=16),
                                           noise_multiplier=1.0, loss_reduction=reduction,
                                           seed=0)
    for i, (x, y) in enumerate(loader):
        if i == steps:
            break
        opt.zero_grad()
        loss(model, x, y).backward()
        opt.step()
    return opt


GOOD = {
    "mean": (lambda m, x, y: F.cross_entropy(m(x), y), "mean"),
    "module": (lambda m, x, y: nn.CrossEntropyLoss()(m(x), y), "mean"),
    "sum over B": (lambda m, x, y: F.cross_entropy(m(x), y, reduction="sum") / len(x), "mean"),
    "none then mean": (lambda m, x, y: F.cross_entropy(m(x), y, reduction="none").mean(),
                       "mean"),
    "scaled": (lambda m, x, y: 0.5 * F.mse_loss(m(x), F.one_hot(y, 3).float()), "mean"),
    # a target of no batch dimension broadcasts across examples: the same constant for each
    "mse against a constant": (lambda m, x, y: F.mse_loss(m(x), torch.zeros(3)), "mean"),
    "mse (B, 1) vs (B, 1)": (lambda m, x, y: F.mse_loss(m(x)[:, :1], y.float()[:, None]),
                             "mean"),
    # a per-class constant whose length happens to be B: each example meets the same constant
    "mse against a constant of length B": (lambda m, x, y: F.mse_loss(
        m(x)[:, :1].expand(-1, len(x)), torch.arange(float(len(x)))), "mean"),
    "(o (B, 1) - y (B, 1))² by hand": (lambda m, x, y: (m(x)[:, :1] - y.float()[:, None])
                                        .pow(2).mean(), "mean"),
    "(o (B,) - y (B,))² by hand": (lambda m, x, y: (m(x)[:, 0] - y.float()).pow(2).mean(),
                                   "mean"),
    # a per-feature constant broadcast over the batch (its length need not differ from B)
    "o (B, 3) - a constant (3,)": (lambda m, x, y: F.cross_entropy(m(x) - torch.ones(3), y),
                                   "mean"),
    "per-token (3B, 1) vs (3B, 1)": (lambda m, x, y: F.mse_loss(
        m(x).reshape(-1, 1), y.float().repeat_interleave(3)[:, None]), "mean"),
    "gaussian_nll (B, 1) vs (B, 1), var (B,)": (lambda m, x, y: F.gaussian_nll_loss(
        m(x)[:, :1], y.float()[:, None], torch.ones(len(x))), "mean"),
    # a constant per-example scale k = 10: clipped at C/10 at every step (module docstring)
    "10 × mean": (lambda m, x, y: 10 * F.cross_entropy(m(x), y), "mean"),
    "sum / 32 × 32 under sum": (lambda m, x, y: F.cross_entropy(m(x), y, reduction="sum")
                                / 32 * 32, "sum"),
    "sum": (lambda m, x, y: F.cross_entropy(m(x), y, reduction="sum"), "sum"),
    # targets and constants inside each example's own loss are not extra terms or divisors
    "targets subtracted": (lambda m, x, y: (0.5 * (m(x)[:, 0] - y.float()) ** 2).mean(),
                           "mean"),
    "temperature": (lambda m, x, y: F.cross_entropy(m(x) / torch.tensor(2.0), y), "mean"),
    "per-example weights": (lambda m, x, y: (F.cross_entropy(m(x), y, reduction="none")
                                             * (1 + y.float())).mean(), "mean"),
}


@pytest.mark.parametrize("case", sorted(GOOD))
def test_losses_that_keep_the_contract_train(case):
    loss, reduction = GOOD[case]
    assert _run(loss, reduction=reduction).step_count == 2


BAD = {
    "sum under mean": (lambda m, x, y: F.cross_entropy(m(x), y, reduction="sum"), "mean",
                       r"scale is k = B \(the sum over the batch;.*loss_reduction='sum'"),
    "none.sum under mean": (lambda m, x, y: F.cross_entropy(m(x), y, reduction="none").sum(),
                            "mean", r"scale is k = B \(the sum"),
    "mean under sum": (lambda m, x, y: F.cross_entropy(m(x), y), "sum",
                       r"scale is k = 1/B \(the mean over the batch;"),
    # issue 35 §3: refused as "reduced by 'sum'" before, without the scale it measured. The sum
    # divided by a constant is B/32 times each example's gradient: k moves with Poisson's B.
    "sum / 32 under mean": (lambda m, x, y: F.cross_entropy(m(x), y, reduction="sum") / 32,
                            "mean", r"k = B / 32 \(the sum over the batch / 32; k = "
                                    r"[0-9.]+ at this batch of B = \d+ rows\)"),
    "3 × mean under sum": (lambda m, x, y: 3 * F.cross_entropy(m(x), y), "sum",
                           r"k = \(1/B\) × 3 \(the mean over the batch × 3;"),
    "l2 penalty": (lambda m, x, y: F.cross_entropy(m(x), y)
                   + 1e-3 * sum(p.pow(2).sum() for p in m.parameters()), "mean",
                   r"L2 penalty.*weight_decay="),
    "penalty per example": (lambda m, x, y: (F.cross_entropy(m(x), y, reduction="none")
                                             + m[0].weight.pow(2).sum()).mean(), "mean",
                            r"L2 penalty"),
    "token count divisor": (lambda m, x, y: F.cross_entropy(m(x), y, reduction="sum")
                            / torch.tensor(37.0), "mean", r"num_items_in_batch"),
    "unequal ignored targets": (lambda m, x, y: F.cross_entropy(
        m(x), torch.where(torch.arange(len(y)) % 3 == 0, -100, y)), "mean",
        r"ignore_index=-100\) in unequal numbers"),
    "class weights": (lambda m, x, y: F.cross_entropy(m(x), y, weight=torch.ones(3)), "mean",
                      r"class weights"),
    # (B, 1) against (B,) broadcasts to (B, B): Σ_ij (o_i − y_j)², so example j's target
    # reaches every example's gradient; torch only warns
    "mse (B, 1) vs (B,)": (lambda m, x, y: F.mse_loss(m(x)[:, :1], y.float()), "mean",
                           r"mse_loss's input and target must have the same number of "
                           r"dimensions, got input.shape = \(\d+, 1\) and target.shape = "),
    "l1 (B,) vs (B, 1)": (lambda m, x, y: nn.L1Loss()(m(x)[:, 0], y.float()[:, None]), "mean",
                          r"l1_loss's input and target.*target.unsqueeze"),
    # the same (B, B) broadcast where torch does not even warn
    "gaussian_nll (B, 1) vs (B,)": (lambda m, x, y: F.gaussian_nll_loss(
        m(x)[:, :1], y.float(), torch.ones(len(x), 1)), "mean", r"gaussian_nll_loss's input"),
    "kl_div (B, 1) vs (B,)": (lambda m, x, y: F.kl_div(
        m(x)[:, :1], y.float().div(3), reduction="batchmean"), "mean", r"kl_div's input"),
    "hinge_embedding (B, 1) vs (B,)": (lambda m, x, y: F.hinge_embedding_loss(
        m(x)[:, :1], 2.0 * (y > 0) - 1), "mean", r"hinge_embedding_loss's input"),
    # tokens flattened: (B·T, 1) against (B·T,) broadcasts to (B·T, B·T)
    "mse (3B, 1) vs (3B,)": (lambda m, x, y: F.mse_loss(
        m(x).reshape(-1, 1), y.float().repeat_interleave(3)), "mean",
        r"got input.shape = \(\d+, 1\)"),
    # the target subtracted by hand, either way round: Σ_ij (o_i − y_j)²
    "(o (B, 1) - y (B,))² by hand": (lambda m, x, y: (m(x)[:, :1] - y.float()).pow(2).mean(),
                                     "mean", r"a subtraction's input and target"),
    "(y (B,) - o (B, 1))² by hand": (lambda m, x, y: (y.float() - m(x)[:, :1]).pow(2).mean(),
                                     "mean", r"a subtraction's input and target"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_losses_that_break_the_contract_are_refused_at_the_first_step(case):
    loss, reduction, match = BAD[case]
    with pytest.raises(PrivacyRefusal, match=match):
        _run(loss, reduction=reduction)


def test_the_fix_is_checked_and_nothing_was_released():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, DataLoader(data, batch_size=16),
                                           noise_multiplier=1.0, seed=0)
    x, y = next(iter(loader))
    F.cross_entropy(model(x), y, reduction="sum").backward()
    with pytest.raises(PrivacyRefusal):
        opt.step()
    assert opt.step_count == 0 and len(opt.ledger.step_groups) == 0
    opt.zero_grad()
    x, y = next(iter(loader))                      # the same batch, yielded again
    F.cross_entropy(model(x), y, reduction="sum").backward()
    with pytest.raises(PrivacyRefusal):            # still watched until a step passes
        opt.step()
    opt.zero_grad()
    x, y = next(iter(loader))
    F.cross_entropy(model(x), y).backward()
    opt.step()
    assert opt.step_count == 1
    assert type(model(x)) is torch.Tensor           # later forwards are plain


def test_num_items_in_batch_passed_to_the_model_is_refused():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 3)

        def forward(self, x, labels, num_items_in_batch=None):
            loss = F.cross_entropy(self.head(x), labels, reduction="sum")
            return loss / (num_items_in_batch or 1)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    model = LM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, DataLoader(data, batch_size=16),
                                           noise_multiplier=1.0, loss_reduction="sum", seed=0)
    x, y = next(iter(loader))
    model(x, y, num_items_in_batch=torch.tensor(40)).backward()
    with pytest.raises(PrivacyRefusal, match="num_items_in_batch must be 1"):
        opt.step()
    opt.zero_grad()
    x, y = next(iter(loader))
    model(x, y, num_items_in_batch=1).backward()   # the fix the message names
    opt.step()
    assert opt.step_count == 1


def test_validate_reports_the_same():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 0])
    assert dpfy.validate(model, x, loss_fn=lambda out: F.cross_entropy(out, y)) == []
    problems = dpfy.validate(model, x, loss_fn=lambda out: F.cross_entropy(out, y,
                                                                           reduction="sum"))
    assert len(problems) == 1 and "k = B (the sum over the batch; k = 4 at this batch of B = 4" \
        " rows)" in problems[0]
    assert dpfy.validate(model, x, loss_reduction="sum",
                         loss_fn=lambda out: F.cross_entropy(out, y, reduction="sum")) == []


def test_an_empty_first_batch_is_not_refused():
    # The trainer's loop steps an empty Poisson batch on logits.sum() (noise only): no example's
    # gradient is read, so no reduction can be wrong.
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, DataLoader(data, batch_size=1),
                                           noise_multiplier=1.0, seed=1)
    empty = None
    for x, y in loader:
        opt.zero_grad()
        logits = model(x)
        (F.cross_entropy(logits, y) if len(y) else logits.sum()).backward()
        opt.step()
        if len(y) == 0:
            empty = opt.step_count
            break
    assert empty == 1   # seed 1 draws an empty first batch: the case checked
