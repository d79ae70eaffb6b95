"""The GPU check: dpfy's CUDA tests, then step time and peak memory against non-private
training and Opacus 1.6 on the models practitioners train, and the noise generator's speed.

    benchmarks/gpu.sh                        # = python benchmarks/gpu.py, one H100: ≈ 5–8 min
    python benchmarks/gpu.py --smoke         # CPU, tiny sizes, seconds (the test suite runs it)

1. Tests: ``pytest tests/step/test_devices.py tests/grads/test_fingerprint_one_launch.py
   tests/noise/test_device_chacha.py tests/cli/test_device.py -k cuda`` (the guard's one-launch
   fingerprints compiled; the engine against the float64 loop, noise statistics, sensitivity
   refusals, a small run, a checkpoint resumed on the CPU, bf16 and fp16 autocast; ChaCha20 in
   torch operations against RFC 8439 and the compiled sampler on the device; ``dpfy train
   --device cuda`` with its training set held there), in a subprocess; its summary line is
   printed above the table.
2. Step time and peak memory, for each model all rows in ONE process, *interleaved*: each round
   runs the rows in a fresh (seeded) order, each timed step right after one untimed step of the
   same row; the median over rounds is reported. A step is zero_grad + forward + loss +
   backward + optimizer step on one fixed batch already on the device, timed between
   ``torch.cuda.synchronize()`` calls; its gradients and Opacus's per-sample gradients are
   freed after it, so no row holds another's memory. Peak memory: ``max_memory_allocated``
   during one step, minus what was allocated when it started (model, optimizer state and
   batch are not counted for any row).

   Models (built from configs, nothing downloaded): ResNet-18 with GroupNorm at 32×32 (batch
   256 and 1024), a ViT-small-sized encoder (224×224, patch 16, width 384, 12 layers, 6 heads;
   batch 64), BERT-base (sequence classification, batch 32 × 128 tokens) and GPT-2 small
   (causal LM, batch 16 × 256 tokens). Rows: non-private; dpfy's default (secure noise,
   ``seed=None``) and ``seed=0`` (its reproducible generator); Opacus ``hooks`` and ``ghost``,
   each with its default noise and with ``secure_mode=True``. Opacus's secure mode needs the
   ``torchcsprng`` package; where it is missing the row runs Opacus's secure-mode noise
   (its 2n-draw floating-point fix) on torch's generator and says so. A row that fails
   (Opacus refusing a layer, out of memory) is printed with its error instead of numbers.
3. Noise: Gaussians per second of dpfy's secure and seeded generators, torch.randn (Philox on
   CUDA) and Opacus's secure-mode draw, on the device.

It prints one markdown table naming the device.
"""

from __future__ import annotations

import argparse
import math
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import dpfy  # noqa: E402
from dpfy.noise import NoiseSource  # noqa: E402
from _timing import interleaved_medians  # noqa: E402

SIGMA, CLIP, LR = 1.0, 1.0, 1e-3
Step = Callable[[], None]
Loss = Callable[[nn.Module], torch.Tensor]


