"""Behaviour kept across the trunk re-cut: four seeded runs compared with a stored reference.

The re-cut moves ``make_private``, the private optimizer, the step and the method interface into
new files without changing what they compute. This file runs four small seeded scenarios through
the public API and compares each with ``recut_reference.json``, which the SAME scenario code wrote
when run against the commit before the re-cut (its ``"source"`` field names the commit and the
command):

a. the default DP-SGD recipe of ``dpfy train`` (tanh CNN, Fashion-MNIST, SGD lr 4 momentum 0.9,
   clip 0.1, Poisson sampling, PLD calibration to a target ε at δ = 1e-5) on the first 1000
   training images (ε = 1 over 16 steps, to keep the PLD calibration to ~2 s);
b. chained noise decay + quantile clipping (``method=[...]``) on scikit-learn's digits, RDP;
c. individualized budgets, ``individual="sample"`` and ``"scale"`` (RDP), on random data;
d. data-parallel training, 2 gloo processes on 127.0.0.1 (rank 0's ledger and parameters).

Checks per run: the ledger is identical (``optimizer.ledger.to_dict()`` JSON-equal), ε(δ = 1e-5)
(and each group's ε for c) agrees within a tolerance derived from the accountant's float64
arithmetic (:func:`epsilon_tolerance`), and the final parameters agree within the float32
tolerance derived at ``RTOL`` (``torch.allclose(rtol=RTOL, atol=ATOL)``: on every value for small
tensors; for large ones on 16 sampled entries and on float64 sums, absolute sums, sums of squares
and a fixed ± projection, with the tolerance that elementwise allclose implies for each). The
sha256 of the parameters' bytes is recorded and reported (bit-identical or not) but not asserted:
BLAS, vector width and thread counts differ between machines. No float is compared to the last
bit across machines (issue 35 §1: on an AVX-512 CPU ε differed from this AVX2-written reference
in the 12th digit); ``test_the_comparison_catches_changes_beyond_its_tolerance`` shows that a
changed σ, step count or seed still fails it.

Scenario a calibrates σ, whose search changed after the re-cut (issue 31 §4, a faster PLD search
that returns another σ of the same 1e-3 tolerance band): its calibrated σ and ε are compared
within a stated tolerance, then the run is repeated with the reference's σ given and compared
as above (``CALIBRATED_RTOL``).

The seeds below are fixed, public test seeds; a run with a seed is reproducible by design.

Regenerate the reference (only with the code BEFORE a behaviour-kept change, never after it):

    PYTHONPATH=/tmp/dpfy_base/src .venv/bin/python \\
        tests/integration/test_recut_equivalence.py --write-reference OUT.json
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy

REFERENCE = Path(__file__).with_name("recut_reference.json")
DELTA = 1e-5
# Parameters: float32, compared across machines. What differs between two CPUs is the order and
# width of float32 reductions (AVX2 sums 8 lanes, AVX-512 16: the matmuls, convolutions and the
# clipped sum), and the C sampler's float32 normals (gaussian.c is built with -ffast-math and
# -march for the CPU's level: libmvec's AVX2 and AVX-512 logf/cosf/sinf variants, each within
# 4 ulp, and the reciprocal-square-root estimate refined by one Newton step, within 2 ulp; the
# raw random words never differ). First order, a step's update then differs per coordinate by
# at most k·u·|update| with u = 2⁻²⁴ and k ≈ 8 (the noise's 4 + 2 ulp, the reduction orders, the
# final add), and the momentum buffer carries each step's difference into later steps with total
# weight at most 1/(1 − β) = 10 (β = 0.9). The update is noise-dominated: lr·σ·C/B·|z|, at most
# 4 · 2.35 · 0.1/128 · 4 ≈ 0.03 per coordinate in scenario a (|z| ≤ 4 covers all but 1 in 15,000
# of its draws), and at most 0.5 · 0.8 · 0.3/16 · 4 = 0.03 in d. Over T = 16 steps (a) the
# difference is at most T · 10 · 8 · 2⁻²⁴ · 0.03 ≈ 2.3e-6 if every step's rounding pushed the same
# way, and ≈ √T · 10 · 8 · 2⁻²⁴ · 0.03 ≈ 5.7e-7 for independent roundings (b and c, 20-30 steps of
# smaller updates, are below these). ATOL = 1e-6 sits between the two, and RTOL = 1e-5 (≈ 170 ulp
# of the value) adds room for entries far from zero; a gradient's dependence on the parameters
# feeds differences back, which this first-order count leaves out. Measured on an AVX-512 CPU
# against this AVX2-written reference: at most 1.8e-7 (b), 1.2e-7 (a), 6e-8 (c). A changed seed
# moves the parameters by far more (``test_the_comparison_catches_changes_beyond_its_tolerance``).
RTOL, ATOL = 1e-5, 1e-6
FULL_VALUES_UP_TO = 512  # tensors with at most this many entries are stored whole
SAMPLES = 16  # entries sampled from each larger tensor
FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


# --------------------------------------------------------------------------------------------
# Names that the re-cut may rename. If a scenario fails to BUILD after the re-cut, update only
# this function (keep the methods and their options the same); recut_reference.json stays as is.
# --------------------------------------------------------------------------------------------
def build_decay_and_quantile() -> list:
    """Scenario b's method chain: per-epoch exponential noise decay, then quantile clipping
    (Andrew et al.; C_0 = 0.5, γ = 0.5, η = 0.2). Built by registry name with
    ``dpfy.adaptive.make``; ``make_private`` calibrates the chain to the target ε.
    MAY NEED UPDATING AFTER THE RE-CUT."""
    from dpfy.adaptive import make

    return [
        make("noise_decay", kind="exponential", rate=0.5, per="epoch"),
        make("quantile", initial_clip=0.5, target_quantile=0.5, step_size=0.2),
    ]


# ---------------------------------------------------------------------------- fingerprints
def _projection_weights(n: int) -> torch.Tensor:
    """A fixed ±1 pattern (no RNG): (-1)^⌊i·φ⌋, so a change anywhere moves the projection."""
    i = torch.arange(n, dtype=torch.float64)
    return 1.0 - 2.0 * torch.remainder(torch.floor(i * 0.6180339887498949), 2.0)


def fingerprint(model: nn.Module) -> dict[str, Any]:
    """The parameters (state_dict order) as JSON: per tensor its shape, float64 sum, absolute
    sum, sum of squares and ± projection, then all values (small tensors) or 16 entries at fixed
    evenly spaced positions (large ones); plus the sha256 of all names, shapes and raw bytes."""
    h = hashlib.sha256()
    tensors = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(name.encode() + str(tuple(t.shape)).encode() + str(t.dtype).encode())
        h.update(t.numpy().tobytes())
        x = t.reshape(-1).double()
        entry: dict[str, Any] = {
            "shape": list(t.shape),
            "dtype": str(t.dtype),
            "sum": float(x.sum()),
            "abssum": float(x.abs().sum()),
            "sumsq": float((x * x).sum()),
            "proj": float((x * _projection_weights(x.numel())).sum()),
        }
        if x.numel() <= FULL_VALUES_UP_TO:
            entry["values"] = x.tolist()
        else:
            idx = torch.linspace(0, x.numel() - 1, SAMPLES).round().long()
            entry["sample_index"] = idx.tolist()
            entry["sample"] = x[idx].tolist()
        tensors[name] = entry
    return {"sha256": h.hexdigest(), "tensors": tensors}


def _result(model: nn.Module, optimizer: Any, extra: dict | None = None) -> dict[str, Any]:
    out = {
        "ledger": optimizer.ledger.to_dict(),
        "epsilon": float(optimizer.epsilon(DELTA)),
        "parameters": fingerprint(model),
    }
    out.update(extra or {})
    # JSON round trip: what is compared is exactly what the reference file can hold.
    return json.loads(json.dumps(out))


def _train(model: nn.Module, optimizer: Any, loader: Any, epochs: int) -> None:
    """``dpfy.train.epoch.run_epoch``'s loop: one private step per logical (Poisson) batch; an
    empty batch still steps (noise only)."""
    model.train()
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y) if len(y) else logits.sum()
            loss.backward()
            optimizer.step()


def _mlp(seed: int, sizes: tuple[int, ...]) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


# ------------------------------------------------------------------------------- scenarios
def scenario_default_recipe(noise_multiplier: float | None = None) -> dict[str, Any]:
    """a. ``dpfy train``'s defaults (dpfy.train.config: tanh_cnn, fashion_mnist, SGD lr 4.0
    momentum 0.9, clip 0.1, flat clipping, engine auto, Poisson, PLD calibration to a target ε
    at δ = 1e-5) scaled to the first 1000 training images, batch 128 (q = 0.128), 2 epochs
    (16 steps). Target ε = 1 instead of 3: over 16 steps ε = 3 means σ ≈ 0.9, whose PLD
    calibration takes ~10 s here; ε = 1 gives σ ≈ 2.35 (the full recipe's range) in ~2 s.

    With ``noise_multiplier``, the same run with σ given instead of calibrated (the target
    stays the run's ε cap): see :data:`CALIBRATED_RTOL`."""
    from dpfy.data import load_dataset
    from dpfy.models import build_model

    data = load_dataset("fashion_mnist", data_dir=FMNIST_DIR)
    x, y = data.train.tensors
    train = TensorDataset(x[:1000].clone(), y[:1000].clone())
    torch.manual_seed(101)  # model init, as dpfy train does
    model = build_model("tanh_cnn", input_shape=data.input_shape, num_classes=data.num_classes)
    sgd = torch.optim.SGD(model.parameters(), lr=4.0, momentum=0.9, weight_decay=0.0)
    budget: dict[str, Any] = (
        {"target_epsilon": 1.0}
        if noise_multiplier is None
        else {"noise_multiplier": noise_multiplier, "epsilon_cap": 1.0}
    )
    model, opt, loader = dpfy.make_private(
        model,
        sgd,
        DataLoader(train, batch_size=128),
        **budget,
        target_delta=DELTA,
        epochs=2,
        max_grad_norm=0.1,
        seed=102,
        accountant="pld",
    )
    _train(model, opt, loader, epochs=2)
    return _result(model, opt)


def scenario_decay_quantile() -> dict[str, Any]:
    """b. noise decay + quantile clipping chained, calibrated to ε = 2 at δ = 1e-5, digits
    (1437 training examples), batch 96, 2 epochs (30 steps). RDP: calibrating this chain with
    PLD takes 3-9 s here, and scenario a already covers PLD."""
    from dpfy.data import load_dataset

    data = load_dataset("digits")
    model = nn.Sequential(nn.Flatten(), _mlp(201, (64, 32, 10)))  # digits are (1, 8, 8)
    sgd = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    model, opt, loader = dpfy.make_private(
        model,
        sgd,
        DataLoader(data.train, batch_size=96),
        method=build_decay_and_quantile(),
        target_epsilon=2.0,
        target_delta=DELTA,
        epochs=2,
        max_grad_norm=1.0,
        seed=202,
        accountant="rdp",
    )
    _train(model, opt, loader, epochs=2)
    return _result(model, opt)


def _individual(variant: str, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(300)
    n = 300
    ds = TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))
    # Two groups, ε = 1 and 2, alternating (public). Three groups ({1, 2, 3}) make the Sample
    # calibration's nested RDP searches take ~10 s here instead of ~2 s.
    budgets = torch.tensor([1.0, 2.0], dtype=torch.float64)[torch.arange(n) % 2]
    model = _mlp(301, (6, 8, 3))
    sgd = torch.optim.SGD(model.parameters(), lr=0.3)
    model, opt, loader = dpfy.make_private(
        model,
        sgd,
        DataLoader(ds, batch_size=30),
        budgets=budgets,
        individual=variant,  # q 0.1
        target_delta=DELTA,
        epochs=2,
        max_grad_norm=0.5,
        seed=seed,
        accountant="rdp",
    )
    _train(model, opt, loader, epochs=2)
    return _result(model, opt, {"group_epsilons": [float(e) for e in opt.group_epsilons(DELTA)]})


def scenario_individual_sample() -> dict[str, Any]:
    """c1. individualized budgets {1, 2} (half each), IDP-SGD Sample, RDP, 300 random examples,
    batch 30, 2 epochs (20 steps); also each group's ε."""
    return _individual("sample", 302)


def scenario_individual_scale() -> dict[str, Any]:
    """c2. the same budgets, IDP-SGD Scale."""
    return _individual("scale", 303)


DDP_WORLD, DDP_PER_RANK, DDP_STEPS = 2, 8, 5


def _ddp_worker(rank: int, port: int, out: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=DDP_WORLD)
    try:
        g = torch.Generator().manual_seed(400)
        ds = TensorDataset(torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g))
        model = DDP(_mlp(401, (5, 7, 3)))
        sgd = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        model, opt, loader = dpfy.make_private(
            model,
            sgd,
            DataLoader(ds, batch_size=DDP_PER_RANK, sampler=DistributedSampler(ds)),
            noise_multiplier=0.8,
            max_grad_norm=0.3,
            max_steps=DDP_STEPS,
            seed=402,
        )
        steps = 0
        while steps < DDP_STEPS:  # 4 logical batches per pass: 2 passes
            for x, y in loader:
                if steps == DDP_STEPS:
                    break
                opt.zero_grad(set_to_none=True)
                logits = model(x)
                (nn.functional.cross_entropy(logits, y) if len(y) else logits.sum()).backward()
                opt.step()
                steps += 1
        inner = model.module if isinstance(model, DDP) else model
        res = _result(inner, opt)
        Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scenario_data_parallel() -> dict[str, Any]:
    """d. DDP-wrapped MLP with a DistributedSampler, 2 gloo ranks, σ = 0.8, 5 steps (max_steps):
    rank 0's ledger and parameters (rank 1's must equal them)."""
    with tempfile.TemporaryDirectory() as out:
        from spawned_ranks import start_ranks  # tests/ is on the path (conftest, __main__)

        start_ranks(_ddp_worker, DDP_WORLD, (_free_port(), out))
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(DDP_WORLD)]
    r0, r1 = ranks
    r0["replicas_bit_identical"] = (
        r0["parameters"]["sha256"] == r1["parameters"]["sha256"] and r0["ledger"] == r1["ledger"]
    )
    return r0


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "a_default_recipe": scenario_default_recipe,
    "b_decay_quantile": scenario_decay_quantile,
    "c_individual_sample": scenario_individual_sample,
    "c_individual_scale": scenario_individual_scale,
    "d_data_parallel": scenario_data_parallel,
}


