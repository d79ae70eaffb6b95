"""The step on every available device (issue 29 §1, §3, §4): ``cpu`` always, ``cuda`` where
torch sees a GPU (the ``device`` fixture of conftest.py; ``benchmarks/gpu.py`` runs the CUDA
ones on a GPU machine).

* the engine against the float64 per-example loop (``oracles.py``), on the device;
* the noise generator's statistics on the device (secure and seeded);
* the sensitivity checks refusing on the device;
* a small end-to-end run on the device, and its checkpoint resumed on the CPU;
* mixed precision: per-example norms and clipped sums under bf16/fp16 autocast against fp32
  within a tolerance derived below, accumulated in float32; GradScaler refused by name;
* (CPU only) every tensor the step creates follows the parameters' device: the step runs with
  torch's default device set to ``meta``, so a tensor created without ``device=`` lands on
  ``meta`` and the first operation that meets a parameter (or a host read of it) raises.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import Method
from dpfy.errors import PrivacyRefusal
from dpfy.grads import GradEngine
from dpfy.memory import default_memory_limit
from dpfy.noise import NoiseSource
from dpfy.step.sums import check_bound
from dpfy.types import Clip
from device_index import indexed_device, same_device
from model_cases import make_data, make_model
from oracles import clipped_sum, per_example_grads, per_example_norms


def _data(n=48, d=6, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)
    )


def _mlp(d=6, classes=3):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d, 8), nn.Tanh(), nn.Linear(8, classes))


# -- the engine against the float64 loop ---------------------------------------------------------
@pytest.mark.parametrize("name", ["mlp", "cnn", "encoder"])
def test_engine_norms_and_clipped_sum_match_the_float64_loop_on_the_device(
    device, name, monkeypatch
):
    """In float32: the tolerances below are float32's. cuDNN's TF32, on by default for a GPU's
    convolutions, moves the tanh CNN's norms by about 2.3e-4 relative (measured on a GPU, and
    2.5e-4 with TF32 emulated on the CPU) and its clipped sums by a few 2⁻¹¹ of Σ_i n_i, beyond
    rtol = 1e-4; what TF32 does to the step is tests/grads/test_arithmetic_tolerance.py's."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    model = make_model(name).to(device)
    x, y = make_data(name, 8).tensors
    x, y = x.to(device), y.to(device)
    ref = per_example_grads(model, x, y, lambda o, t: F.cross_entropy(o, t, reduction="sum"))
    ref_norms = per_example_norms(ref)
    clip = float(ref_norms.median())  # about half the examples clipped
    eng = GradEngine(model, loss_reduction="mean")
    F.cross_entropy(model(x), y).backward()
    sq = eng.per_sample_sq_norms()
    assert all(same_device(s.device, device) for s in sq.values())
    norms = torch.sqrt(sum(sq.values()))
    torch.testing.assert_close(norms.double(), ref_norms, rtol=1e-4, atol=1e-6)
    w = torch.clamp(clip / norms, max=1.0)
    sums = eng.weighted_sums({n: w for n in sq})
    want = clipped_sum(ref, clip)
    for n, s in sums.items():
        assert same_device(s.device, device) and s.dtype == torch.float32
        torch.testing.assert_close(s.double(), want[n], rtol=1e-4, atol=1e-5)
    eng.detach()


# -- noise statistics ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [None, 0], ids=["secure", "seeded"])
def test_noise_on_the_device_has_the_gaussian_mean_variance_and_tails(device, seed):
    """n draws of N(0, σ²) on the device: the sample mean within 5 standard errors (σ/√n), the
    sample variance within 5·σ²·√(2/(n−1)) of σ², and the share beyond 3σ (p = 0.0026998,
    Φ(−3)·2) within 5 binomial standard errors: a correct generator fails each with
    probability < 1e-6."""
    n, sigma = 200_000, 2.5
    like = torch.zeros(n, device=device)
    z = NoiseSource(seed).gaussian(like, sigma)
    assert same_device(z.device, device) and z.dtype == torch.float32
    z = z.double().cpu()
    assert abs(float(z.mean())) < 5 * sigma / math.sqrt(n)
    assert abs(float(z.var()) - sigma**2) < 5 * sigma**2 * math.sqrt(2 / (n - 1))
    p = math.erfc(3 / math.sqrt(2))
    share = float((z.abs() > 3 * sigma).double().mean())
    assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_noisy_mean_stays_on_the_device_and_in_the_sum_dtype(device):
    total = torch.ones(1000, device=device)
    out = NoiseSource(None).noisy_mean(total.clone(), 1.0, 10.0)
    assert same_device(out.device, device) and out.dtype == torch.float32
    assert abs(float(out.mean()) - 0.1) < 5 * 0.1 / math.sqrt(1000)  # std σ/b = 0.1


