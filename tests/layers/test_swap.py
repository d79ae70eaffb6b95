"""The swaps into ``dpfy.layers``' DP replacements, and the one list that ``dpfy.grads`` keeps of
them (grads sits below layers, so it names the swappable torch types itself)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfy.grads import GradEngine
from dpfy.grads.vmap import SWAPPABLE
from dpfy.layers import DP_REPLACEMENTS, DPGRU, dp_replacement, swap_layers


def test_the_vmap_hint_names_exactly_the_types_dpfy_layers_replaces():
    assert set(SWAPPABLE) == set(DP_REPLACEMENTS)


def test_dp_replacement_shares_the_parameters_and_leaves_other_types_alone():
    gru = nn.GRU(3, 4, batch_first=True)
    dp = dp_replacement(gru)
    assert type(dp) is DPGRU
    assert {id(p) for p in dp.parameters()} == {id(p) for p in gru.parameters()}
    assert dp_replacement(nn.Linear(3, 4)) is None
    assert dp_replacement(type("MyGRU", (nn.GRU,), {})(3, 4)) is None  # exact types only


def test_an_unswapped_gru_under_vmap_names_the_swap():
    """The vmap route's error for an nn.GRU (torch.func cannot batch its kernel) points at the
    DP replacement: the hint list reaches the message."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.g, self.head = nn.GRU(4, 3, batch_first=True), nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.g(x)[0][:, -1])

    model = Net()
    eng = GradEngine(model, loss_reduction="sum")
    try:
        nn.functional.cross_entropy(model(torch.randn(6, 5, 4)), torch.randint(0, 2, (6,))
                                    ).backward()
        with pytest.raises(ValueError, match=r"module 'g' \(GRU\).*dpfy\.layers\.swap_layers"):
            eng.per_sample_sq_norms()
    finally:
        eng.detach()
    assert swap_layers(Net()) == ["g"]
