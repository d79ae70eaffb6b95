"""The pre-flight (issue 14 §2): ``dpfy.validate(model, example_batch)`` and ``dpfy explain`` run
one private forward/backward on a tiny batch and list every problem at once, each naming the
module and the fix, before training starts. (`dpfy explain` printing it:
tests/cli/test_explain_cli.py.)"""

from __future__ import annotations

import importlib

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import dpfy
from dpfy.layers import DPGRU

validate_module = importlib.import_module("dpfy.validation")  # the module behind dpfy.validate


class Dropping(nn.Module):
    """A module without a rule (a vmap layer) with active dropout inside."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x * self.w)


class Many(nn.Module):
    """Three problems in one model, and a layer used time-first that is not one."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = Dropping()
        self.step = nn.Linear(4, 4)                       # time-first, T = 1: resolved
        self.rnn = nn.RNN(4, 4, batch_first=True)          # fed a PackedSequence
        self.bag = nn.EmbeddingBag(10, 4, mode="max")      # max mode
        self.head = nn.Linear(12, 2)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        a = self.gated(x)
        b = self.step(x[:, None].transpose(0, 1))[0]
        lengths = torch.ones(x.shape[0], dtype=torch.long)
        _, h = self.rnn(pack_padded_sequence(x[:, None], lengths, batch_first=True))
        return self.head(torch.cat([a + b, h[0], self.bag(ids)], 1))


def test_every_problem_is_listed_at_once_naming_its_module():
    x, ids = torch.randn(3, 4), torch.randint(0, 10, (3, 2))
    bag_only = validate_module.preflight_problems(nn.Sequential(nn.EmbeddingBag(10, 4,
                                                                                mode="max")),
                                                  (ids,))
    assert len(bag_only) == 1 and "mode 'sum' or 'mean'" in bag_only[0]
    model = Many()
    model.bag.mode = "sum"  # the forward itself would stop at max mode: checked above
    problems = dpfy.validate(model, (x, ids))
    text = "\n".join(problems)
    assert len(problems) == 2, text
    assert "layer 'gated' (Dropping)" in text and "'gated.drop' (Dropout)" in text
    assert "'step'" not in text  # (1, B, 4): the layout probe finds its batch in dim 1
    # the RNN (fed a PackedSequence) is flagged without running: torch.func cannot batch it
    assert "layer 'rnn' (RNN)" in text and "dpfy.layers.DPRNN" in text
    assert all(p.requires_grad for p in model.parameters())  # the model is left as it was


def test_supported_shapes_pass_the_preflight():
    class Lm(nn.Module):  # keyword call, shared position ids, tied weights, a 0-dim scale
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(11, 4), nn.Embedding(5, 4)
            self.head = nn.Linear(4, 11, bias=False)
            self.head.weight = self.wte.weight
            self.temperature = nn.Parameter(torch.tensor(1.0))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(input_ids.shape[1])[None]
            h = (self.wte(input_ids) + self.wpe(pos)) * attention_mask[..., None]
            return self.head(h) * self.temperature

    batch = {"input_ids": torch.randint(0, 11, (3, 5)), "attention_mask": torch.ones(3, 5)}
    assert dpfy.validate(Lm(), batch) == []
    assert dpfy.validate(Lm(), batch, route="vmap") == []


def test_a_loss_that_reaches_no_parameter_is_a_problem():
    problems = dpfy.validate(nn.Linear(3, 2), torch.randn(2, 3), loss_fn=lambda out: out.detach()
                             .sum().requires_grad_(), loss_reduction="sum")
    assert len(problems) == 1 and "reach a trainable parameter" in problems[0]


def test_fix_swaps_in_the_dp_layers_before_the_norm_fixes():
    """fix=True replaces what dpfy.layers rebuilds from Linears (the root module too) and then
    the BatchNorms, in a copy: the original is untouched."""
    gru = nn.GRU(3, 3, batch_first=True)
    assert type(dpfy.validate(gru, fix=True)) is DPGRU and type(gru) is nn.GRU
    model = nn.Sequential(nn.BatchNorm1d(4), nn.GRU(4, 4))
    fixed = dpfy.validate(model, fix=True)
    assert type(fixed[0]) is nn.GroupNorm and type(fixed[1]) is DPGRU
    assert type(model[0]) is nn.BatchNorm1d and type(model[1]) is nn.GRU
