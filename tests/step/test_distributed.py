"""Data-parallel private training (dpfy.step.distributed): 2 gloo processes on 127.0.0.1.

One spawn runs every scenario on both ranks (starting processes dominates the cost); the
parent then runs the single-process reference. Expected values are not taken from the code
under test: the reference is the ordinary one-process ``make_private`` run over the same global
Poisson batches (the same seed draws the same global mask, the shards of which the ranks keep)
with the same noise stream, and ε is read from both ledgers by the same accountant.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import dpfy
from dpfy.errors import PrivacyRefusal
from spawned_ranks import spawn_ranks

N, PER_RANK, WORLD, STEPS, SIGMA, SEED = 64, 8, 2, 3, 0.7, 11


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(N, 5, generator=g), torch.randint(0, 3, (N,), generator=g))


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def _train(model: nn.Module, loader: DataLoader, **kw: Any) -> tuple[dict, Any, list]:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt, dl = dpfy.make_private(model, opt, loader, noise_multiplier=SIGMA,
                                       max_grad_norm=0.3, seed=SEED, **kw)
    seen: list[list[int]] = []
    it = iter(dl)
    for _ in range(STEPS):
        x, y = next(it)
        seen.append(dl.cursor.indices.tolist())
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    inner = model.module if isinstance(model, DDP) else model
    return ({k: v.clone() for k, v in inner.state_dict().items()},
            opt.ledger.to_dict(), seen)


def _expect(err: type, fn: Any) -> str:
    try:
        fn()
    except err as e:
        return str(e)
    return "no error"


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    data, res = _data(), {}
    # 1. wrapped in DDP before make_private, with the user's DistributedSampler (handled).
    res["ddp"] = _train(DDP(_model()), DataLoader(data, batch_size=PER_RANK,
                                                  sampler=DistributedSampler(data)))
    # 2. not wrapped, process group initialized.
    res["plain"] = _train(_model(), DataLoader(data, batch_size=PER_RANK, shuffle=True))
    # 3. wrong setups.
    m = _model()
    dpfy.make_private(m, torch.optim.SGD(m.parameters(), lr=0.1),
                      DataLoader(data, batch_size=PER_RANK), noise_multiplier=1.0)
    res["wrap_after"] = _expect(RuntimeError, lambda: DDP(m))
    m = _model()
    res["wrong_shard"] = _expect(PrivacyRefusal, lambda: dpfy.make_private(
        m, torch.optim.SGD(m.parameters(), lr=0.1),
        DataLoader(data, batch_size=PER_RANK,
                   sampler=DistributedSampler(data, num_replicas=3, rank=rank)),
        noise_multiplier=1.0))
    m = _model()
    res["sigma_differs"] = _expect(PrivacyRefusal, lambda: dpfy.make_private(
        m, torch.optim.SGD(m.parameters(), lr=0.1), DataLoader(data, batch_size=PER_RANK),
        noise_multiplier=1.0 + rank))
    torch.save(res, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return spawn_ranks(_worker, WORLD, tmp_path_factory.mktemp("ddp"))


@pytest.fixture(scope="module")
def single() -> tuple[dict, Any, list]:
    """The one-process run over the global batch: batch size PER_RANK·WORLD, same seed."""
    return _train(_model(), DataLoader(_data(), batch_size=PER_RANK * WORLD, shuffle=True))


@pytest.mark.parametrize("case", ["ddp", "plain"])
def test_updates_equal_single_process_run(ranks: list[dict], single: tuple, case: str) -> None:
    ref_state, ref_ledger, ref_seen = single
    states = [r[case][0] for r in ranks]
    for k, v in ref_state.items():
        assert torch.equal(states[0][k], states[1][k]), k      # replicas bit-identical
        torch.testing.assert_close(states[0][k], v, rtol=1e-5, atol=1e-6)
    # each rank's part is its shard i ≡ r (mod 2) of the single run's global batch
    for t in range(STEPS):
        union = sorted(ranks[0][case][2][t] + ranks[1][case][2][t])
        assert union == ref_seen[t]
        assert all(i % WORLD == r for r in range(WORLD) for i in ranks[r][case][2][t])


@pytest.mark.parametrize("case", ["ddp", "plain"])
def test_ledger_and_epsilon_equal_single_process(ranks: list[dict], single: tuple,
                                                 case: str) -> None:
    from dpfy.privacy import Ledger, epsilon
    ref = single[1]
    assert ranks[0][case][1] == ranks[1][case][1] == ref
    eps = [epsilon(Ledger.from_dict(d), delta=1e-5, accountant="rdp")
           for d in (ranks[0][case][1], ref)]
    assert eps[0] == eps[1] > 0


def test_wrong_setups_get_clear_errors(ranks: list[dict]) -> None:
    for r in ranks:
        assert "requires a gradient" in r["wrap_after"]       # torch's DDP constructor
        assert "DistributedSampler" in r["wrong_shard"] and "num_replicas" in r["wrong_shard"]
        assert "noise_multiplier" in r["sigma_differs"] and "every rank" in r["sigma_differs"]


def test_distributed_sampler_without_group_is_refused() -> None:
    data = _data()
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=2,
                                                                      rank=0))
    m = _model()
    with pytest.raises(PrivacyRefusal, match="init_process_group"):
        dpfy.make_private(m, torch.optim.SGD(m.parameters(), lr=0.1), loader,
                          noise_multiplier=1.0)
