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


def test_make_private_stays_a_facade():
    # issue 37: make_private builds the run spec from its keywords and hands it to the builder;
    # every keyword's full description lives in docs/make_private.md, so the function (its
    # signature, a grouped docstring and the body) stays at most 150 lines
    import ast

    tree = ast.parse((SRC / "api" / "__init__.py").read_text(encoding="utf-8"))
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_private"]
    lines = fn.end_lineno - fn.lineno + 1
    assert lines <= 150, (
        f"make_private must be at most 150 lines (a keyword façade: the spec is built by "
        f"dpfy.spec.from_keywords, the run by dpfy.api.build), got {lines}. Move the logic "
        f"into those, and keyword details into docs/make_private.md"
    )


def test_every_make_private_keyword_is_documented():
    # the grouped docstring and the keyword page both name every keyword
    import inspect
    import re

    from dpfy.api import make_private

    names = set(inspect.signature(make_private).parameters)
    page = (SRC.parents[1] / "docs" / "make_private.md").read_text(encoding="utf-8")
    on_page = set(re.findall(r"`(\w+)`", " ".join(re.findall(r"^\*\*(.*?)\*\*", page, re.M))))
    args = (make_private.__doc__ or "").split("Args:")[1].split("Returns:")[0]
    in_doc = {n for line in re.findall(r"^      ([\w, ]+):", args, re.M) for n in line.split(", ")}
    assert names - on_page == set() and names - in_doc == set(), (names - on_page, names - in_doc)
