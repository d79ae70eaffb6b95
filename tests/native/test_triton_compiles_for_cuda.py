"""dpfy's Triton kernels compile for NVIDIA GPUs (sm_90: H100/H200, sm_80: A100) without a GPU.

The CPU tests run the kernels under Triton's interpreter, which never compiles them; a kernel
that does not lower to PTX, or that ptxas can only fit by spilling registers to local memory,
would first show on a GPU. Here each variant dpfy's launch sites launch is compiled to cubin by
Triton's own compiler and bundled ptxas (``benchmarks/triton_cuda_resources.py``: the launches
are recorded from the real launch sites, then bound and compiled as a launch on the device would
be). What is checked: it compiles, and ptxas reports no spill and no stack frame. Not checked
(no GPU): that the cubin computes the right numbers, or how fast.

The fast tests compile a few variants (the fused noise kernel's two costliest, ~2.5 s each);
``-m slow`` compiles every variant for both targets (~1 min).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _script() -> ModuleType:
    """benchmarks/triton_cuda_resources.py as a module (its ``_smoke`` import needs
    benchmarks/ on the path while it loads; the path is restored after)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(
            "_triton_cuda_resources", BENCHMARKS / "triton_cuda_resources.py"
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses look their module up there
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return mod


pytest.importorskip("triton")
script = _script()
if (missing := script.cuda_compiler_missing()) is not None:
    pytest.skip(f"cannot compile for CUDA here: {missing}", allow_module_level=True)

FAST = [
    ("noise float32 x <- a*x + s*z", 90),  # the step's noise, in place
    ("noise bfloat16 x <- s*z", 80),
    ("chacha words", 90),
    ("chacha words", 80),
    ("gaussian from words G=3", 90),
    ("gaussian from words G=3", 80),
    ("word sums", 90),
    ("word sums", 80),
]


@pytest.fixture(scope="module")
def cold_cache(tmp_path_factory):
    """Triton's compile cache in a temporary folder: nothing written to the user's cache,
    nothing read from it (every compile here is a real one)."""
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path_factory.mktemp("triton_cache"))
        yield


@pytest.fixture(scope="module")
def launches(cold_cache) -> dict[str, Any]:
    return {launch.label: launch for launch in script.launches()}


def _assert_compiles_without_spills(launch: Any, arch: int) -> None:
    compiled = script.compile_launch(launch, arch)
    assert compiled.kernel.asm["cubin"], "no cubin"
    assert compiled.kernel.metadata.name == launch.kernel.__name__
    # a spill is local memory traffic inside the ChaCha20 rounds: the kernel would be far slower
    # than its issue-36 target; ptxas's own counts, in bytes
    assert (compiled.spill_stores, compiled.spill_loads, compiled.stack) == (0, 0, 0), (
        compiled.ptxas_log
    )
    assert 0 < compiled.registers <= 255, compiled.ptxas_log  # 255: a thread's architectural cap


@pytest.mark.parametrize(("label", "arch"), FAST)
def test_kernel_compiles_for_cuda_without_spills(launches, label, arch):
    _assert_compiles_without_spills(launches[label], arch)


def test_launches_cover_each_fused_dtype_and_the_interpreter_setting_is_kept(launches):
    """The recorded variants follow the launch site's own dtype set; recording and compiling
    leave ``TRITON_INTERPRET`` and the interpreter's kernel modules as they were."""
    from dpfy.noise.triton_noise import FUSED_DTYPES

    for dtype in FUSED_DTYPES:
        name = str(dtype).removeprefix("torch.")
        assert {f"noise {name} x <- a*x + s*z", f"noise {name} x <- s*z"} <= set(launches)
    noise = launches["noise float32 x <- a*x + s*z"]
    # libdevice's log, sin and cos, and a·x + s·z rounded twice (no FMA), as documented
    assert noise.kwargs["ACCURATE"] is True and noise.kwargs["enable_fp_fusion"] is False


@pytest.mark.parametrize("interpret", ["1", None])
def test_compiling_leaves_the_interpreter_as_it_was(monkeypatch, cold_cache, interpret):
    from dpfy.native import triton_support

    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    loaded = dict(triton_support._modules)
    words = [x for x in script.launches() if x.label == "chacha words"]
    script.compile_launch(words[0], 90)
    assert os.environ.get("TRITON_INTERPRET") == interpret
    assert triton_support._modules == loaded  # kernel_module's copies: neither replaced nor added
    assert type(words[0].kernel).__name__ == "JITFunction"


def test_word_sums_compile_after_triton_was_first_imported_interpreted(tmp_path):
    """Under ``TRITON_INTERPRET=1`` at Triton's first import, ``tl.standard``'s jit functions
    are the interpreter's for the whole process (a test worker whose first Triton import was
    inside an interpreted test): the compiled word-sums kernel must not call one (it did, as its
    combine function, and failed to compile)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import triton, triton_cuda_resources as s; "
        "assert triton.knobs.runtime.interpret; "
        "[s.compile_launch(x, 90) for x in s.launches() if x.label == 'word sums']"
    )
    src = str(BENCHMARKS.parent / "src")
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_CACHE_DIR": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code, str(BENCHMARKS)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_every_launched_variant_compiles_for_sm90_and_sm80_without_spills(launches):
    for launch in launches.values():
        for arch in script.ARCHS:
            _assert_compiles_without_spills(launch, arch)
