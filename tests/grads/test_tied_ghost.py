"""Tied weights' per-example norms from their uses' factors (``dpfy/grads/tied.py``), never
forming the B × V × d per-example gradient; values from the float64 per-example loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import oracles
from dpfy.grads import GradEngine

V, D, T, B = 11, 6, 5, 7


def sum_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="sum")


class TiedLm(nn.Module):
    """Embedding and head share one (V, D) weight (GPT-2), with a padding id."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wte = nn.Embedding(V, D, padding_idx=0)
        self.mix = nn.Linear(D, D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.wte(ids))))


class TiedLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(D, D), nn.Linear(D, D, bias=False)
        self.b.weight = self.a.weight
        self.out = nn.Linear(D, V)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.b(torch.tanh(self.a(x))))


class TiedEmbeddings(nn.Module):
    """One table for two id streams (an encoder–decoder's shared embedding)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.src, self.tgt = nn.Embedding(V, D), nn.Embedding(V, D)
        self.tgt.weight = self.src.weight
        self.out = nn.Linear(D, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.src(ids) + self.tgt(ids.flip(1))))


def ids() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 4, (B, T), generator=g)  # few ids: repeats, and the padding id 0
    return x, torch.randint(0, V, (B, T), generator=g)


@pytest.mark.parametrize("make, data", [
    (TiedLm, ids), (TiedEmbeddings, ids),
    (TiedLinears, lambda: (torch.randn(B, T, D, generator=torch.Generator().manual_seed(2)),
                           torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))))])
def test_tied_norm_from_factors_matches_the_loop(make, data, monkeypatch):
    model, (x, y) = make(), data()
    ref = oracles.per_example_grads(model, x, y, sum_loss)
    eng = GradEngine(model, loss_reduction="sum")
    monkeypatch.setattr(eng._routes, "tied_grad_sample", lambda *a: pytest.fail("formed G_i"))
    try:
        sum_loss(model(x), y).backward()
        sq = eng.per_sample_sq_norms()
    finally:
        eng.detach()
    assert set(sq) == set(ref)
    for n, g in ref.items():
        torch.testing.assert_close(sq[n].double(), g.flatten(1).square().sum(1),
                                   rtol=1e-5, atol=1e-8)