# -- sensitivity checks --------------------------------------------------------------------------
class _DoubleWeights(Method):
    """Claims sensitivity C but weighs each example 2·min(1, C/‖g‖): norm up to 2C."""

    def clipping(self, state, norms, plan):
        return Clip(2 * torch.clamp(plan.clip / norms.total, max=1.0), sensitivity=plan.clip)


def test_check_bound_refuses_on_the_device(device):
    ok = torch.tensor([0.25, 1.0], device=device)  # ‖·‖² per example: norms 0.5 and 1
    check_bound(ok, 1.0, what="the sum", owner="a test")
    with pytest.raises(PrivacyRefusal, match="within its declared sensitivity"):
        check_bound(ok * 1.1, 1.0, what="the sum", owner="a test")
    with pytest.raises(PrivacyRefusal, match="not finite"):
        check_bound(torch.tensor([float("nan")], device=device), 1.0, what="s", owner="t")


def test_weights_above_their_sensitivity_are_refused_on_the_device(device):
    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = dpfy.make_private(
        model,
        opt,
        DataLoader(_data(), batch_size=12),
        noise_multiplier=1.0,
        max_grad_norm=1e-3,
        method=_DoubleWeights(),
        seed=0,
    )
    x, y = next(iter(dl))
    F.cross_entropy(model(x.to(device)), y.to(device)).backward()
    with pytest.raises(PrivacyRefusal, match="nothing of this step was released"):
        opt.step()
    assert opt.ledger.num_steps == 0


# -- end to end, and a checkpoint resumed on the CPU ----------------------------------------------
def _train(model, opt, dl, device, steps=None):
    done = 0
    for x, y in dl:
        opt.zero_grad()
        F.cross_entropy(model(x.to(device)), y.to(device)).backward()
        opt.step()
        done += 1
        if steps is not None and done == steps:
            break
    return done


@pytest.mark.parametrize("clipping", ["flat", "per_layer", "automatic"])
def test_a_small_run_trains_on_the_device(device, clipping):
    model = _mlp().to(device)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    model, opt, dl = dpfy.make_private(
        model,
        opt,
        DataLoader(_data(), batch_size=12),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        clipping=clipping,
        max_physical_batch_size=8,
    )  # secure noise (seed=None), logical batches split into physical ones
    steps = _train(model, opt, dl, device)
    assert steps >= opt.ledger.num_steps > 0
    for p, b in zip(model.parameters(), before):
        assert same_device(p.device, device) and p.grad is not None
        assert same_device(p.grad.device, device)
        assert not torch.equal(p.detach(), b)
    assert math.isfinite(opt.last_step_info["mean_grad_norm_nonprivate"])
    assert 0 < opt.epsilon(1e-5) < math.inf


def test_a_checkpoint_saved_on_the_device_resumes_on_the_cpu(device):
    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = dpfy.make_private(
        model, opt, DataLoader(_data(), batch_size=12), noise_multiplier=1.0, seed=0
    )
    _train(model, opt, dl, device, steps=2)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, map_location="cpu", weights_only=False)  # device-independent

    cpu_model = _mlp()
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    cpu_model, cpu_opt, cpu_dl = dpfy.make_private(
        cpu_model, cpu_opt, DataLoader(_data(), batch_size=12), noise_multiplier=1.0, seed=0
    )
    cpu_model.load_state_dict(ckpt["model"])
    cpu_opt.load_state_dict(ckpt["optimizer"])
    assert cpu_opt.ledger.num_steps == opt.ledger.num_steps
    _train(cpu_model, cpu_opt, cpu_dl, torch.device("cpu"), steps=1)
    assert cpu_opt.ledger.num_steps == opt.ledger.num_steps + 1


