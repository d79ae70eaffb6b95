"""``dpfy --help`` starts without torch (issue 31 §4: every command took 4–5 s to start), so
does ``dpfy train --help`` (issue 35 §3: 4.9 s, its parser imported the training loop), and
``import dpfy; dpfy.make_private`` imports torch but none of SciPy, dp_accounting and the
other slow optional packages until something is accounted (issue 35 §3: 5.6 s against torch's
2.4 s). Speed itself is measured by ``benchmarks/startup.py``.

The console script imports the package root and then ``dpfy.cli``; both must leave torch (and
the accountants) unimported until a subcommand runs. Checked in a fresh interpreter, since this
test process has long imported torch. Not a timed test: what is checked is what gets imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

_PROBE = """
import json, sys
from dpfy.cli import main
try:
    main({argv!r})
except SystemExit as e:
    code = e.code
else:
    code = None
print(json.dumps({{"code": code, "heavy": sorted(m for m in HEAVY if m in sys.modules)}}))
"""
# What --help and --version must not import. `dpfy train --help` reads TrainConfig's fields
# (dpfy.train.config, hence dpfy.privacy.accountants and numpy), so it is checked against SLOW.
HEAVY = ("torch", "numpy", "dp_accounting", "dpfy.api", "dpfy.privacy", "dpfy.train")
SLOW = ("torch", "scipy", "dp_accounting", "sklearn", "matplotlib", "transformers", "pandas")


def _probe(argv: list[str], heavy: tuple[str, ...] = HEAVY) -> dict:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = f"HEAVY = {heavy!r}\n" + _PROBE.format(argv=argv)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_top_level_help_and_version_import_no_torch(argv: list[str]) -> None:
    got = _probe(argv)
    assert got["code"] == 0
    assert got["heavy"] == [], f"dpfy {' '.join(argv)} imported {got['heavy']}"


def test_the_package_root_is_lazy_and_complete() -> None:
    code = (
        "import sys, dpfy\n"
        "assert 'torch' not in sys.modules, 'import dpfy imported torch'\n"
        "assert set(dpfy.__all__) <= set(dir(dpfy))\n"
        "import dpfy.validation\n"  # the module never shadows the function
        "assert callable(dpfy.validate) and dpfy.validate is dpfy.validation.validate\n"
        "from dpfy import make_private, Ledger, epsilon, calibrate_noise_multiplier\n"
        "assert dpfy.make_private is make_private and dpfy.Ledger.__name__ == 'Ledger'\n"
        "assert dpfy.layers.DPLSTM.__name__ == 'DPLSTM'  # a subpackage, read as an attribute\n"
        "try:\n"
        "    dpfy.no_such_name\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('dpfy.no_such_name did not raise AttributeError')\n"
    )
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)


def test_train_help_imports_no_torch_and_no_accountant() -> None:
    got = _probe(["train", "--help"], SLOW)
    assert got["code"] == 0
    assert got["heavy"] == [], f"dpfy train --help imported {got['heavy']}"


def test_make_private_imports_torch_but_not_scipy_or_dp_accounting() -> None:
    code = (
        "import json, sys, dpfy\n"
        "dpfy.make_private\n"
        f"print(json.dumps(sorted(m for m in {SLOW!r} if m in sys.modules)))\n"
    )
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["torch"]
