"""Open the built documentation site in headless Chromium and check that pages render.

    .venv/bin/python scripts/docs_browser_check.py SITE_DIR [--screenshots DIR]

For the front page and two other pages (a user-guide page and an API-reference page) it loads
the page in Debian's ``chromium`` (``--headless``; no browser is downloaded), reads the DOM after
the page's scripts ran, and checks that it has the page's title, the site navigation with its
sections and a search box, and for the API page rendered docstrings. A screenshot of each page
goes to ``--screenshots`` (default: a folder in the system's temporary directory, never the
repository). Exits 1 naming each failed check.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# page (relative to the site) -> text its main heading must contain
PAGES = {
    "index.html": "dpfy",
    "engine/index.html": "make_private",
    "reference/privacy/index.html": "dpfy.privacy",
}
NAV_SECTIONS = ("User guide", "Concepts", "API reference", "Results")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("docs_browser_check: no chromium on PATH (Debian: apt-get install chromium)")


def _run(args: list[str]) -> str:
    done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-dev-shm-usage", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-500:]}")
    return done.stdout


def check_page(site: Path, page: str, heading: str, shots: Path) -> list[str]:
    """The problems found on one page (none: it rendered with its navigation)."""
    url = (site / page).resolve().as_uri()
    dom = _run(["--virtual-time-budget=5000", "--dump-dom", url])
    problems = []
    h1 = re.search(r"<h1[^>]*>(.*?)</h1>", dom, re.S)
    if not h1 or heading not in re.sub(r"<[^>]+>", "", h1.group(1)):
        problems.append(f"{page}: no main heading containing {heading!r}")
    if 'class="md-nav' not in dom:
        problems.append(f"{page}: no navigation")
    for section in NAV_SECTIONS:
        if f">{section}<" not in re.sub(r"\s*(<|>)\s*", r"\1", dom):
            problems.append(f"{page}: navigation lacks the section {section!r}")
    if len(re.findall(r'class="md-nav__link', dom)) < 20:
        problems.append(f"{page}: fewer than 20 navigation links")
    if 'class="md-search__input' not in dom:
        problems.append(f"{page}: no search box")
    if page.startswith("reference/") and 'class="doc doc-heading"' not in dom:
        problems.append(f"{page}: no rendered docstrings")
    shot = shots / (page.replace("/", "_").removesuffix(".html") + ".png")
    _run(["--window-size=1280,900", f"--screenshot={shot}", url])
    if not shot.exists() or shot.stat().st_size < 10_000:
        problems.append(f"{page}: no screenshot (or a blank one) at {shot}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path)
    parser.add_argument("--screenshots", type=Path, default=None)
    args = parser.parse_args(argv)
    shots = args.screenshots or Path(tempfile.gettempdir()) / "dpfy-docs-screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    problems = [p for page, heading in PAGES.items()
                for p in check_page(args.site, page, heading, shots)]
    for p in problems:
        print(f"docs_browser_check: {p}", file=sys.stderr)
    if not problems:
        print(f"docs_browser_check: {len(PAGES)} pages render with navigation; "
              f"screenshots in {shots}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
