"""GPU arithmetic on the CPU: TF32 emulated, the row probe's derived tolerance, full float32
inside the engine's norms and sums, and the bias norm that must not cancel (issue 36, items 4–6).

TF32 is emulated as a GPU computes it: the inputs of every convolution and Linear rounded to a
10-bit mantissa (``round_to_tf32``), the products accumulated in float32 on the full batch
and, for "another algorithm at another batch size", in float64 on the probe's shortened batch.
``torch.set_float32_matmul_precision("high")`` tells dpfy that TF32 is in effect (on a GPU
``torch.backends.cudnn.allow_tf32``, on by default, says the same for convolutions).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dpfy
from dpfy.grads import GradEngine
from dpfy.grads.arithmetic import (
    BF16_U,
    FP32_RTOL,
    ROW_FACTOR,
    TF32_U,
    full_precision,
    round_to_tf32,
    row_rtol,
    unit_roundoff,
)


@pytest.fixture
def precision():
    """Set torch's float32 matmul precision for one test, restored after."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def test_round_to_tf32_is_round_to_nearest_even_at_10_bits():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, generator=g) * torch.exp(torch.randn(10_000, generator=g) * 5)
    ties = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11)])  # halfway: to even
    x = torch.cat([x, ties])
    # float64 derivation: x = m·2^e with m in [0.5, 1); keep 11 significant bits (1 + 10)
    m, e = np.frexp(x.double().numpy())
    want = np.ldexp(np.round(m * 2**11) / 2**11, e)  # np.round: half to even
    got = round_to_tf32(x).double().numpy()
    np.testing.assert_array_equal(got, want)
    assert got[-3:].tolist() == [1.0, 1 + 4 * 2**-11, -1.0]


def test_the_tolerance_follows_the_arithmetic_in_effect(precision):
    # float32 on the CPU at "highest": the probe's former float32 tolerance
    assert row_rtol(torch.float32, "cpu") == FP32_RTOL
    # cuDNN's TF32 is on by default: a float32 CUDA tensor is rounded to 10 bits
    assert torch.backends.cudnn.allow_tf32
    assert unit_roundoff(torch.float32, "cuda") == 2.0**-11
    assert row_rtol(torch.float32, "cuda") == ROW_FACTOR * TF32_U
    assert row_rtol(torch.bfloat16, "cpu") == ROW_FACTOR * BF16_U
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert unit_roundoff(torch.float32, "cpu") == 2.0**-8
    precision("medium")  # bfloat16 allowed inside float32 matmuls
    assert unit_roundoff(torch.float32, "cpu") == 2.0**-8
    with full_precision():  # the engine's norms and sums
        assert unit_roundoff(torch.float32, "cpu") == 2.0**-24
        assert unit_roundoff(torch.float32, "cuda") == 2.0**-24
        assert not torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "medium" and torch.backends.cudnn.allow_tf32


def _tf32(t: torch.Tensor) -> torch.Tensor:
    return t + (round_to_tf32(t.detach()) - t.detach())  # rounded forward, identity backward