# Scenario a calibrates σ with PLD. The calibration's contract is the smallest safe σ to a
# relative 1e-3, on the safe side, and since issue 31 §4 (≤ 2 s calibration) its search runs on
# the coarse pessimistic 1e-3 PLD grid and steps past each interpolated σ: the σ it returns
# moved from the reference's 2.351637 to 2.352725 (+4.6e-4), a different point of the same
# tolerance band. So scenario a is checked in two parts: the calibrated run's σ within
# CALIBRATED_RTOL of the reference's, the rest of its ledger exact, and its ε at most the target
# and within CALIBRATED_EPSILON_RTOL of the reference's; then the same run with the reference's
# σ given (noise_multiplier=) against everything in the reference, exactly as the other
# scenarios (ledger, ε, parameters). Nothing that does not depend on σ gets a tolerance.
CALIBRATED_RTOL = 2e-3  # twice the calibration's own relative tolerance on σ
CALIBRATED_EPSILON_RTOL = 5e-3  # ε ∝ σ^-k with k ≈ 1-2 here: 2e-3 of σ moves ε by ≤ ~4e-3
TARGET_EPSILON_A = 1.0


def run_scenario(name: str, **kwargs: Any) -> dict[str, Any]:
    """One scenario on one torch thread (bit-reproducible summation order), warnings muted
    (the seed warning); the caller's thread count is restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return SCENARIOS[name](**kwargs)
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------- ε: a derived tolerance
# The ledger is compared exactly, so both machines account the same (σ, q, T); ε still differed
# from the reference in the 12th digit on an AVX-512 CPU (a: 0.9999994763493207 against
# 0.9999994763508682, d: 6.709530998761899 against 6.709530998738856). The cause is numpy's
# vectorized float64 elementary functions inside the accountant: on a CPU with AVX-512F numpy runs
# its own AVX-512 exp/log kernels (within 4 ulp), elsewhere glibc's (within 1 ulp). With
# ``NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL"`` the AVX-512 machine reproduces the reference's
# ε to the last bit (CONTRIBUTING.md, "Both kinds of CPU"). PLD's connect-the-dots PMF is a second
# difference of hockey-stick values divided by the grid step (1e-4), so those ulps grow about
# 10⁴-fold in ε. CPython's math and scipy's compiled special functions have no CPU dispatch.
#
# The tolerance: two CPUs' results of each elementary function differ by at most 5 ulp, a
# relative ρ = 5 · 2u = 10u (u = 2⁻⁵³; one ulp of x is at most 2u·|x|). To first order ε moves by
# Δε = Σ_i g_i r_i over the N perturbed results (|r_i| ≤ ρ), so |Δε| ≤ ρ Σ|g_i| ≤ ρ √N ‖g‖₂
# (Cauchy–Schwarz). ε recomputed with every numpy exp/log/expm1/log1p/logaddexp result of the
# accountant (dp_accounting and dpfy.privacy) multiplied by 1 + r_i, r_i uniform on [−ρ, ρ],
# has E[Δε²] = ρ² ‖g‖₂² / 3, so ρ ‖g‖₂ = √3 · RMS(Δε) and |Δε| ≤ √(3N) · RMS(Δε), the RMS
# estimated from EPSILON_DRAWS seeded draws (N ≈ 4·10⁵ results per PLD evaluation here, so the
# √(3N) ≈ 1,100 of the worst case dwarfs the estimate's sampling error). That is 4.5e-8 (a) and
# 4.8e-9 (d) relative: a σ changed by 1e-5 relative still moves ε by about 300 such tolerances
# (1.4e-5 in a), and the ledger catches it anyway. Where no draw moves ε (the RDP scenarios
# here), the floor EPSILON_FLOOR_RTOL allows another libm on the scalar path: 1e-13 relative,
# 450 operations off by 1 ulp (2u) each. Measured on an AVX-512 CPU against the reference:
# 1.5e-12 (a) and 3.4e-12 (d) relative, 3e-5 and 7e-4 of the tolerance.
FLOAT64_U = 2.0**-53
ELEMENTARY_RELATIVE = 10 * FLOAT64_U  # ρ: 5 ulp between two CPUs' exp/log results
ELEMENTARY_FUNCTIONS = ("exp", "log", "expm1", "log1p", "logaddexp")
EPSILON_DRAWS = 2  # each PLD draw of scenario d takes ~2 s here
EPSILON_FLOOR_RTOL = 1e-13
SCENARIO_ACCOUNTANT = {  # the accountant each scenario's ε comes from (make_private's default: PLD)
    "a_default_recipe": "pld",
    "b_decay_quantile": "rdp",
    "c_individual_sample": "rdp",
    "c_individual_scale": "rdp",
    "d_data_parallel": "pld",
}


class _PerturbedNumpy:
    """numpy as the accountant's modules see it, with each elementary-function result multiplied
    by 1 + r, r uniform on [−ρ, ρ] per entry; counts the perturbed results. The accountant
    calls these functions mostly on scalars, ~10⁵ times per PLD: r comes from a block drawn at
    once."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.count, self.block = rng, 0, []

    def _draw(self, n: int) -> np.ndarray:
        return self.rng.uniform(-ELEMENTARY_RELATIVE, ELEMENTARY_RELATIVE, n)

    def _one(self) -> float:
        if not self.block:
            self.block = self._draw(1 << 16).tolist()
        return self.block.pop()

    def __getattr__(self, name: str) -> Any:
        f = getattr(np, name)
        if name not in ELEMENTARY_FUNCTIONS:
            return f

        def perturbed(*args: Any, **kwargs: Any) -> Any:
            out = f(*args, **kwargs)
            if isinstance(out, np.ndarray) and out.ndim:
                self.count += out.size
                return out * (1 + self._draw(out.size).reshape(out.shape))
            self.count += 1
            return type(out)(out * (1 + self._one()))

        return perturbed