# -- models -------------------------------------------------------------------------------------
class _Block(nn.Module):
    """ResNet's basic block with GroupNorm (32 groups, or fewer on narrow smoke widths)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.gn1 = nn.GroupNorm(min(32, cout), cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.gn2 = nn.GroupNorm(min(32, cout), cout)
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                          nn.GroupNorm(min(32, cout), cout))
            if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        return F.relu(self.gn2(self.conv2(out)) + self.short(x))


def resnet18_gn(width: int = 64, classes: int = 10) -> nn.Module:
    """ResNet-18 (He et al. 2016) for 32×32 inputs (3×3 stem, no max-pool), GroupNorm in place
    of BatchNorm (per-example gradients need a layer without batch statistics)."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False),
                               nn.GroupNorm(min(32, width), width), nn.ReLU()]
    cin = width
    for i, mult in enumerate((1, 2, 4, 8)):
        cout = width * mult
        layers += [_Block(cin, cout, 1 if i == 0 else 2), _Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class _Logits(nn.Module):
    """A Hugging Face classifier returning its logits (one loss for every row)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_floating_point():
            return self.inner(pixel_values=x).logits
        return self.inner(input_ids=x, **_per_row_ids(x)).logits


def _per_row_ids(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Position (and BERT's segment) ids of shape (B, T), one row per example, for every row:
    HF's default (1, T) buffers are shared by the batch, which Opacus's hooks cannot split
    into per-example gradients."""
    b, t = ids.shape
    pos = torch.arange(t, device=ids.device).expand(b, t)
    return {"position_ids": pos, "token_type_ids": torch.zeros_like(ids)}


def _case(name: str, smoke: bool, shapes: dict[str, int]) -> dict[str, Any]:
    """The model factory, the batch (x, y) and the loss kind of benchmark case ``name``."""
    import transformers

    g = torch.Generator().manual_seed(0)
    if name.startswith("resnet18-gn"):
        b, side = shapes[name], 16 if smoke else 32
        return dict(build=lambda: resnet18_gn(8 if smoke else 64),
                    x=torch.randn(b, 3, side, side, generator=g),
                    y=torch.randint(0, 10, (b,), generator=g), lm=False)
    if name == "vit-small":
        b = shapes[name]
        cfg = (transformers.ViTConfig(image_size=16, patch_size=8, hidden_size=32,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, num_labels=10) if smoke else
               transformers.ViTConfig(image_size=224, patch_size=16, hidden_size=384,
                                      num_hidden_layers=12, num_attention_heads=6,
                                      intermediate_size=1536, num_labels=10))
        return dict(build=lambda: _Logits(transformers.ViTForImageClassification(cfg)),
                    x=torch.randn(b, 3, cfg.image_size, cfg.image_size, generator=g),
                    y=torch.randint(0, 10, (b,), generator=g), lm=False)
    if name == "bert-base":
        b, t = shapes[name], 16 if smoke else 128
        cfg = (transformers.BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64)
               if smoke else transformers.BertConfig())
        cfg.num_labels = 2
        return dict(build=lambda: _Logits(transformers.BertForSequenceClassification(cfg)),
                    x=torch.randint(0, cfg.vocab_size, (b, t), generator=g),
                    y=torch.randint(0, 2, (b,), generator=g), lm=False)
    if name == "gpt2-small":
        b, t = shapes[name], 16 if smoke else 256
        cfg = (transformers.GPT2Config(vocab_size=1000, n_embd=32, n_layer=2, n_head=2,
                                       loss_type="ForCausalLM") if smoke else
               transformers.GPT2Config(loss_type="ForCausalLM"))
        ids = torch.randint(0, cfg.vocab_size, (b, t), generator=g)
        return dict(build=lambda: transformers.GPT2LMHeadModel(cfg), x=ids, y=ids, lm=True)
    raise ValueError(f"model must be one of {list(shapes)}, got model = {name!r}")


# -- rows ---------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _built(case: dict[str, Any], device: torch.device) -> nn.Module:
    torch.manual_seed(0)  # the same weights for every row
    return case["build"]().to(device).train()


def _loss(case: dict[str, Any], x: torch.Tensor, y: torch.Tensor) -> Loss:
    if case["lm"]:  # the model's own causal-LM loss (mean over the batch's tokens)
        pos = _per_row_ids(x)["position_ids"]
        return lambda m: m(input_ids=x, labels=y, position_ids=pos).loss
    return lambda m: F.cross_entropy(m(x), y)


def _stepper(model: nn.Module, opt: Any, loss: Loss, before: Callable[[], None] = lambda: None
             ) -> Step:
    def step() -> None:
        before()
        opt.zero_grad(set_to_none=True)
        loss(model).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)  # free this step's gradients (Opacus: per-sample too)
    return step


def non_private(case: dict[str, Any], device: torch.device, x: Any, y: Any) -> Step:
    model = _built(case, device)
    return _stepper(model, torch.optim.AdamW(model.parameters(), lr=LR), _loss(case, x, y))


