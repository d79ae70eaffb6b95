"""The unit-of-privacy seam (issue 24 §2): norms of a *group of rows*' summed gradient.

``GradEngine.per_unit_sq_norms(unit_of_row)`` gives, per parameter and privacy unit u,
‖Σ_{i∈u} ∂ℓ_i/∂θ‖². The expected numbers come from the float64 per-example loop
(``oracles.per_example_grads``): each unit's per-example gradients summed *before* the norm.
Weighted sums need no new path: Σ_u w_u Σ_{i∈u} g_i = Σ_i w_{u(i)} g_i, checked through
``weighted_sums`` with the row weights w_{u(i)}. ``unit_of_row=None`` (rows are the units) is
exactly ``per_sample_sq_norms``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import oracles
from dpfy.grads import GradEngine

# 9 rows in 4 units of unequal sizes (2, 2, 4, 1), interleaved: unit u holds rows {i: UNIT[i] = u}
UNIT = torch.tensor([2, 0, 1, 2, 0, 3, 2, 1, 2])
B, U = UNIT.numel(), 4


class Tied(nn.Module):
    """A token embedding tied to the output layer (GPT-2's tie): one parameter, two uses."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(7, 4)
        self.block = nn.Linear(4, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.block(self.wte(ids)))).mean(1)  # (B, 7)


def _cases() -> dict[str, tuple[nn.Module, torch.Tensor, int]]:
    """name: (model, input (B, ...), classes); every layer type takes a different route."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    return {
        # Linear on (B, d): ghost norm; Conv2d: per-sample (eager in the backward hook)
        "cnn": (nn.Sequential(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 4 * 4, 3)),
                torch.randn(B, 1, 6, 6, generator=g), 3),
        # Embedding (ghost), LayerNorm (per-sample), Linear on a sequence
        "seq": (nn.Sequential(nn.Embedding(7, 4), nn.LayerNorm(4), nn.Linear(4, 4), nn.Flatten(),
                              nn.Linear(12, 3)), torch.randint(0, 7, (B, 3), generator=g), 3),
        # PReLU has no rule: a vmap layer under route="auto"
        "vmap": (nn.Sequential(nn.Linear(5, 4), nn.PReLU(), nn.Linear(4, 3)),
                 torch.randn(B, 5, generator=g), 3),
        "tied": (Tied(), torch.randint(0, 7, (B, 3), generator=g), 7),
    }


ROUTES = [("cnn", "auto"), ("cnn", "ghost"), ("cnn", "vmap"), ("seq", "auto"), ("seq", "vmap"),
          ("vmap", "auto"), ("tied", "auto"), ("tied", "ghost")]


def unit_sums(grads: dict[str, torch.Tensor], unit: torch.Tensor, num_units: int
              ) -> dict[str, torch.Tensor]:
    """Σ_{i∈u} g_i per unit, (U, *θ), from per-example gradients (B, *θ), in a loop."""
    out = {}
    for n, g in grads.items():
        out[n] = torch.stack([g[unit == u].sum(0) for u in range(num_units)])
    return out


@pytest.mark.parametrize("name, route", ROUTES)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_unit_norms_and_sums_match_the_loop_that_sums_each_units_gradients(name, route,
                                                                           reduction):
    model, x, classes = _cases()[name]
    model = model.double()
    x = x.double() if x.is_floating_point() else x
    y = torch.arange(B) % classes
    ref = oracles.per_example_grads(model, x, y, F.cross_entropy)  # (B, *θ) float64
    per_unit = unit_sums(ref, UNIT, U + 1)  # unit U has no rows: its sum is 0
    w_unit = torch.linspace(0.2, 1.0, U + 1, dtype=torch.float64)  # (U + 1,) arbitrary weights
    eng = GradEngine(model, route=route, loss_reduction=reduction)
    try:
        F.cross_entropy(model(x), y, reduction=reduction).backward()
        sq = eng.per_unit_sq_norms(UNIT, num_units=U + 1)  # {name: (U + 1,)}
        sums = eng.weighted_sums({n: w_unit[UNIT] for n in sq})  # row weights w_{u(i)}
    finally:
        eng.detach()
    assert set(sq) == set(ref)
    for n, s in per_unit.items():
        want = s.reshape(U + 1, -1).square().sum(1)  # ‖Σ_{i∈u} g_i‖²
        torch.testing.assert_close(sq[n], want, rtol=1e-9, atol=1e-12)
        assert sq[n][U] == 0
        want_sum = torch.einsum("u,u...->...", w_unit, s)  # Σ_u w_u Σ_{i∈u} g_i
        torch.testing.assert_close(sums[n], want_sum, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["cnn", "seq", "tied"])
def test_none_is_exactly_todays_per_row_norms_and_singleton_units_agree(name):
    model, x, classes = _cases()[name]
    y = torch.arange(B) % classes
    eng = GradEngine(model)
    try:
        F.cross_entropy(model(x), y).backward()
        rows = eng.per_sample_sq_norms()
        none = eng.per_unit_sq_norms(None)
        singletons = eng.per_unit_sq_norms(torch.arange(B))
    finally:
        eng.detach()
    assert set(rows) == set(none) == set(singletons)
    for n in rows:
        assert torch.equal(none[n], rows[n])  # the same routes: bit for bit
        torch.testing.assert_close(singletons[n], rows[n], rtol=1e-4, atol=1e-7)  # float32


def test_an_empty_batch_gives_zero_norms_for_every_unit():
    """An empty Poisson batch (no forward at all): every unit's norm is 0."""
    model = nn.Linear(3, 2)
    eng = GradEngine(model)
    eng.bind_batch(0)
    sq = eng.per_unit_sq_norms(torch.zeros(0, dtype=torch.long), num_units=3)
    eng.detach()
    assert {n: t.tolist() for n, t in sq.items()} == {"weight": [0.0] * 3, "bias": [0.0] * 3}


