"""Compile dpfy's C kernels on first use and load them with ctypes.

Why compile at run time instead of shipping a setuptools extension: the kernels only make
things faster (every one has a pure-torch equivalent), so ``pip install dpfy`` stays a pure
Python install that works without a compiler; and the build can target the CPU it runs on
(x86-64-v4 = AVX-512 where present, else v3 = AVX2 + FMA), which a prebuilt wheel cannot.
A build takes well under a second and is cached in ``$DPFY_CACHE_DIR`` (default
``$XDG_CACHE_HOME/dpfy`` or ``~/.cache/dpfy``) under a name that hashes the source and the flags,
so an edited source or another CPU gets its own library.

Compiler: ``$CC`` or ``cc``. The vector math comes from glibc's libmvec (Linux x86-64).
``$DPFY_X86_LEVEL=v3`` builds the AVX2 kernels on an AVX-512 CPU (see ``LEVEL_ENV``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["NativeUnavailable", "load", "target_flags", "cache_dir", "LEVEL_ENV"]

SOURCE_DIR = Path(__file__).resolve().parent
# -ffast-math only at compile time, so <math.h> declares libmvec's vector logf/sinf/cosf; the link
# step below omits it, so gcc's crtfastmath.o (flush denormals to zero, process-wide) stays out.
COMPILE_FLAGS = ["-O3", "-ffast-math", "-fopenmp-simd", "-fPIC", "-std=c99"]
LINK_FLAGS = ["-shared", "-lmvec", "-lm"]
# DPFY_X86_LEVEL=v3 caps the build at x86-64-v3 on an AVX-512 CPU: the AVX2 kernels (and no fused
# ghost-norm kernel, which needs v4), as a machine without AVX-512 runs them, so one machine
# can check both paths (CONTRIBUTING.md). Read at the first build of the process.
LEVEL_ENV = "DPFY_X86_LEVEL"
_V4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_V3 = {"avx2", "fma", "bmi2", "movbe"}


class NativeUnavailable(RuntimeError):
    """A compiled kernel cannot be built or loaded here; the message says why."""


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def target_flags() -> list[str]:
    """``-march`` for this CPU's x86-64 level; raises if the kernels cannot run here."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise NativeUnavailable(
            f"compiled kernels need Linux on x86-64 (glibc libmvec), this is "
            f"{platform.system()} on {platform.machine()}"
        )
    flags = _cpu_flags()
    cap = os.environ.get(LEVEL_ENV, "")
    if cap not in ("", "v3", "v4"):
        raise ValueError(
            f'{LEVEL_ENV} must be "v3" or "v4", got {LEVEL_ENV} = {cap!r}. Unset it to build '
            f"for this CPU's own level, or set v3 to build the AVX2 kernels on an AVX-512 CPU"
        )
    if _V4 <= flags and cap != "v3":
        return ["-march=x86-64-v4"]
    if _V3 <= flags:
        return ["-march=x86-64-v3"]
    raise NativeUnavailable("compiled kernels need a CPU with AVX2 and FMA (x86-64-v3)")


def cache_dir() -> Path:
    """Where built libraries are kept (created on demand)."""
    if os.environ.get("DPFY_CACHE_DIR"):
        return Path(os.environ["DPFY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dpfy"


def _compile(source: Path, target: Path, march: list[str]) -> None:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise NativeUnavailable(
            f"no C compiler {cc!r} on PATH (install gcc, e.g. `apt-get install gcc`, or set CC)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        obj, lib = Path(tmp) / "kernel.o", Path(tmp) / target.name
        for cmd in (
            [cc, *COMPILE_FLAGS, *march, "-c", str(source), "-o", str(obj)],
            [cc, str(obj), "-o", str(lib), *LINK_FLAGS],
        ):
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise NativeUnavailable(f"`{' '.join(cmd)}` failed:\n{done.stderr.strip()}")
        os.replace(lib, target)  # atomic: a concurrent build never leaves half a library


@functools.lru_cache(maxsize=None)
def load(name: str) -> ctypes.CDLL:
    """Build (if not cached) and load ``<name>.c`` from this directory."""
    source = SOURCE_DIR / f"{name}.c"
    march = target_flags()
    key = hashlib.sha256(
        source.read_bytes() + " ".join(COMPILE_FLAGS + march + LINK_FLAGS).encode()
    ).hexdigest()[:16]
    target = cache_dir() / f"{name}-{key}.so"
    if not target.exists():
        try:
            _compile(source, target, march)
        except OSError as err:
            raise NativeUnavailable(
                f"cannot build {source.name} into {target.parent}: {err} "
                f"(set DPFY_CACHE_DIR to a writable directory)"
            ) from err
    try:
        return ctypes.CDLL(str(target))
    except OSError as err:
        raise NativeUnavailable(f"cannot load {target}: {err}") from err