def with_dpfy(case: dict[str, Any], device: torch.device, x: Any, y: Any,
              seed: int | None) -> Step:
    model = _built(case, device)
    every = torch.arange(x.shape[0])
    loader = DataLoader(TensorDataset(every), batch_size=len(every))
    model, opt, dl = dpfy.make_private(model, torch.optim.AdamW(model.parameters(), lr=LR),
                                       loader, noise_multiplier=SIGMA, max_grad_norm=CLIP,
                                       seed=seed)
    # as if the private loader had yielded this batch (its batch guard binds the rows)
    return _stepper(model, opt, _loss(case, x, y), lambda: dl.cursor.advance(every, True))


def with_opacus(case: dict[str, Any], device: torch.device, x: Any, y: Any, mode: str,
                secure: bool) -> tuple[Step, str]:
    """An Opacus 1.6 row and a note (what secure mode ran on)."""
    from opacus import PrivacyEngine

    note = ""
    try:
        engine = PrivacyEngine(secure_mode=secure)
    except ImportError:  # torchcsprng absent: the secure-mode noise on torch's generator
        engine, note = PrivacyEngine(), "secure_mode noise on torch's RNG (no torchcsprng)"
    model = _built(case, device)
    loader = DataLoader(TensorDataset(x.cpu(), y.cpu()), batch_size=x.shape[0])
    kwargs: dict[str, Any] = dict(
        module=model, optimizer=torch.optim.AdamW(model.parameters(), lr=LR),
        data_loader=loader, noise_multiplier=SIGMA, max_grad_norm=CLIP,
        grad_sample_mode=mode, poisson_sampling=False)
    if mode == "ghost":
        model, opt, crit, _ = engine.make_private(criterion=nn.CrossEntropyLoss(), **kwargs)
        if case["lm"]:  # one loss per sequence: Opacus's criterion wrapper with its shape
            b, t = x.shape

            def loss(m: nn.Module) -> torch.Tensor:
                logits = m(input_ids=x, position_ids=_per_row_ids(x)["position_ids"]).logits[
                    :, :-1
                ]
                return crit(logits.reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1),
                            shape=(b, t - 1))
        else:
            def loss(m: nn.Module) -> torch.Tensor:
                return crit(m(x), y)
    else:
        model, opt, _ = engine.make_private(**kwargs)
        loss = _loss(case, x, y)
    if secure and note:
        opt.secure_mode = True
    return _stepper(model, opt, loss), note


ROWS = ["non-private", "dpfy (default: secure noise)", "dpfy seed=0",
        "opacus hooks", "opacus hooks secure_mode", "opacus ghost", "opacus ghost secure_mode"]


def _row(name: str, case: dict[str, Any], device: torch.device, x: Any, y: Any
         ) -> tuple[Step, str]:
    if name == "non-private":
        return non_private(case, device, x, y), ""
    if name.startswith("dpfy"):
        return with_dpfy(case, device, x, y, 0 if "seed=0" in name else None), ""
    return with_opacus(case, device, x, y, name.split()[1], name.endswith("secure_mode"))


def _error(e: BaseException) -> str:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "out of memory"
    return f"fails: {type(e).__name__}: {' '.join(str(e).split())[:90]}".replace("|", "/")


def _peak_bytes(step: Step, device: torch.device) -> float:
    if device.type != "cuda":
        return math.nan
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    step()
    _sync(device)
    return float(torch.cuda.max_memory_allocated(device) - start)


def bench(name: str, case: dict[str, Any], device: torch.device, rounds: int,
          rows: list[str]) -> list[tuple[str, float, float, str]]:
    """(row, median step s, peak bytes, note or error) per row, interleaved over rounds."""
    x, y = case["x"].to(device), case["y"].to(device)  # the batch, moved once
    steps: dict[str, Step] = {}
    notes: dict[str, str] = {}
    for r in rows:
        try:
            steps[r], notes[r] = _row(r, case, device, x, y)
            for _ in range(2):  # warm-up (kernels, allocator, dpfy's first-step probes)
                steps[r]()
        except Exception as e:  # noqa: BLE001 - the row is reported with its error
            steps.pop(r, None)
            notes[r] = _error(e)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    def synced() -> float:  # the clock read once the device has finished what was queued
        _sync(device)
        return time.perf_counter()

    medians = interleaved_medians(steps, rounds, warm=0, clock=synced)  # warmed above
    peaks = {r: _peak_bytes(s, device) for r, s in steps.items()}
    out = [(r, medians.get(r, math.nan), peaks.get(r, math.nan), notes[r]) for r in rows]
    del steps
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