def _accountant_modules() -> list[Any]:
    return [
        m
        for n, m in list(sys.modules.items())
        if n.startswith(("dp_accounting", "dpfy.privacy")) and getattr(m, "np", None) is np
    ]


def _clear_accountant_caches() -> None:
    """dpfy.privacy memoises PLDs, RDP curves and ε: clear them, so a perturbed evaluation
    neither reads an unperturbed result nor leaves a perturbed one behind."""
    for name, module in list(sys.modules.items()):
        if name.startswith("dpfy.privacy"):
            for obj in vars(module).values():
                if callable(getattr(obj, "cache_clear", None)) and getattr(
                    obj, "__module__", ""
                ).startswith("dpfy"):
                    obj.cache_clear()


def ledger_epsilon(ledger: dict[str, Any], accountant: str) -> float:
    """ε(δ = DELTA) of a stored ledger, by dpfy's accountant (as ``optimizer.epsilon``)."""
    from dpfy.privacy.accountants import epsilon
    from dpfy.privacy.ledger import Ledger

    return float(epsilon(Ledger.from_dict(ledger), delta=DELTA, accountant=accountant))


def epsilon_tolerance(ledger: dict[str, Any], accountant: str, eps: float) -> float:
    """The absolute tolerance on ε derived above: √(3N) · RMS of ε's moves under EPSILON_DRAWS
    seeded perturbations of the accountant's elementary functions, at least the floor."""
    modules, moves, count = _accountant_modules(), [], 0
    for draw in range(EPSILON_DRAWS):
        fake = _PerturbedNumpy(np.random.default_rng(draw))
        for m in modules:
            m.np = fake
        try:
            _clear_accountant_caches()
            moves.append(ledger_epsilon(ledger, accountant) - eps)
        finally:
            for m in modules:
                m.np = np
            _clear_accountant_caches()
        count = max(count, fake.count)
    rms = math.sqrt(sum(d * d for d in moves) / len(moves))
    return max(math.sqrt(3 * count) * rms, EPSILON_FLOOR_RTOL * abs(eps))


