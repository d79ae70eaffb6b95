"""``DPFY_X86_LEVEL`` caps the compiled kernels' x86-64 level (issue 35 §1): with ``v3`` an
AVX-512 CPU builds the AVX2 kernels a CPU without AVX-512 runs, so one machine checks both paths
(CONTRIBUTING.md, "Both kinds of CPU"). The CPU's flags are stubbed: no build happens here."""

from __future__ import annotations

import pytest

from dpfy.native import build

V4_CPU = {"avx2", "fma", "bmi2", "movbe", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
V3_CPU = {"avx2", "fma", "bmi2", "movbe"}


@pytest.fixture
def linux_x86(monkeypatch):
    monkeypatch.setattr(build.platform, "system", lambda: "Linux")
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")


@pytest.mark.parametrize(
    "cpu, level, want",
    [
        (V4_CPU, None, "x86-64-v4"),
        (V4_CPU, "v4", "x86-64-v4"),
        (V4_CPU, "v3", "x86-64-v3"),  # the AVX2 path on an AVX-512 CPU
        (V3_CPU, None, "x86-64-v3"),
        (V3_CPU, "v4", "x86-64-v3"),  # a cap, never above what the CPU runs
    ],
)
def test_the_level_is_the_cpus_capped_by_the_variable(monkeypatch, linux_x86, cpu, level, want):
    monkeypatch.setattr(build, "_cpu_flags", lambda: set(cpu))
    if level is None:
        monkeypatch.delenv(build.LEVEL_ENV, raising=False)
    else:
        monkeypatch.setenv(build.LEVEL_ENV, level)
    assert build.target_flags() == [f"-march={want}"]


def test_another_value_is_refused_naming_the_variable(monkeypatch, linux_x86):
    monkeypatch.setattr(build, "_cpu_flags", lambda: set(V4_CPU))
    monkeypatch.setenv(build.LEVEL_ENV, "avx2")
    with pytest.raises(ValueError, match=r'DPFY_X86_LEVEL must be "v3" or "v4", got .*avx2'):
        build.target_flags()
