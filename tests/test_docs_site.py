"""The documentation site: links written as repository paths are rewritten to the site's pages,
and (slow) the strict build succeeds and its pages render in headless Chromium."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _hooks():
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _render(hooks, site_uri: str, markdown: str) -> str:
    config = hooks.on_config({"docs_dir": str(ROOT / "docs"), "nav": []})
    page = SimpleNamespace(file=SimpleNamespace(src_uri=site_uri))
    return hooks.on_page_markdown(markdown, page, config, None)


def test_repository_links_become_site_links():
    hooks = _hooks()
    # the front page (README.md) links into docs/ and experiments/
    out = _render(
        hooks,
        "index.md",
        "[a](docs/engine.md#x) [b](experiments/README.md) "
        "[c](CONTRIBUTING.md) [d](https://example.org/x.md)",
    )
    assert out == (
        "[a](engine.md#x) [b](results/index.md) [c](contributing.md) [d](https://example.org/x.md)"
    )
    # a docs page links to a reproduction; a reproduction's README to its own plots
    assert (
        _render(hooks, "individual.md", "[r](../experiments/idp_fmnist/README.md)")
        == "[r](results/idp_fmnist/index.md)"
    )
    png = "![p](results/idp_case1_idp-sample_epsilon.png)"
    assert _render(hooks, "results/idp_fmnist/index.md", png) == png
    # a link to a file that is not on the site is left for the strict build to reject
    assert _render(hooks, "index.md", "[s](src/dpfy/api.py)") == "[s](src/dpfy/api.py)"


def test_guide_pages_join_the_user_guide(tmp_path):
    hooks = _hooks()
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "new_topic.md").write_text("# New topic\n")
    nav = [
        {"Home": "index.md"},
        {"User guide": ["engine.md"]},
        {"Results": [{"OSO-DPSGD": "results/oso_fmnist/index.md"}]},
    ]
    config = hooks.on_config({"docs_dir": str(tmp_path), "nav": nav})
    assert config["nav"][1]["User guide"] == ["engine.md", "guide/new_topic.md"]
    results = config["nav"][2]["Results"]  # every reproduction, listed once
    assert "results/dynamic_fmnist/index.md" in results
    assert "results/oso_fmnist/index.md" not in results[1:]


@pytest.mark.slow
def test_site_builds_strictly_and_renders_in_chromium(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists() or shutil.which("chromium") is None:
        pytest.skip("needs the docs extra and Debian's chromium")
    site = tmp_path / "site"
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "docs_browser_check.py"),
            str(site),
            "--screenshots",
            str(tmp_path / "shots"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr


def test_api_reference_has_the_objects_users_call() -> None:
    # issue 35 §3: no page for dpfy.hf, dpfy.federated, dpfy.data.user_partition or the
    # DPOptimizer that make_private returns (where users call .epsilon())
    directives = set()
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        directives |= {
            line[4:].strip() for line in page.read_text().splitlines() if line.startswith("::: ")
        }
    want = {
        "dpfy.make_private",
        "dpfy.optim.DPOptimizer",
        "dpfy.hf.DPTrainer",
        "dpfy.hf.DPArguments",
        "dpfy.federated",
        "dpfy.data.user_partition",
    }
    assert want <= directives, sorted(want - directives)
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in ("reference/optim.md", "reference/hf.md", "reference/federated.md"):
        assert page in nav, page


def test_page_titles_carry_no_issue_numbers() -> None:
    # headings become page titles and navigation entries: "(issue 28 §4)" means nothing to a
    # reader of the site
    import re

    pages = [
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "experiments").glob("*/README.md"),
        ROOT / "benchmarks" / "RESULTS.md",
    ]
    bad = [
        f"{p.relative_to(ROOT)}: {line}"
        for p in pages
        for line in p.read_text().splitlines()
        if line.startswith("#") and re.search(r"\bissues? \d+", line)
    ]
    assert bad == []


def test_make_private_returns_three_named_values() -> None:
    # issue 35 §3: the Returns section rendered as one garbled row; Google style with one
    # "name (type): description" item per returned value renders as a three-row table
    griffe = pytest.importorskip("griffe")
    from dpfy.api import make_private

    doc = griffe.Docstring(make_private.__doc__, parser="google")
    (returns,) = [s for s in doc.parse() if s.kind.value == "returns"]
    assert [(r.name, str(r.annotation)) for r in returns.value] == [
        ("model", "nn.Module"),
        ("optimizer", "DPOptimizer"),
        ("loader", "DPDataLoader"),
    ]