def test_the_memory_limit_is_the_devices(device):
    limit = default_memory_limit(device)
    if device.type == "cuda":
        assert limit == torch.cuda.mem_get_info(device)[0] // 2
    else:
        assert limit == default_memory_limit()
    assert limit > 0


# -- mixed precision -----------------------------------------------------------------------------
# Unit roundoff u of each autocast dtype (half the spacing at 1: 2^-8 with bfloat16's 8-bit
# significand, 2^-11 with float16's 11-bit one).
_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# Roundings on the path from the input to a per-example gradient of the two-layer model
# Linear → Tanh → Linear under autocast (first order, each a relative error ≤ u): the casts
# of x, W1 and W2 (3), the two matmul outputs (2), the output gradient's cast (1), the
# backward matmul to the hidden layer (1) and the hidden activation the engine reads (1).
_ROUNDINGS = 8


def _autocast_dtypes(device):
    yield torch.bfloat16
    if device.type == "cuda":
        yield torch.float16


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_autocast_norms_and_clipped_sum_are_float32_and_within_the_derived_tolerance(
    device, dtype_name
):
    """Per-example norms n_i and the clipped sum S = Σ_i clip_C(g_i) under autocast, against
    the float64 loop without it. Each per-example gradient carries a relative error of at
    most k·u (k = 8 roundings, first order), so |n_i − n_i*| ≤ k·u·n_i*; clipping is the
    projection onto the ball of radius C, which is 1-Lipschitz, so
    ‖S − S*‖ ≤ Σ_i ‖g_i − g_i*‖ ≤ k·u·Σ_i n_i*. The engine accumulates in float32, so its own
    error (~1e-7 relative) is far inside either bound."""
    dtype = getattr(torch, dtype_name)
    if dtype not in set(_autocast_dtypes(device)):
        pytest.skip(f"{dtype_name} autocast is checked on CUDA only")
    tol = _ROUNDINGS * _ROUNDOFF[dtype]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 5)).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, 20, generator=g).to(device)
    y = torch.randint(0, 5, (24,), generator=g).to(device)
    ref = per_example_grads(model, x, y, lambda o, t: F.cross_entropy(o, t, reduction="sum"))
    ref_norms = per_example_norms(ref)
    clip = float(ref_norms.median())
    eng = GradEngine(model, loss_reduction="mean")
    with torch.autocast(device.type, dtype=dtype):
        out = model(x)
        assert out.dtype == dtype  # autocast is on
        loss = F.cross_entropy(out, y)
    loss.backward()
    sq = eng.per_sample_sq_norms()
    assert all(s.dtype == torch.float32 for s in sq.values())
    norms = torch.sqrt(sum(sq.values()))
    assert float(((norms.double() - ref_norms).abs() / ref_norms).max()) <= tol
    sums = eng.weighted_sums({n: torch.clamp(clip / norms, max=1.0) for n in sq})
    want = clipped_sum(ref, clip)
    assert all(s.dtype == torch.float32 for s in sums.values())
    err = math.sqrt(sum(float((sums[n].double() - want[n]).square().sum()) for n in sums))
    assert err <= tol * float(ref_norms.sum())
    eng.detach()


def test_a_private_run_under_bf16_autocast_trains(device):
    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt, dl = dpfy.make_private(
        model, opt, DataLoader(_data(), batch_size=12), noise_multiplier=1.0
    )
    for x, y in dl:
        opt.zero_grad()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
    assert opt.ledger.num_steps > 0
    assert all(
        p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters()
    )