# -- noise --------------------------------------------------------------------------------------
def noise_rates(device: torch.device, n: int, reps: int = 3) -> list[tuple[str, float]]:
    """Gaussians per second of each generator filling an n-element float32 tensor."""
    like = torch.empty(n, device=device)
    sources: dict[str, Callable[[], Any]] = {}
    secure, seeded = NoiseSource(None), NoiseSource(0)
    sources[f"dpfy secure ({secure.backend})"] = lambda: secure.gaussian(like, 1.0)
    sources[f"dpfy seed=0 ({seeded.backend})"] = lambda: seeded.gaussian(like, 1.0)
    sources["torch.randn"] = lambda: torch.randn(n, device=device)
    try:
        from opacus.optimizers.optimizer import _generate_noise
        sources["opacus secure_mode draw"] = lambda: _generate_noise(1.0, like, None, True)
    except ImportError:
        pass
    rates = []
    for label, draw in sources.items():
        draw()
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            draw()
        _sync(device)
        rates.append((label, reps * n / (time.perf_counter() - t0)))
    return rates


# -- the tests ----------------------------------------------------------------------------------
def cuda_tests() -> str:
    """Run the device-parametrized tests on CUDA; their pytest summary line."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q",
         "-m", "not slow or slow", "-k", "cuda", "tests/step/test_devices.py",
         "tests/grads/test_fingerprint_one_launch.py", "tests/noise/test_device_chacha.py",
         "tests/cli/test_device.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")})
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    if done.returncode != 0:
        print(done.stdout[-6000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
    return lines[-1].strip("= ") if lines else f"pytest exited {done.returncode}"


# -- main ---------------------------------------------------------------------------------------
SHAPES = {"resnet18-gn b256": 256, "resnet18-gn b1024": 1024, "vit-small": 64,
          "bert-base": 32, "gpt2-small": 16}
SMOKE_SHAPES = {"resnet18-gn b256": 4, "resnet18-gn b1024": 8, "vit-small": 4,
                "bert-base": 4, "gpt2-small": 4}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, tiny models and batches, 1 round, no tests: seconds")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--noise-elements", type=int, default=1 << 26)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    smoke = args.smoke
    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    rounds = 1 if smoke else args.rounds
    if smoke:
        torch.set_num_threads(1)  # tiny tensors: threads only contend on a shared machine
    shapes = SMOKE_SHAPES if smoke else SHAPES
    tests = "skipped" if smoke or args.skip_tests else cuda_tests()
    if device.type != "cuda" and not smoke:
        print("no CUDA device: the numbers below are the CPU's", file=sys.stderr)
    import opacus

    print(f"device: {_device_name(device)}; torch {torch.__version__}, opacus "
          f"{opacus.__version__}, dpfy {dpfy.__version__}; rounds {rounds}; "
          f"CUDA tests: {tests}")
    print("| model | batch | row | median step (ms) | time × non-private | peak step memory "
          "(MiB) | memory × non-private | note |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for name in args.models.split(","):
        case = _case(name, smoke, shapes)
        shape = "×".join(str(s) for s in case["x"].shape[:2 if case["x"].dim() == 2 else 1])
        results = bench(name, case, device, rounds, args.rows.split(","))
        base_t = next((t for r, t, _, _ in results if r == "non-private"), math.nan)
        base_m = next((m for r, _, m, _ in results if r == "non-private"), math.nan)
        for r, t, m, note in results:
            cells = [f"{t * 1e3:.1f}", f"{t / base_t:.2f}", f"{m / 2**20:.0f}", f"{m / base_m:.2f}"]
            cells = [c if "nan" not in c else "–" for c in cells]
            print(f"| {name} | {shape} | {r} | {' | '.join(cells)} | {note} |", flush=True)
    n = 1 << 16 if smoke else args.noise_elements
    for label, rate in noise_rates(device, n):
        print(f"| noise generator | {n} | {label} | {n / rate * 1e3:.1f} | | | | "
              f"{rate / 1e6:.0f} M Gaussians/s |", flush=True)


if __name__ == "__main__":
    main()
