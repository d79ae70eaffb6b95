"""Benchmark (not a test): Gaussians per second of each noise backend on this machine's devices.

CPU: dpfy's compiled C ChaCha20 sampler (the CPU default) and ``torch.randn`` (the yardstick:
Mersenne Twister, tails cut at 5.77σ, used nowhere in dpfy). CUDA, when present: the fused
Triton kernel (ChaCha20 + Box–Muller in one launch, dpfy's GPU default with Triton installed;
the seeded mode is the same kernel on another key), ChaCha20 in torch tensor operations (the
GPU path without Triton) and ``torch.randn`` (Philox, tails cut). Each row draws ``--draw``
float32 values into one buffer (the flat buffer of a step's noise); the table gives the median
and the best of ``--rounds`` timed rounds after one warm-up, CUDA rounds synchronized. The
last rows time ``NoiseSource.noisy_mean`` on a flat buffer of BERT-base's size (110M).

With ``--interpret`` (or under ``--smoke``) it also runs the Triton kernel on the CPU through
Triton's interpreter (``TRITON_INTERPRET=1``): numpy, orders of magnitude slower than any real
backend; it shows the wiring runs, not a speed.

    .venv/bin/python benchmarks/noise_throughput.py [--draw 16777216] [--rounds 10] [--smoke]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from typing import Callable

import torch

from _smoke import HELP, SMOKE, size
from dpfy.native.gaussian import ChaChaGaussian
from dpfy.noise import NoiseSource
from dpfy.noise.device_gaussian import DeviceChaChaGaussian
from _machine import cpu_name

BERT_BASE = 110_000_000  # parameters of BERT-base: one step's noise


def rows(draw: int, interpret: bool) -> dict[str, tuple[str, int, Callable[[], object]]]:
    """name → (device, values per call, the call)."""
    buf = torch.empty(draw)
    c_chacha = ChaChaGaussian()
    out: dict[str, tuple[str, int, Callable[[], object]]] = {
        "C ChaCha20 sampler (CPU default)": ("cpu", draw, lambda: c_chacha.axpy_(buf, 0.0, 1.0)),
        "torch.randn (CPU, tails cut at 5.77σ)": ("cpu", draw, lambda: torch.randn(draw)),
    }
    have_triton = importlib.util.find_spec("triton") is not None
    if interpret and have_triton:
        os.environ["TRITON_INTERPRET"] = "1"
        from dpfy.noise.triton_noise import TritonChaChaGaussian

        small = min(draw, 1 << 16)
        stream = TritonChaChaGaussian("cpu")
        out["Triton kernel, interpreted (CPU, wiring only)"] = (
            "cpu", small, lambda: stream.normal(small))  # fmt: skip
    if torch.cuda.is_available():
        gpu = torch.empty(draw, device="cuda")
        torch_chacha = DeviceChaChaGaussian("cuda")
        out["torch ChaCha20 ops (CUDA, no Triton)"] = (
            "cuda", draw, lambda: torch_chacha.normal(draw))  # fmt: skip
        out["torch.randn (CUDA Philox, tails cut)"] = (
            "cuda", draw, lambda: torch.randn(draw, device="cuda"))  # fmt: skip
        if have_triton:
            from dpfy.noise.triton_noise import TritonChaChaGaussian

            fused = TritonChaChaGaussian("cuda")
            out["Triton fused ChaCha20 (CUDA default)"] = (
                "cuda", draw, lambda: fused.axpy_(gpu, 0.0, 1.0))  # fmt: skip
        flat = torch.zeros(size(BERT_BASE, 1 << 16), device="cuda")
        for name, src in (("secure", NoiseSource()), ("seed=0", NoiseSource(0))):
            out[f"noisy_mean {name}, {flat.numel():,} params ({src.generator_for('cuda')})"] = (
                "cuda", flat.numel(), lambda s=src: s.noisy_mean(flat, 1.0, 256.0))  # fmt: skip
    return out


def timed(device: str, fn: Callable[[], object]) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draw", type=int, default=size(1 << 24, 1 << 12))
    parser.add_argument("--rounds", type=int, default=size(10, 1))
    parser.add_argument("--interpret", action="store_true", help="time the interpreted kernel")
    parser.add_argument("--smoke", action="store_true", help=HELP)
    args = parser.parse_args()
    where = cpu_name()
    if torch.cuda.is_available():
        where += f"; CUDA: {torch.cuda.get_device_name()}"
    print(f"noise throughput on {where} (torch {torch.__version__}, {torch.get_num_threads()} "
          f"CPU threads), {args.draw:,} values per call, {args.rounds} rounds")  # fmt: skip
    print("\n| backend | device | values/call | median G/s | best G/s |\n|---|---|---:|---:|---:|")
    for name, (device, n, fn) in rows(args.draw, args.interpret or SMOKE).items():
        fn()  # warm-up: compilation, first-use key setup
        times = [timed(device, fn) for _ in range(args.rounds)]
        med, best = n / statistics.median(times) / 1e9, n / min(times) / 1e9
        print(f"| {name} | {device} | {n:,} | {med:.3g} | {best:.3g} |")


if __name__ == "__main__":
    main()
