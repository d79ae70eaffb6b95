"""Per-device clipping across pipeline stages (dpfy.step.pipeline): 2 gloo stages on 127.0.0.1.

One spawn runs every two-stage scenario (starting processes dominates the cost); the parent then
computes the references. Expected values do not come from the code under test:

- the clipped sums from a float64 loop over the examples (one autograd backward per example,
  each stage's block clipped to its C_s by hand) and from the single-process group clipping
  already in dpfy (``GradEngine`` on the whole model + ``PerLayerClipping`` with one group per
  stage);
- the ledger from its derivation (one Poisson-subsampled Gaussian at σ, q = the sampler's, per
  step) and ε from dp_accounting's RDP accountant on that event.
"""

from __future__ import annotations

import datetime
import math
import os
from pathlib import Path
from typing import Any

import dp_accounting
import pytest
import torch
import torch.distributed as dist
from torch import nn

from dpfy.clipping import PerLayerClipping
from dpfy.errors import PrivacyRefusal
from dpfy.grads.engine import GradEngine
from dpfy.privacy import Ledger, Release, Sampling, epsilon
from dpfy.sampling import PoissonSampler
from dpfy.step.pipeline import StageClipping, StagePartition, stage_seed
from spawned_ranks import spawn_ranks

N, Q, STEPS, SIGMA, SEED, WORLD = 32, 0.25, 3, 0.8, 11, 2
CLIPS = (0.3, 0.5)  # C_0, C_1: small enough that most examples are clipped in both stages
STAGES = [["0", "1"], ["2", "3", "4"]]


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 5, generator=g), torch.randint(0, 3, (N,), generator=g)


def _model() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 3))


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y)  # the mean over the batch


def _run(rank: int, sigma: float, seed: int | None = None) -> tuple[list, list, dict]:
    """STEPS steps without updates (lr = 0): each step's p.grad, batch and the ledger."""
    x, y = _data()
    m = _model()
    stage = m[:2] if rank == 0 else m[2:]  # slicing keeps the whole model's names
    clip = StageClipping(
        stage,
        partition=StagePartition.of(m, STAGES),
        clips=CLIPS,
        noise_multiplier=sigma,
        seed=seed,
        sampler=PoissonSampler(N, sample_rate=Q, seed=SEED),
        input_shape=(5,) if rank == 0 else None,
    )
    grads, batches = [], []
    for _ in range(STEPS):
        idx = clip.draw()
        if len(idx):
            sched = clip.schedule(len(idx), _loss)
            sched.step(x[idx]) if rank == 0 else sched.step(target=y[idx], losses=[])
        clip.release()
        grads.append({n: p.grad.clone() for n, p in stage.named_parameters()})
        batches.append(idx.tolist())
    return grads, batches, clip.ledger.to_dict()


def _expect(fn: Any) -> str:
    try:
        fn()
    except PrivacyRefusal as e:
        return str(e)
    return "no error"


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # a hang guard: a collective or pipeline send that waits longer than this raises
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60)
    )
    res = {"clean": _run(rank, 0.0), "noisy": _run(rank, SIGMA, seed=5)}
    m = _model()
    part = StagePartition.of(m, STAGES)
    stage = m[:2] if rank == 0 else m[2:]
    res["sampler_differs"] = _expect(
        lambda: StageClipping(
            stage,
            partition=part,
            clips=CLIPS,
            noise_multiplier=1.0,
            input_shape=(5,),
            sampler=PoissonSampler(N, sample_rate=Q, seed=SEED + rank),
        ).draw()
    )
    res["clips_differ"] = _expect(
        lambda: StageClipping(
            stage,
            partition=part,
            clips=(CLIPS[0] * (1 + rank), CLIPS[1]),
            noise_multiplier=1.0,
            input_shape=(5,),
            sampler=PoissonSampler(N, sample_rate=Q, seed=SEED),
        )
    )
    torch.save(res, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return spawn_ranks(_worker, WORLD, tmp_path_factory.mktemp("pipe"))


def _stage_of(name: str) -> int:
    return 0 if name.startswith(("0.", "1.")) else 1


def _oracle(idx: list[int], clips: tuple[float, ...] = CLIPS) -> dict[str, torch.Tensor]:
    """float64: Σ_i min(1, C_s/‖g_i^(s)‖) g_i^(s) per stage block, divided by b = qN."""
    x, y = _data()
    m = _model().double()
    total = {n: torch.zeros_like(p) for n, p in m.named_parameters()}
    for i in idx:
        m.zero_grad()
        nn.functional.cross_entropy(m(x[i : i + 1].double()), y[i : i + 1]).backward()
        for s in range(WORLD):
            block = {n: p.grad for n, p in m.named_parameters() if _stage_of(n) == s}
            norm = math.sqrt(sum(float(g.square().sum()) for g in block.values()))
            for n, g in block.items():
                total[n] += min(1.0, clips[s] / norm) * g
    return {n: t / (Q * N) for n, t in total.items()}


def _single_process_group_clipping(idx: list[int]) -> dict[str, torch.Tensor]:
    """dpfy's one-process group clipping with one group per stage, divided by b = qN."""
    x, y = _data()
    m = _model()
    eng = GradEngine(m, loss_reduction="mean")
    nn.functional.cross_entropy(m(x[idx]), y[idx]).backward()
    policy = PerLayerClipping(StagePartition.of(m, STAGES).names, CLIPS)
    sums = eng.weighted_sums(policy.weights(eng.per_sample_sq_norms(), policy.default_clip()))
    return {n: t / (Q * N) for n, t in sums.items()}


def test_clipped_sums_equal_single_process_group_clipping(ranks: list[dict]) -> None:
    b0, b1 = ranks[0]["clean"][1], ranks[1]["clean"][1]
    assert b0 == b1 and len({len(b) for b in b0}) > 1  # batch sizes vary: the schedule cache
    for t, idx in enumerate(b0):
        got = {**ranks[0]["clean"][0][t], **ranks[1]["clean"][0][t]}
        oracle, single = _oracle(idx), _single_process_group_clipping(idx)
        assert set(got) == set(oracle)
        unclipped = _oracle(idx, clips=(math.inf, math.inf))
        # the thresholds bind: clipping changes the sums by more than 10%
        assert any(not torch.allclose(oracle[n], unclipped[n], rtol=0.1) for n in oracle)
        for n, g in got.items():
            # float32 forward/backward of a 3-layer model on ≤ 16 rows, values O(1): relative
            # error a few float32 ulps (1.2e-7) per operation, far below 1e-5
            torch.testing.assert_close(g.double(), oracle[n], rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(g, single[n], rtol=1e-5, atol=1e-7)


def test_ledger_is_one_gaussian_per_step_at_group_sensitivity(ranks: list[dict]) -> None:
    ledgers = [r["noisy"][2] for r in ranks]
    assert ledgers[0] == ledgers[1]  # every stage records the same ledger
    expected = Ledger(dataset_size=N)
    for _ in range(STEPS):  # derivation: Poisson(q) subsampled Gaussian at σ, per step
        expected.record_step(
            sampling=Sampling.POISSON, sample_rate=Q, releases=(Release("gradient", SIGMA),)
        )
    assert ledgers[0] == expected.to_dict()
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA)), STEPS)
    eps = epsilon(Ledger.from_dict(ledgers[0]), delta=1e-5, accountant="rdp")
    # dpfy's RDP orders may differ from dp_accounting's default ones: the two ε agree to the
    # order grid's resolution, a few percent at most here
    assert eps == pytest.approx(acc.get_epsilon(1e-5), rel=0.05)