def test_a_gradscaler_driven_step_is_refused_naming_the_fix(device):
    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt, dl = dpfy.make_private(
        model, opt, DataLoader(_data(), batch_size=12), noise_multiplier=1.0, seed=0
    )
    scaler = torch.amp.GradScaler(device.type)
    x, y = next(iter(dl))
    scaler.scale(F.cross_entropy(model(x.to(device)), y.to(device))).backward()
    with pytest.raises(PrivacyRefusal, match="GradScaler.*bfloat16 autocast"):
        scaler.step(opt)
    assert opt.ledger.num_steps == 0
    for attr in ("grad_scale", "found_inf"):  # what the scaler left on the optimizer
        opt.__dict__.pop(attr, None)
    _train(model, opt, dl, device, steps=1)  # without the scaler the batch is taken again
    assert opt.ledger.num_steps == 1


# -- every tensor of the step follows the parameters' device (CPU only) -------------------------
_CONFIGS = {
    "flat, secure": {},
    "flat, seeded": {"seed": 0},
    "per_layer": {"clipping": "per_layer"},
    "automatic": {"clipping": "automatic"},
    "split logical batch": {"max_physical_batch_size": 5},
    "quantile": {"method": "quantile"},
    "oso": {"method": "oso"},
    "adaclip": {"method": "adaclip"},
    "user-level": {"user_ids": torch.arange(48) // 3, "user_sampling": "uls"},
    "individual": {"clipping": "individual", "max_grad_norm": [1.0] * 48},
}


# The step takes another route with torch on one intra-op thread: the Linear rule's sequence
# norms (the encoder's layers, and user-level runs, which pack each user's examples as a
# sequence) go through the compiled kernel of dpfy/native/ghost_norm.c on an AVX-512 CPU. Its
# output buffers were made by a bare torch.empty, so under the meta default device the C code
# wrote through a null pointer and killed the process (issue 35 §1: the xdist worker crashed
# on these cases only after an earlier test had left torch on one thread). Both thread counts
# run here, so neither route depends on what ran before (conftest also restores the count).
_ONE_THREAD = ("flat, secure", "user-level")


def _meta_cases():
    """Every configuration on the MLP; on the encoder (embedding, attention, layer norms) the
    default one in the quick run and the others marked slow (≈ 5 s each here); the
    configurations of ``_ONE_THREAD`` also with torch on one thread."""
    for name, c in _CONFIGS.items():
        values, marks = (c.values, list(c.marks)) if not isinstance(c, dict) else ((c,), [])
        slow = [] if name == "flat, secure" else [pytest.mark.slow]
        for threads in (None, 1) if name in _ONE_THREAD else (None,):
            tail = "" if threads is None else ", 1 thread"
            yield pytest.param(*values, "mlp", threads, marks=marks, id=f"{name}{tail}-mlp")
            yield pytest.param(
                *values, "encoder", threads, marks=marks + slow, id=f"{name}{tail}-encoder"
            )


@pytest.mark.parametrize("kwargs, model_name, threads", list(_meta_cases()))
def test_no_tensor_of_the_step_is_created_off_the_parameters_device(
    kwargs, model_name, threads, request
):
    """The forward, backward and private step run with torch's default device set to
    ``meta``: a tensor the engine, clipping, sums, noise or a method create without an
    explicit ``device=`` lands on ``meta`` and fails the step as soon as it meets a CPU
    parameter (as a CPU tensor would on a GPU). The loader and sampler run outside (their
    index tensors live on the host by design). ``threads=1``: torch on one intra-op thread,
    where the compiled ghost-norm kernel serves the sequence norms (AVX-512 CPUs)."""
    if threads is not None:
        restore = torch.get_num_threads()
        torch.set_num_threads(threads)
        request.addfinalizer(lambda: torch.set_num_threads(restore))
    kwargs = dict(kwargs)
    model = make_model(model_name)
    ds = make_data(model_name, 48)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt, dl = dpfy.make_private(
        model, opt, DataLoader(ds, batch_size=12), noise_multiplier=1.0, **kwargs
    )
    before = [p.detach().clone() for p in model.parameters()]
    for i, (x, y) in enumerate(dl):
        with torch.device("meta"):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        if i == 3:
            break
    assert opt.ledger.num_steps >= 1
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert any(not torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))


