"""Benchmark (not a test; no GPU needed): what dpfy's Triton kernels compile to for NVIDIA GPUs.

Each kernel variant dpfy launches on a GPU is compiled ahead of time for sm_90 (H100/H200) and
sm_80 (A100) with Triton's own compiler and its bundled ``ptxas``, on this machine, without a GPU;
the table gives what ``ptxas -v`` reports for the cubin (registers per thread, spill stores and
loads, stack frame), the shared memory and warps Triton chose, the PTX and SASS sizes and the
compile time (cold: a fresh Triton cache). It says whether a kernel compiles and what it costs in
registers (occupancy); not whether it is correct or how fast it runs on the device.

The variants are not a hand-kept list: :func:`launches` runs dpfy's real launch sites
(:func:`dpfy.noise.triton_noise.chacha_axpy_`, ``chacha_words``, ``gaussian_from_words``,
:class:`dpfy.native.word_sums.WordSums`) on CPU (and meta) tensors with the kernels swapped for
recorders, and :func:`compile_launch` hands what was recorded to Triton's own argument binder
(types, ``do_not_specialize``, pointer alignment, options such as ``num_warps`` and
``enable_fp_fusion``), as a launch on the device would. The test
tests/native/test_triton_compiles_for_cuda.py uses the same two functions.

    .venv/bin/python benchmarks/triton_cuda_resources.py [--arch 90 80] [--smoke]
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import torch

from _smoke import HELP, SKIPPED, SMOKE, require

KERNEL_MODULES = ("dpfy.noise._chacha_triton", "dpfy.native._word_sums_triton")
ARCHS = (90, 80)  # sm_90: H100/H200; sm_80: A100


def cuda_compiler_missing() -> str | None:
    """Why kernels cannot be compiled for CUDA here (None when they can): Triton, its NVIDIA
    backend or its bundled ptxas absent."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError as err:
        return f"triton's nvidia backend cannot be imported ({err})"
    for arch in ARCHS:
        try:
            path = get_ptxas(arch).path
        except Exception as err:  # noqa: BLE001 - whatever Triton raises for a missing tool
            return f"triton's ptxas for sm_{arch} is missing ({err})"
        if not Path(path).is_file():
            return f"triton's ptxas for sm_{arch} is missing ({path})"
    return None


def compiled_module(name: str) -> ModuleType:
    """A private copy of kernel module ``name`` decorated for compilation (``triton.jit``
    functions, not the interpreter's), whatever ``TRITON_INTERPRET`` says; the environment and
    :func:`dpfy.native.triton_support.kernel_module`'s modules are left as they were."""
    import triton

    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    with triton.knobs.runtime.scope():  # restores the knob and TRITON_INTERPRET on exit
        triton.knobs.runtime.interpret = False
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


@dataclass
class Launch:
    """One kernel launch as a launch site made it: the kernel and its arguments."""

    label: str
    kernel: Any  # triton.runtime.jit.JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class _Recorder:
    """Stands for a kernel: ``kernel[grid](*args, **kwargs)`` records the launch, runs nothing."""

    def __init__(self, kernel: Any, log: list[tuple[Any, tuple[Any, ...], dict[str, Any]]]):
        self.kernel, self.log = kernel, log

    def __getitem__(self, grid: object) -> Any:
        return lambda *args, **kwargs: self.log.append((self.kernel, args, kwargs))


def _recording(mod: ModuleType, log: list[Any]) -> SimpleNamespace:
    from triton.runtime.jit import JITFunction

    return SimpleNamespace(
        **{k: _Recorder(v, log) if isinstance(v, JITFunction) else v for k, v in vars(mod).items()}
    )


def launches() -> list[Launch]:
    """Every kernel variant dpfy launches on a GPU, as its launch sites launch it: the fused
    noise kernel for each dtype of ``FUSED_DTYPES`` × (x ← a·x + s·z, x ← s·z), a buffer over
    2³¹ values (n an int64) and an unaligned one; the words and transform kernels; the word sums.
    Fails if a public kernel of :data:`KERNEL_MODULES` is launched by none of them."""
    from triton.runtime.jit import JITFunction

    from dpfy.native import word_sums
    from dpfy.noise import triton_noise

    mods = {name: compiled_module(name) for name in KERNEL_MODULES}
    log: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    fakes = {name: _recording(mod, log) for name, mod in mods.items()}
    out: list[Launch] = []

    def record(label: str, call: Any, *args: Any, **kwargs: Any) -> None:
        start = len(log)
        call(*args, **kwargs)
        assert len(log) == start + 1, f"{label}: {len(log) - start} launches recorded, not 1"
        out.append(Launch(label, *log[-1]))

    key = torch.zeros(8, dtype=torch.int32)
    axpy = triton_noise.chacha_axpy_
    with (
        mock.patch.object(triton_noise, "kernel_module", fakes.__getitem__),
        mock.patch.object(word_sums, "kernel_module", fakes.__getitem__),
        mock.patch.object(word_sums, "word_sums_available", lambda device: True),
    ):
        for dtype in triton_noise.FUSED_DTYPES:
            name = str(dtype).removeprefix("torch.")
            for wo in (False, True):
                x = torch.zeros(1536, dtype=dtype)
                mode = "x <- s*z" if wo else "x <- a*x + s*z"
                record(f"noise {name} {mode}", axpy, x, key, 0, 0, 0.5, 1.0, write_only=wo)
        big = torch.empty(1 << 31, device="meta")  # n ≥ 2³¹: an int64 argument
        record("noise float32 n >= 2^31", axpy, big, key, 0, 0, 1.0, 1.0)
        odd = torch.zeros(1537)[1:]  # not 16-byte aligned: no alignment specialization
        record("noise float32 unaligned", axpy, odd, key, 0, 0, 1.0, 1.0)
        record("chacha words", triton_noise.chacha_words, key, 0, 0, 3)
        record("chacha words n >= 2^31", _words_at_least_2_31, triton_noise, key)
        for g in (1, 3, 16):  # Triton specializes an int of 1 and a multiple of 16
            w = torch.zeros(g, 3, 256, dtype=torch.int32)
            record(f"gaussian from words G={g}", triton_noise.gaussian_from_words, w)
        record("word sums", word_sums.WordSums([torch.zeros(4)]).__call__)
    launched = {launch.kernel.__name__ for launch in out}
    for mod in mods.values():
        for k, v in vars(mod).items():
            if isinstance(v, JITFunction) and not k.startswith("_"):
                assert k in launched, f"kernel {k} of {mod.__name__} is launched by no site here"
    return out


