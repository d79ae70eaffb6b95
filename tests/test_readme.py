"""The README's Python examples run as written (the public API documented there is real)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path, capsys):
    script = tmp_path / f"readme_{index}.py"
    script.write_text(BLOCKS[index])
    runpy.run_path(str(script), run_name="__main__")
    assert capsys.readouterr().out.strip(), "every README example prints what it computes"


def test_readme_accounting_example_prints_the_guides_numbers(tmp_path, capsys):
    # The guide's running example (Ponomareva et al. 2023, §4.2.2 footnote and Appendix C): RDP ≈
    # 1.2 and PLD ≈ 0.59 after 1 epoch.
    block = next(b for b in BLOCKS if "one_epoch" in b)
    script = tmp_path / "acc.py"
    script.write_text(block)
    runpy.run_path(str(script), run_name="__main__")
    lines = capsys.readouterr().out.split()
    assert lines[0] == "1.22" and lines[1] == "0.59"


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    command = "bash scripts/setup.sh && .venv/bin/python -m pytest"
    assert command in README.read_text() and command in ci
