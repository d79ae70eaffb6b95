"""Modules stay small: no file in ``src/dpfy`` over 500 lines (CONTRIBUTING, "Code people can
pick up"), beside the import-layer contracts of ``test_import_layers.py``.

The files below were over the limit when this test was written; each may shrink but never
grow past its line count here, and a new file over 500 lines fails. When one is split along its
seams, delete its entry (the test says so when an entry is no longer needed).
"""

from __future__ import annotations

from pathlib import Path

LIMIT = 500
SRC = Path(__file__).resolve().parents[1] / "src" / "dpfy"

# path relative to src/dpfy -> the most lines it may have until it is split
OVER_THE_LIMIT: dict[str, int] = {}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_grows_past_its_limit():
    sizes = {str(p.relative_to(SRC)): _lines(p) for p in SRC.rglob("*.py")}
    too_long = {name: n for name, n in sizes.items() if n > OVER_THE_LIMIT.get(name, LIMIT)}
    assert not too_long, (
        f"modules must have at most {LIMIT} lines (or not grow, for the files listed in "
        f"OVER_THE_LIMIT), got {too_long}. Split the module along its seams"
    )


def test_every_listed_exception_is_still_needed():
    stale = {
        name: _lines(SRC / name) if (SRC / name).exists() else None
        for name in OVER_THE_LIMIT
        if not (SRC / name).exists() or _lines(SRC / name) <= LIMIT
    }
    assert not stale, (
        f"OVER_THE_LIMIT must list only files still over {LIMIT} lines, got {stale}. "
        f"Delete their entries"
    )