def _words_at_least_2_31(triton_noise: ModuleType, key: torch.Tensor) -> None:
    """``chacha_words`` for 2³¹ blocks, its output allocated on the meta device (no memory)."""
    real_empty = torch.empty
    with mock.patch.object(
        torch, "empty", lambda *s, **kw: real_empty(*s, **{**kw, "device": "meta"})
    ):
        triton_noise.chacha_words(key, 0, 0, 1 << 31)


@dataclass
class Compiled:
    """A launch compiled for one target: the kernel Triton made and what ptxas says of it."""

    kernel: Any  # triton.compiler.CompiledKernel
    seconds: float
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    ptxas_log: str

    @property
    def ptx_lines(self) -> int:
        return len(self.kernel.asm["ptx"].splitlines())


def compile_launch(launch: Launch, arch: int) -> Compiled:
    """``launch`` compiled for ``sm_{arch}`` to cubin, as the launch would compile it on such a
    device (the same binder, options and stages), then its PTX assembled again by Triton's ptxas
    with Triton's flags and ``-v`` for the register and spill counts Triton does not keep."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.kernel
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, launch.kwargs, bound, specialization, options
    )
    started = time.perf_counter()
    kernel = triton.compile(
        ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__
    )
    seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(kernel.asm["ptx"])
        fmad = [] if kernel.metadata.enable_fp_fusion else ["--fmad=false"]
        cmd = [get_ptxas(arch).path, "-lineinfo", *fmad, "-v", "--regAllocOptLevel=2"]
        cmd += [f"--gpu-name={sm_arch_from_capability(arch)}", str(ptx), "-o", str(ptx) + ".o"]
        log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr

    def number(pattern: str) -> int:
        found = re.search(pattern, log)
        assert found, f"ptxas -v printed no {pattern!r}:\n{log}"
        return int(found.group(1))

    return Compiled(
        kernel,
        seconds,
        registers=number(r"Used (\d+) registers"),
        spill_stores=number(r"(\d+) bytes spill stores"),
        spill_loads=number(r"(\d+) bytes spill loads"),
        stack=number(r"(\d+) bytes stack frame"),
        ptxas_log=log,
    )


def sass_instructions(kernel: Any) -> int:
    """Instructions in the cubin's SASS (nvdisasm), NOPs not counted."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run(
            [knobs.nvidia.nvdisasm.path, "-c", str(path)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    return sum(1 for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/\s+(?!NOP)", line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90] if SMOKE else list(ARCHS))
    parser.add_argument("--smoke", action="store_true", help=HELP)
    args = parser.parse_args()
    require("triton")
    missing = cuda_compiler_missing()
    if missing:
        if SMOKE:
            print(f"{SKIPPED} {missing}")
            return
        raise SystemExit(missing)
    import triton
    from triton import knobs

    todo = launches()
    if SMOKE:  # one variant of each kernel
        firsts: dict[str, Launch] = {}
        for launch in todo:
            firsts.setdefault(launch.kernel.__name__, launch)
        todo = list(firsts.values())
    print(
        f"dpfy's Triton kernels compiled for CUDA on this machine without a GPU (triton "
        f"{triton.__version__}, ptxas {Path(knobs.nvidia.ptxas_blackwell.path).name} for sm_90, "
        f"{Path(knobs.nvidia.ptxas.path).name} for sm_80; cold cache)"
    )
    print(
        "\n| kernel | variant | arch | warps | regs/thread | spill st/ld B | stack B | shared B "
        "| PTX lines | SASS instrs | compile s |"
    )
    print("|---|---|---|" + "---:|" * 8)
    with tempfile.TemporaryDirectory() as cache, knobs.cache.scope():
        knobs.cache.dir = cache  # cold compiles, and nothing left in the user's cache
        for launch in todo:
            for arch in args.arch:
                c = compile_launch(launch, arch)
                meta = c.kernel.metadata
                print(
                    f"| {launch.kernel.__name__} | {launch.label} | sm_{arch} | {meta.num_warps} "
                    f"| {c.registers} | {c.spill_stores}/{c.spill_loads} | {c.stack} "
                    f"| {meta.shared} | {c.ptx_lines} | {sass_instructions(c.kernel)} "
                    f"| {c.seconds:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