def emulate_tf32(model: nn.Module, full_rows: int) -> nn.Module:
    """Every Conv2d and Linear of ``model`` computed as TF32 does (module docstring): float32
    sums on batches of ``full_rows``, float64 sums (another order) on any other batch."""

    def hook(m: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        x, w, b = _tf32(args[0]), _tf32(m.weight), m.bias
        wide = x.shape[0] != full_rows
        if wide:
            x, w, b = x.double(), w.double(), None if b is None else b.double()
        y = (
            F.conv2d(x, w, b, m.stride, m.padding)
            if isinstance(m, nn.Conv2d)
            else F.linear(x, w, b)
        )
        return y.float()

    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m.register_forward_hook(hook)
    return model


class HandBatchNorm2d(nn.Module):
    """Batch statistics by hand: mixes every row into every other (must stay refused)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h - h.mean(0, keepdim=True)) / (h.std(0, keepdim=True) + 1e-5)


def conv_net(norm) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(1, 16, 3, padding=1), norm(), nn.Tanh()]
    for _ in range(3):
        layers += [nn.Conv2d(16, 16, 3, padding=1), norm(), nn.Tanh()]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(16 * 8 * 8, 10))


ROWS = 16


def _problems(norm, level: str, precision) -> list[str]:
    torch.manual_seed(0)
    precision(level)
    model = emulate_tf32(conv_net(norm), ROWS)
    return dpfy.validate(model, example_batch=torch.randn(ROWS, 1, 8, 8))


def test_a_groupnorm_net_under_tf32_is_accepted_where_the_float32_tolerance_refused(precision):
    gn = lambda: nn.GroupNorm(4, 16)  # noqa: E731
    # the float32 tolerance refuses the emulated TF32 rows: the false refusal of issue 36
    refused = _problems(gn, "highest", precision)
    assert any("mixes or moves examples" in p for p in refused), refused
    # with TF32 declared in effect, the derived tolerance accepts them
    assert _problems(gn, "high", precision) == []


def test_a_batch_norm_by_hand_is_still_refused_under_tf32(precision):
    problems = _problems(HandBatchNorm2d, "high", precision)
    assert any("mixes or moves examples" in p for p in problems), problems


class Centred(nn.Module):
    """A Linear over positions whose per-example loss gradient sums to 0 over positions: the
    output is centred over the sequence, so ∂ℓ_i/∂b = Σ_t g_t = 0 exactly (mean loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)  # (B, T, 32)
        return y - y.mean(1, keepdim=True)


@pytest.mark.parametrize("threads", [1, 2])  # 1: the fused native kernel where it builds
def test_a_bias_norm_that_is_zero_does_not_cancel_to_rounding_noise(threads):
    torch.manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, x = Centred(), torch.randn(4, 8, 32) * 10
        eng = GradEngine(model, route="ghost", loss_reduction="mean")
        try:
            (model(x) ** 2).sum(2).mean().backward()
            sq = eng.per_sample_sq_norms()
        finally:
            eng.detach()
    finally:
        torch.set_num_threads(before)
    # float64 loop: each example's bias gradient alone, and Σ_t ‖g_t‖² of its output gradient
    ref, want, spread = model.double(), [], []
    for i in range(4):
        ref.zero_grad()
        y = ref.lin(x[i : i + 1].double())
        out = y - y.mean(1, keepdim=True)
        (g,) = torch.autograd.grad((out**2).sum(2).mean(), y, retain_graph=True)
        (out**2).sum(2).mean().backward()
        want.append(float(ref.lin.bias.grad.norm() ** 2))
        spread.append(float(g.square().sum()))
    assert max(want) < 1e-20  # the truth: 0 up to float64 rounding
    # derivation: Σ_t g_t summed in float32 over T = 8 terms errs by at most T·u·Σ_t‖g_t‖
    # (γ_T, Higham §3.1); squared and by Cauchy–Schwarz ≤ (T·u)²·T·Σ_t‖g_t‖², times B² = 16
    # for either scaling of a mean loss. The Gram sum 1ᵀGGᵀ1 cancels to about
    # T·u·Σ_t‖g_t‖² instead (not squared): orders of magnitude above this bound.
    t, u, b = 8, 2.0**-24, 4
    bound = (t * u) ** 2 * t * max(spread) * b**2
    assert float(sq["lin.bias"].abs().max()) <= bound, (sq["lin.bias"], bound)


def test_norms_are_computed_in_float32_so_a_clipped_contribution_stays_within_c(
    precision, monkeypatch
):
    """A Linear's ghost norm computed as a GPU would while TF32 is in effect (its operands
    rounded to 10 bits) under-estimates some examples' norms by up to ~2u = 1e-3 relative:
    their clip factors C/‖g̃_i‖ then let ‖w_i g_i‖ exceed C. The engine switches TF32 off
    for its norms and sums (grads/arithmetic.py), so the emulation computes in float32."""
    from dpfy.grads.arithmetic import tf32_in_effect
    from dpfy.grads.rules.linear import LinearRule

    exact = LinearRule.sq_norm

    def as_on_a_gpu(self, layer, a, g):
        if tf32_in_effect():  # what the flags allow a GPU to do: 10-bit operands
            a, g = round_to_tf32(a), round_to_tf32(g)
        return exact(self, layer, a, g)

    monkeypatch.setattr(LinearRule, "sq_norm", as_on_a_gpu)
    precision("high")  # TF32 allowed, as on a GPU with allow_tf32
    torch.manual_seed(0)
    model, x = nn.Linear(64, 64, bias=False), torch.randn(64, 1, 64)
    eng = GradEngine(model, route="ghost", loss_reduction="sum")
    try:
        (model(x) ** 2).sum().backward()
        norms = eng.per_sample_sq_norms()["weight"].sqrt()
    finally:
        eng.detach()
    # float64 per-example gradients G_i = Σ_t g_t a_tᵀ of ℓ_i = ‖W x_i‖²
    w64, x64 = model.weight.detach().double(), x.double()
    grads = torch.einsum("bto,bti->boi", 2 * x64 @ w64.T, x64)
    true = grads.flatten(1).norm(dim=1)
    clip = float(true.min()) / 2  # every example is clipped
    contribution = true * (clip / norms.double()).clamp(max=1)
    # float32: ‖G_i‖² = ‖a_i‖²·‖g_i‖² (T = 1), each a sum of 64 squares, relative error
    # ≤ γ_64 ≈ 64u each, so the product within 128u and the norm within 64u; TF32 operands
    # err by up to 2^-11 per element, about 6e-5 relative on the norm: 15 times more
    assert float(contribution.max()) <= clip * (1 + 64 * 2.0**-24)


@pytest.fixture
def fp32_precision_api():
    """torch's per-backend ``fp32_precision`` flags (torch ≥ 2.9) for one test; torch's
    defaults restored after (they are process-wide)."""
    backends = torch.backends
    if not hasattr(backends, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision API")
    _fp32_defaults(backends)  # an earlier test's set_float32_matmul_precision sets "ieee"
    yield backends
    _fp32_defaults(backends)


def _fp32_defaults(backends) -> None:
    backends.fp32_precision = "none"
    backends.cudnn.fp32_precision = "none"
    backends.cuda.matmul.fp32_precision = "none"
    backends.cudnn.conv.fp32_precision = "tf32"  # cuDNN's TF32 default (allow_tf32 = True)
    backends.cudnn.rnn.fp32_precision = "tf32"
    for flag in (backends.mkldnn.matmul, backends.mkldnn.conv):
        flag.fp32_precision = "none"
    assert torch.get_float32_matmul_precision() == "highest" and backends.cudnn.allow_tf32


@pytest.mark.parametrize("where", ["all backends", "cudnn"])
def test_full_precision_switches_off_tf32_set_through_the_newer_api(fp32_precision_api, where):
    """``torch.backends.fp32_precision = "tf32"`` (or ``torch.backends.cudnn``'s) allows TF32
    in every cuDNN convolution by inheritance. Switching the legacy ``cudnn.allow_tf32`` off
    resets the convolutions' own flag to "none", which inherits "tf32" again: the engine's
    convolution_backward sums (grads/rules/conv.py) would round to TF32 while their norms
    (cuBLAS, switched off) do not, and a clipped contribution could exceed C by TF32's error.
    The flags are what cuDNN reads when an op is launched, so they are checked here on the CPU."""
    backends = fp32_precision_api
    if where == "all backends":
        backends.fp32_precision = "tf32"
    else:
        backends.cudnn.fp32_precision = "tf32"
    assert backends.cudnn.conv.fp32_precision == "tf32"  # inherited: TF32 in effect
    assert unit_roundoff(torch.float32, "cuda") == TF32_U
    with full_precision():
        assert backends.cudnn.conv.fp32_precision != "tf32"
        assert backends.cuda.matmul.fp32_precision != "tf32"
        assert unit_roundoff(torch.float32, "cuda") == 2.0**-24
    # the user's setting again after
    assert backends.cudnn.conv.fp32_precision == "tf32"
    assert backends.cuda.matmul.fp32_precision == "tf32"


@pytest.fixture
def onednn_precision():
    """The CPU's oneDNN float32 precision flags for one test; torch's defaults ("none")
    restored after."""
    mkldnn = getattr(torch.backends, "mkldnn", None)
    if not hasattr(getattr(mkldnn, "matmul", None), "fp32_precision"):
        pytest.skip("this torch has no oneDNN fp32_precision flags")
    yield mkldnn
    mkldnn.matmul.fp32_precision = "none"
    mkldnn.conv.fp32_precision = "none"


def test_onednn_bfloat16_float32_matmuls_are_seen_and_switched_off(onednn_precision):
    """``torch.backends.mkldnn.matmul.fp32_precision = "bf16"`` lets oneDNN compute float32
    matrix products in bfloat16 on CPUs that have it (AMX, AVX512-BF16): the CPU's TF32. The
    row probe's tolerance must follow it (else a false refusal), and the engine's norms and sums
    must not run in it (else a clipped contribution exceeds C by bfloat16's rounding)."""
    mkldnn = onednn_precision
    mkldnn.matmul.fp32_precision = "bf16"
    assert unit_roundoff(torch.float32, "cpu") == BF16_U
    assert row_rtol(torch.float32, "cpu") == ROW_FACTOR * BF16_U
    with full_precision():
        assert mkldnn.matmul.fp32_precision == "ieee"
        assert unit_roundoff(torch.float32, "cpu") == 2.0**-24
    assert mkldnn.matmul.fp32_precision == "bf16"
    mkldnn.matmul.fp32_precision = "none"
    mkldnn.conv.fp32_precision = "tf32"
    assert unit_roundoff(torch.float32, "cpu") == TF32_U
    with full_precision():
        assert mkldnn.conv.fp32_precision == "ieee"
    assert mkldnn.conv.fp32_precision == "tf32"


def test_full_precision_restores_legacy_cublas_tf32_without_touching_onednn(fp32_precision_api):
    """``torch.backends.cuda.matmul.allow_tf32 = True`` (the legacy API) allows TF32 in cuBLAS
    only: ``get_float32_matmul_precision()`` then reads "high". Restoring that through
    ``set_float32_matmul_precision("high")`` also set the CPU's oneDNN matmuls to "tf32", so
    the user's CPU matmuls after the section ran in TF32 where oneDNN has it (and dpfy's own
    row probe coarsened its CPU tolerance). Every flag must read as before the section."""
    backends = fp32_precision_api
    backends.cuda.matmul.allow_tf32 = True
    try:
        before = (backends.mkldnn.matmul.fp32_precision, backends.cuda.matmul.fp32_precision)
        assert before == ("none", "tf32") and torch.get_float32_matmul_precision() == "high"
        with full_precision():
            assert backends.cuda.matmul.fp32_precision == "ieee"
        assert (backends.mkldnn.matmul.fp32_precision, backends.cuda.matmul.fp32_precision) == (
            before
        )
        assert backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "high"
    finally:
        backends.cuda.matmul.allow_tf32 = False


def test_full_precision_holds_while_another_thread_is_still_inside(precision):
    """The flags are process-wide. Thread A enters (TF32 allowed: it switches it off), thread
    B enters (finds it off: nothing to restore), A leaves and restores TF32 while B is still
    computing its norms and sums: B's would run in TF32 and a clipped contribution could
    exceed C (two private models trained in threads, or a served model's step). The flags
    are switched off by the first thread to enter and restored by the last to leave."""
    import threading

    precision("high")
    a_inside, a_left, seen = threading.Event(), threading.Event(), []

    def thread_a():
        with full_precision():
            a_inside.set()
            b_inside.wait(10)
        a_left.set()

    def thread_b():
        a_inside.wait(10)
        with full_precision():
            b_inside.set()
            a_left.wait(10)
            seen.append(torch.backends.cuda.matmul.fp32_precision)

    b_inside = threading.Event()
    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == ["ieee"]  # B still in float32 after A left
    assert torch.get_float32_matmul_precision() == "high"  # restored once both left