def test_noise_is_sigma_times_group_sensitivity_on_each_stage(ranks: list[dict]) -> None:
    # same batches (same sampler seed) as the clean run: the difference is the noise / b
    std = SIGMA * math.sqrt(CLIPS[0] ** 2 + CLIPS[1] ** 2) / (Q * N)  # σΔ/b, Δ = √(ΣC_s²)
    for r in range(WORLD):
        diffs = torch.cat(
            [
                (ranks[r]["noisy"][0][t][n] - ranks[r]["clean"][0][t][n]).flatten()
                for t in range(STEPS)
                for n in ranks[r]["clean"][0][t]
            ]
        )
        # 3 steps × (42 or 69) coordinates: the sample std of k ≥ 126 normals has relative
        # standard error 1/√(2k) ≤ 0.063, so ±25% is 4 standard errors (χ² with k dof)
        assert float(diffs.std()) == pytest.approx(std, rel=0.25)
    assert stage_seed(5, 0) != stage_seed(5, 1)  # independent streams per stage


def test_stages_disagreeing_are_refused(ranks: list[dict]) -> None:
    for r in ranks:
        assert "same batch on every pipeline stage" in r["sampler_differs"]
        assert "seed" in r["sampler_differs"]
        assert "clips" in r["clips_differ"] and "every stage" in r["clips_differ"]


def test_parameter_in_no_stage_or_two_stages_is_refused() -> None:
    m = _model()
    with pytest.raises(PrivacyRefusal, match=r"no stage = \['4.bias', '4.weight'\]"):
        StagePartition.of(m, [["0"], ["2"]])
    with pytest.raises(PrivacyRefusal, match=r"two stages = \['2.bias \(stages \[0, 1\]\)"):
        StagePartition.of(m, [["0", "2"], ["2", "4"]])
    share = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    share[1].weight = share[0].weight  # a weight tied across the two stages
    with pytest.raises(PrivacyRefusal, match="two stages"):
        StagePartition.of(share, [["0"], ["1"]])


def test_missing_thresholds_are_refused() -> None:
    m = _model()
    part = StagePartition.of(m, STAGES)
    sampler = PoissonSampler(N, sample_rate=Q, seed=SEED)
    for clips in (None, (0.3,)):
        with pytest.raises(ValueError, match="clips must be one threshold C_s per stage"):
            StageClipping(m[:2], partition=part, clips=clips, noise_multiplier=1.0, sampler=sampler)


def test_engine_takes_a_stage_input_that_requires_grad() -> None:
    # A later stage's input is a leaf that requires grad (the received activations). The
    # perturbation probe used to differentiate the original input only, so on its perturbed
    # copy no layer's gradient arrived and every layer was refused as mixing rows.
    torch.manual_seed(3)
    stage = nn.Sequential(nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 3))
    h, y = torch.randn(8, 7), torch.randint(0, 3, (8,))
    want = []
    for i in range(8):  # float64 oracle: one backward per example
        ref = nn.Sequential(nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 3)).double()
        ref.load_state_dict(stage.state_dict())
        nn.functional.cross_entropy(ref(h[i : i + 1].double()), y[i : i + 1]).backward()
        want.append(sum(float(p.grad.square().sum()) for p in ref.parameters()))
    eng = GradEngine(stage, loss_reduction="sum")
    eng.bind_batch(8)
    nn.functional.cross_entropy(
        stage(h.clone().requires_grad_(True)), y, reduction="sum"
    ).backward()
    got = sum(eng.per_sample_sq_norms().values())
    # float32 vs float64 on O(1) values: a few float32 ulps
    torch.testing.assert_close(
        got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-7
    )