@pytest.mark.parametrize("unit_of_row, num_units, match", [
    (torch.zeros(B - 1, dtype=torch.long), None,
     r"unit_of_row must be an integer tensor of shape \(9,\)"),
    (torch.zeros(B), None, r"unit_of_row must be an integer tensor"),
    (torch.zeros(B, 1, dtype=torch.long), None, r"unit_of_row must be an integer tensor"),
    (UNIT - 1, None, r"unit_of_row must be in \[0, num_units"),
    (UNIT, 3, r"unit_of_row must be in \[0, num_units = 3\)"),
])
def test_a_row_map_that_is_not_one_unit_per_row_is_refused(unit_of_row, num_units, match):
    model, x, _ = _cases()["cnn"]
    eng = GradEngine(model)
    try:
        model(x).sum().backward()
        with pytest.raises(ValueError, match=match):
            eng.per_unit_sq_norms(unit_of_row, num_units=num_units)
    finally:
        eng.detach()


class _Wide(nn.Module):
    """Embedding → Linear on a sequence → Linear: all position-additive, all ghost-preferred
    at these sizes (T² = 4 and (m·T)² ≤ 64 below d_in·d_out = 16·16)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 16)
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.emb(ids))).mean(1))


@pytest.mark.parametrize("unit", [UNIT, torch.tensor([0, 0, 0, 0, 0, 0, 0, 1, 2])],
                         ids=["packed", "heavy-unit-falls-back"])
def test_position_additive_layers_give_unit_norms_from_packed_ghost_norms(unit, monkeypatch):
    """A unit's rows packed as one sequence: the Linear and Embedding rules' ghost norms give
    ‖Σ_{i∈u} g_i‖² without any per-sample gradient (their grad_sample is made to fail), and a
    batch with one heavy unit (packing would triple the rows) falls back to per-sample
    gradients summed per unit — both equal to the float64 loop."""
    from dpfy.grads.rules.embedding import EmbeddingRule
    from dpfy.grads.rules.linear import LinearRule

    torch.manual_seed(1)
    model = _Wide().double()
    x = torch.randint(0, 11, (B, 2), generator=torch.Generator().manual_seed(2))
    y = torch.arange(B) % 3
    u = int(unit.max()) + 1
    ref = unit_sums(oracles.per_example_grads(model, x, y, F.cross_entropy), unit, u)
    packed = unit is UNIT
    if packed:
        def no_grad_sample(self, layer, a, g):
            raise AssertionError("a per-sample gradient was formed")
        monkeypatch.setattr(LinearRule, "grad_sample", no_grad_sample)
        monkeypatch.setattr(EmbeddingRule, "grad_sample", no_grad_sample)
    eng = GradEngine(model, route="ghost")
    try:
        F.cross_entropy(model(x), y).backward()
        sq = eng.per_unit_sq_norms(unit, num_units=u)
    finally:
        eng.detach()
    for n, s in ref.items():
        torch.testing.assert_close(sq[n], s.reshape(u, -1).square().sum(1), rtol=1e-9,
                                   atol=1e-12)  # the engine's rows are ℓ_i's gradients


def test_unit_packing_places_each_units_rows_in_order_and_pads_with_zeros():
    from dpfy.grads.packing import UnitPacking

    unit = torch.tensor([1, 0, 1, 2, 1])
    p = UnitPacking.of(unit, num_units=4)  # unit 3 has no rows
    assert (p.m, p.padded_rows()) == (3, 12)
    x = torch.arange(1, 6, dtype=torch.float64)[:, None, None].expand(5, 2, 1)  # (B, T=2, 1)
    packed = p.pack(x, tail=1)[..., 0]  # (U, m·T)
    assert packed.tolist() == [[2, 2, 0, 0, 0, 0], [1, 1, 3, 3, 5, 5], [4, 4, 0, 0, 0, 0],
                               [0] * 6]
