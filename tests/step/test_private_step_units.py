"""The unit-of-privacy seam, end to end through the private step.

Today every sampler's unit is one example (``ExampleUnits``: each row its own unit). A sampler
whose units group rows (a user's examples, an example's augmented copies) says so through
``units_of(indices)``; the step then clips each unit's summed gradient Σ_{i∈u} g_i and the
update is θ ← θ − lr·Σ_u min(1, C/‖Σ_{i∈u} g_i‖)·Σ_{i∈u} g_i / b. The expected update below is
that formula evaluated with the float64 per-example loop of ``tests/oracles.py``, summed per
unit *before* clipping (a derivation written here, not dpfy's code).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
import oracles


class PairsOfRows:
    """Rows whose dataset indices share ⌊i / 2⌋ form one unit (positions 0..U−1 in the batch)."""

    name = "pair"
    description = "two consecutive training examples"

    def units_of(self, indices: torch.Tensor) -> torch.Tensor:
        _, unit = torch.unique(indices // 2, return_inverse=True)   # (B,) public
        return unit


def test_rows_grouped_into_units_are_clipped_as_one_contribution():
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(40, 5), torch.randint(0, 3, (40,)))
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    before = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    clip, lr = 0.05, 1.0    # a small C: most units are clipped
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # σ = 0 warns: not private (this checks the sums)
        model, opt, dl = dpfy.make_private(
            model, torch.optim.SGD(model.parameters(), lr=lr), DataLoader(ds, batch_size=20),
            noise_multiplier=0.0, max_grad_norm=clip, seed=3, route="vmap")
    opt.sampler.units = PairsOfRows()
    for x, y in dl:
        indices = dl.cursor.indices.clone()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        break
    assert opt.step_count == 1
    ref = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    ref.load_state_dict({n.replace("_module.", ""): t for n, t in before.items()})
    per_example = oracles.per_example_grads(ref, x, y, F.cross_entropy)  # {name: (B, ...)}
    unit = PairsOfRows().units_of(indices)
    units = int(unit.max()) + 1 if len(unit) else 0
    per_unit = {n: torch.zeros(units, *g.shape[1:], dtype=torch.float64).index_add_(0, unit, g)
                for n, g in per_example.items()}            # Σ_{i∈u} g_i, before clipping
    assert units < len(indices)                            # some units really hold two rows
    summed = oracles.clipped_sum(per_unit, clip)
    b = 20.0                                               # q·N = 20/40 · 40
    for n, p in model.named_parameters():
        expected = before[n] - lr * summed[n] / b
        assert torch.allclose(p.detach().double(), expected, atol=1e-6), n


def test_a_per_sample_transform_is_refused_when_units_group_rows():
    from dpfy.adaptive.base import Method
    from dpfy.errors import PrivacyRefusal  # noqa: F401 (the refusal is a ValueError)

    class Identity(Method):
        def transform(self, state, per_sample, plan):
            return per_sample

    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(40, 5), torch.randint(0, 3, (40,)))
    model = nn.Sequential(nn.Linear(5, 3))
    model, opt, dl = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(ds, batch_size=20),
        noise_multiplier=1.0, method=Identity(), seed=0)
    opt.sampler.units = PairsOfRows()
    x, y = next(iter(dl))
    F.cross_entropy(model(x), y).backward()
    try:
        opt.step()
    except ValueError as err:
        assert "unit of privacy" in str(err) and "pair" in str(err)
    else:
        raise AssertionError("a per-sample transform on grouped rows was not refused")
    assert opt.ledger.num_steps == 0