# ---------------------------------------------------------------------------- comparison
def compare(
    name: str, got: dict[str, Any], ref: dict[str, Any], epsilon_tol: float
) -> tuple[list[str], bool]:
    """(problems, bit_identical): what differs beyond float rounding (ε beyond ``epsilon_tol``,
    each group's ε beyond the same relative tolerance), and whether the parameters' bytes are
    the same."""
    problems = []
    if got["ledger"] != ref["ledger"]:
        problems.append(f"{name}: ledger differs:\n  got {got['ledger']}\n  ref {ref['ledger']}")
    if not abs(got["epsilon"] - ref["epsilon"]) <= epsilon_tol:
        problems.append(
            f"{name}: ε(δ={DELTA}) {got['epsilon']!r} vs reference "
            f"{ref['epsilon']!r} (allowed ±{epsilon_tol:.3g})"
        )
    groups, ref_groups = got.get("group_epsilons"), ref.get("group_epsilons")
    rel = epsilon_tol / abs(ref["epsilon"])
    if (groups is None) != (ref_groups is None) or (
        groups is not None
        and (
            len(groups) != len(ref_groups)
            or any(not abs(g - r) <= rel * abs(r) for g, r in zip(groups, ref_groups))
        )
    ):
        problems.append(
            f"{name}: group ε {groups} vs reference {ref_groups} (allowed ±{rel:.3g} relative)"
        )
    gp, rp = got["parameters"]["tensors"], ref["parameters"]["tensors"]
    if list(gp) != list(rp):
        problems.append(f"{name}: parameter names {list(gp)} != reference {list(rp)}")
        return problems, False
    for k, r in rp.items():
        g = gp[k]
        if g["shape"] != r["shape"]:
            problems.append(f"{name}: {k} shape {g['shape']} != {r['shape']}")
            continue
        if "values" in r:
            a, b = torch.tensor(g["values"]), torch.tensor(r["values"])
            if not torch.allclose(a, b, rtol=RTOL, atol=ATOL):
                problems.append(
                    f"{name}: {k} values differ, max |Δ| = {float((a - b).abs().max()):.3g}"
                )
        else:
            if g["sample_index"] != r["sample_index"] or not torch.allclose(
                torch.tensor(g["sample"]), torch.tensor(r["sample"]), rtol=RTOL, atol=ATOL
            ):
                problems.append(
                    f"{name}: {k} sampled entries differ: {g['sample']} vs {r['sample']}"
                )
        # What elementwise |x - y| <= atol + rtol·|y| implies for each aggregate (n entries).
        n = math.prod(r["shape"])
        lin = n * ATOL + RTOL * r["abssum"]
        bounds = {
            "sum": lin,
            "abssum": lin,
            "proj": lin,
            "sumsq": 2 * (ATOL + RTOL) * (r["abssum"] + r["sumsq"]) + n * (ATOL + RTOL) ** 2,
        }
        for stat, tol in bounds.items():
            if abs(g[stat] - r[stat]) > tol * 1.0001 + 1e-12:
                problems.append(
                    f"{name}: {k} {stat} {g[stat]!r} vs reference {r[stat]!r} (allowed ±{tol:.3g})"
                )
    return problems, got["parameters"]["sha256"] == ref["parameters"]["sha256"]


