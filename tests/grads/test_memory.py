"""Memory planning (dpfy.memory, issue 14 §5): the memory model of Monir et al. 2023's review,
§4.3, "auto" physical batches, the per-update flag and len(loader) when logical batches are
split."""

from __future__ import annotations

import argparse

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.cli.explain import register, run
from dpfy.memory import estimate_memory, largest_batch, paper_memory, probe_model


def test_paper_worked_example_201_and_102() -> None:
    # review §4.3 worked example (Yousefpour et al.): L = 1, C = 1, b = 100.
    assert paper_memory(100, 1, 1, per_sample=True) == 201
    assert paper_memory(100, 1, 1, per_sample=False) == 102
    one_param = [{"module": "w", "params": 1, "route": "per-sample"}]
    assert estimate_memory(one_param, 100, 1.0).elements == 201
    assert estimate_memory([dict(one_param[0], route="ghost")], 100, 1.0).elements == 102
    assert estimate_memory([dict(one_param[0], route="vmap")], 100, 1.0).elements == 201


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 50), nn.ReLU(), nn.Linear(50, 3))


def _by_hand(b: int) -> int:
    """The model for _mlp, derived by hand: C = 20 (input) + 50 (Linear) + 50 (ReLU) + 3
    (Linear) elements per example; both Linear layers take the ghost route on 2-D inputs
    (weights + one gradient each): M = 123 b + 2 (1050 + 153) elements, 4 bytes each."""
    return 4 * (123 * b + 2 * (1050 + 153))


def test_probe_counts_activations_and_routes() -> None:
    model = _mlp()
    x = torch.randn(4, 20)
    rows, c = probe_model(model, lambda m: m(x), 4)
    assert c == 123
    assert [r["route"] for r in rows] == ["ghost", "ghost"]
    assert estimate_memory(rows, 37, c).bytes == _by_hand(37)
    assert all(p.requires_grad for p in model.parameters())   # the probe detached


@pytest.mark.parametrize("b", [1, 37, 500])
def test_auto_picks_the_largest_batch_within_the_limit(b: int) -> None:
    data = TensorDataset(torch.randn(2000, 20), torch.randint(0, 3, (2000,)))
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    limit = _by_hand(b) + 3       # fits b, not b + 1 (one more example costs 492 bytes)
    _, _, loader = dpfy.make_private(model, opt, DataLoader(data, batch_size=1000),
                                     noise_multiplier=1.0, max_physical_batch_size="auto",
                                     memory_limit=limit)
    assert loader.max_physical_batch_size == b
    assert _by_hand(b) <= limit < _by_hand(b + 1)


def test_limit_below_one_example_is_refused() -> None:
    model = _mlp()
    with pytest.raises(ValueError, match="memory_limit"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          DataLoader(TensorDataset(torch.randn(100, 20)), batch_size=10),
                          noise_multiplier=1.0, max_physical_batch_size="auto",
                          memory_limit=100)


def test_largest_batch_inverts_the_estimate() -> None:
    rows = [{"module": "a", "params": 10, "route": "per-sample"},
            {"module": "b", "params": 7, "route": "ghost"}]
    # M(b) = 5b + 10(1 + b) + 14 = 15b + 24 elements; 4 bytes each: 4·(15·9 + 24) = 636.
    assert largest_batch(rows, 5.0, 636) == 9 and largest_batch(rows, 5.0, 635) == 8


def test_updated_flag_and_len_with_physical_batches() -> None:
    data = TensorDataset(torch.randn(200, 20), torch.randint(0, 3, (200,)))
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, DataLoader(data, batch_size=50),
                                           noise_multiplier=1.0, max_physical_batch_size=8,
                                           seed=0)
    assert len(loader) == 4                    # logical batches per pass: N / b = 200 / 50
    sched = torch.optim.lr_scheduler.StepLR(opt.original_optimizer, step_size=1, gamma=0.5)
    calls = updates = 0
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        calls += 1
        if opt.updated:
            updates += 1
            sched.step()
    assert updates == opt.step_count == len(loader) < calls   # ~50/8 physical per logical
    assert opt.original_optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 4)


def test_explain_memory_prints_estimate_and_measured_peak(capsys) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["explain", "mlp", "--input-shape", "784", "--batch-size", "64",
                              "--memory"])
    assert run(args) == 0
    out = capsys.readouterr().out
    assert "memory at batch size 64" in out and "| ghost |" in out
    assert "estimate:" in out and "measured peak of one private step:" in out
