"""The layers of ``[tool.importlinter]`` in pyproject.toml hold: imports point down only, the
library never imports the runs or the command line, and no package has circular imports."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), f"{lint} is missing: install the test extra (pip install -e '.[test]')"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"lint-imports failed:\n{done.stdout}\n{done.stderr}"