def _sigma(ledger: dict[str, Any]) -> float:
    (group,) = ledger["groups"]
    (release,) = group["releases"]
    return float(release["noise_multiplier"])


def check_calibration(got: dict[str, Any], ref: dict[str, Any]) -> None:
    """Scenario a's calibrated run: σ within CALIBRATED_RTOL of the reference's, the ledger
    otherwise identical, ε ≤ the target and within CALIBRATED_EPSILON_RTOL of the reference's."""
    sigma, sigma_ref = _sigma(got["ledger"]), _sigma(ref["ledger"])
    assert abs(sigma / sigma_ref - 1) <= CALIBRATED_RTOL, (sigma, sigma_ref)
    pinned = json.loads(json.dumps(got["ledger"]).replace(repr(sigma), repr(sigma_ref)))
    assert pinned == ref["ledger"], (got["ledger"], ref["ledger"])
    assert got["epsilon"] <= TARGET_EPSILON_A
    assert abs(got["epsilon"] / ref["epsilon"] - 1) <= CALIBRATED_EPSILON_RTOL, (
        got["epsilon"],
        ref["epsilon"],
    )


# ----------------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(REFERENCE.read_text())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_seeded_run_matches_the_pre_recut_reference(
    name: str, reference: dict, record_property: Any
) -> None:
    if name == "a_default_recipe" and not FMNIST_DIR.is_dir():
        pytest.skip(f"Fashion-MNIST not installed at {FMNIST_DIR} (scripts/setup.sh)")
    ref = reference["scenarios"][name]
    if name == "a_default_recipe":  # σ is calibrated: see CALIBRATED_RTOL
        check_calibration(run_scenario(name), ref)
        got = run_scenario(name, noise_multiplier=_sigma(ref["ledger"]))
    else:
        got = run_scenario(name)
    tol = epsilon_tolerance(ref["ledger"], SCENARIO_ACCOUNTANT[name], got["epsilon"])
    record_property("epsilon_tolerance", tol)
    problems, bit_identical = compare(name, got, ref, tol)
    record_property("parameters_bit_identical", bit_identical)
    print(f"{name}: parameters bit-identical to the reference: {bit_identical}")
    assert not problems, "\n".join(problems)
    if name == "d_data_parallel":
        assert got["replicas_bit_identical"], "the two ranks' parameters or ledgers differ"