# -- the CUDA branches' arithmetic, with torch.cuda stubbed (they also run for real on a GPU) ----
def test_the_cuda_memory_limit_is_half_the_free_memory_there(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10_000, 80_000))
    assert default_memory_limit(torch.device("cuda", 0)) == 5_000


def test_the_cuda_peak_is_the_max_allocated_above_the_start(monkeypatch):
    from dpfy.memory import measured_peak_bytes

    level = {"now": 100, "peak": 100}

    def allocate():
        level["peak"] = max(level["peak"], 100 + 700)  # 700 bytes at the step's peak
        level["now"] = 150  # 50 left allocated after it

    for name, fn in {
        "synchronize": lambda device=None: None,
        "reset_peak_memory_stats": lambda device=None: level.update(peak=level["now"]),
        "memory_allocated": lambda device=None: level["now"],
        "max_memory_allocated": lambda device=None: level["peak"],
    }.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    assert measured_peak_bytes(allocate, torch.device("cuda", 0)) == 700


@pytest.mark.parametrize(
    "cuda, nccl, want", [(True, True, "nccl"), (True, False, "gloo"), (False, True, "gloo")]
)
def test_the_default_backend_is_nccl_exactly_where_cuda_and_nccl_are(monkeypatch, cuda, nccl, want):
    import torch.distributed as dist

    from dpfy.step.distributed import default_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)
    assert default_backend() == want


def test_the_compiled_kernels_write_host_memory_under_any_default_device():
    """Every native call writes into buffers made on the CPU explicitly: with torch's default
    device set to ``meta`` the fused ghost norms, the raw words and a fresh ChaCha20 state
    still come back on the CPU with the values drawn outside the context (a bare
    torch.empty there is a meta tensor with a null data pointer, which the C code wrote
    through: a segfault)."""
    from dpfy.native.gaussian import ChaChaGaussian, XoshiroGaussian
    from dpfy.native.ghost_norm import kernel_available, linear_ghost_sq_norms

    g = torch.Generator().manual_seed(0)
    a, grad = torch.randn(3, 5, 4, generator=g), torch.randn(3, 5, 6, generator=g)
    key = bytes(range(32))
    want_words = ChaChaGaussian(key).words(8)
    want_seeded = XoshiroGaussian(7).words(8)
    want_norms = linear_ghost_sq_norms(a, grad) if kernel_available() else None
    with torch.device("meta"):
        assert torch.equal(ChaChaGaussian(key).words(8), want_words)
        assert torch.equal(XoshiroGaussian(7).words(8), want_seeded)
        if want_norms is not None:  # the kernel needs AVX-512 and a C compiler
            got = linear_ghost_sq_norms(a, grad)
            assert all(x.device.type == "cpu" for x in got)
            assert all(torch.equal(x, y) for x, y in zip(got, want_norms))


# -- device comparisons carry the index (issue 36 §7), checked here with torch.cuda stubbed -----
@pytest.mark.parametrize("current", [0, 1])
def test_a_bare_cuda_device_compares_equal_to_its_tensors_indexed_device(monkeypatch, current):
    """A tensor made with ``device="cuda"`` reports ``cuda:<current>``; torch.device("cuda")
    itself is not equal to that, which failed 8 of the 95 CUDA tests on a GPU. The fixture's
    indexed form and ``same_device`` are equal to it, and still tell the two GPUs apart."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    tensor_device = torch.device("cuda", current)  # what t.device reports for device="cuda"
    assert torch.device("cuda") != tensor_device  # the comparison the old fixture made
    assert indexed_device("cuda") == indexed_device(torch.device("cuda")) == tensor_device
    assert same_device("cuda", tensor_device) and same_device(tensor_device, "cuda")
    assert not same_device("cuda", torch.device("cuda", 1 - current))
    assert indexed_device("cuda:1") == torch.device("cuda", 1)  # an explicit index is kept
    assert indexed_device("cpu") == torch.device("cpu") == torch.zeros(1).device
    assert not same_device("cpu", "cuda")