def _changed(ref: dict[str, Any], change: str, accountant: str = "pld") -> dict[str, Any]:
    """A one-group, one-release reference (scenario a's) with σ raised by 1e-5 relative, or one
    more step, its ε recomputed by the run's ``accountant``: what a real change of the run
    would store (test_spec_equivalence.py reuses it)."""
    got = json.loads(json.dumps(ref))
    (group,) = got["ledger"]["groups"]
    if change == "sigma":
        (release,) = group["releases"]
        release["noise_multiplier"] *= 1 + 1e-5
    else:
        group["count"] += 1
        got["ledger"]["num_steps"] += 1
    got["epsilon"] = ledger_epsilon(got["ledger"], accountant)
    return got


@pytest.mark.parametrize("change", ["sigma", "steps", "seed"])
def test_the_comparison_catches_changes_beyond_its_tolerance(change: str, reference: dict) -> None:
    """The derived tolerances still fail a real change: σ × (1 + 1e-5) or one step more in
    scenario a (ε and the ledger each flag it; ε moves by more than ten tolerances), and
    scenario c2 run with another seed (its parameters flag it; its accounting is unchanged)."""
    if change == "seed":
        ref = reference["scenarios"]["c_individual_scale"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _individual("scale", 304)  # the reference's seed is 303
        tol = epsilon_tolerance(ref["ledger"], "rdp", got["epsilon"])
        problems, _ = compare("c_individual_scale", got, ref, tol)
        assert problems and all(
            "values differ" in p or "sum" in p or "proj" in p for p in problems
        ), problems
        return
    ref = reference["scenarios"]["a_default_recipe"]
    got = _changed(ref, change)
    tol = epsilon_tolerance(ref["ledger"], "pld", ref["epsilon"])
    assert abs(got["epsilon"] - ref["epsilon"]) > 10 * tol, (got["epsilon"], ref["epsilon"], tol)
    problems, _ = compare("a_default_recipe", got, ref, tol)
    assert any("ledger differs" in p for p in problems), problems
    assert any("ε(δ=" in p for p in problems), problems


# ------------------------------------------------------------------------------- generator
def _source_commit() -> str:
    """The commit (and whether the tree is dirty) of the dpfy that is imported."""
    root = Path(dpfy.__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return rev + (" with uncommitted changes under src/dpfy" if dirty else "")


def _command() -> str:
    path = os.environ.get("PYTHONPATH")
    exe = (
        os.path.relpath(sys.executable)
        if sys.executable.startswith(os.getcwd())
        else sys.executable
    )
    return " ".join(([f"PYTHONPATH={path}"] if path else []) + [exe] + sys.argv)


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed_scenarios(
    names: Any, run: Callable[[str], dict[str, Any]], line: Callable[[dict[str, Any]], str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run each scenario once: ({name: result}, {name: its wall and CPU seconds, ranks
    included}), printing ``name: seconds`` and ``line(result)`` as each finishes."""
    scenarios, seconds = {}, {}
    for name in names:
        t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu()
        scenarios[name] = run(name)
        seconds[name] = {
            "wall": round(time.perf_counter() - t0, 2),
            "cpu": round(time.process_time() - c0 + _children_cpu() - k0, 2),
        }
        print(f"{name}: {seconds[name]} s, {line(scenarios[name])}", flush=True)
    return scenarios, seconds


def write_reference_doc(
    out: Path, source: str, epsilon_note: str, timed: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """Write a reference JSON: where it came from (``source``: the commit and how it was
    imported), the tolerances, the seconds per scenario and the scenarios' results."""
    scenarios, seconds = timed
    doc = {
        "source": f"{source}; written by `{_command()}` in the repository root",
        "torch": torch.__version__,
        "tolerance": {"rtol": RTOL, "atol": ATOL, "ledger": "exact", "epsilon": epsilon_note},
        "seconds_when_written": seconds,
        "scenarios": scenarios,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} (dpfy from {Path(dpfy.__file__).parent})")


def write_reference(out: Path) -> None:
    """Run every scenario with the dpfy that is imported and write the reference JSON."""
    timed = timed_scenarios(
        SCENARIOS,
        run_scenario,
        lambda r: f"ε = {r['epsilon']:.6g}, sha256 {r['parameters']['sha256'][:16]}",
    )
    source = (
        f"dpfy commit {_source_commit()} (the trunk before the re-cut), imported from a "
        f"worktree of that commit (`git worktree add /tmp/dpfy_base c323d27`)"
    )
    write_reference_doc(out, source, "derived per run: epsilon_tolerance in the test", timed)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write-reference", type=Path, metavar="OUT.json", required=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: spawned_ranks
    write_reference(p.parse_args().write_reference)
