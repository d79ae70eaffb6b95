"""MkDocs hooks: the site is built from docs/ plus pages that live elsewhere in the repository.

- The front page is README.md; each reproduction's README.md and results/ (experiments/<name>/),
  benchmarks/RESULTS.md, CHANGELOG.md and CONTRIBUTING.md are added as pages, so each text has
  one copy, readable both on the site and in a checkout.
- Links between these files are written as paths in the repository (``docs/engine.md``,
  ``../experiments/oso_fmnist/README.md``) and rewritten here to the pages they became; a link
  to a repository file that is not on the site is left alone, and MkDocs' strict build fails on it.
- Sphinx roles in the API reference's docstrings (``:class:`X` ``) are rendered as the name.
- Every page under docs/guide/ that the nav does not list yet is appended to the "User guide"
  section, and every reproduction (experiments/<name>/README.md) to "Results", so adding a guide
  page or a reproduction is adding the file (list it in mkdocs.yml to give it a title and place).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
GUIDE_SECTION = "User guide"
RESULTS_SECTION = "Results"
# Sphinx roles left in docstrings (":class:`X`"): the rendered page shows the name alone
ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):(?=<code>)")
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\s+\"[^\"]*\")?\)")


def _extra_pages() -> dict[str, Path]:
    """Site path -> file in the repository, for every page that lives outside docs/."""
    pages = {"index.md": ROOT / "README.md", "changelog.md": ROOT / "CHANGELOG.md",
             "contributing.md": ROOT / "CONTRIBUTING.md",
             "results/benchmarks.md": ROOT / "benchmarks" / "RESULTS.md",
             "results/index.md": ROOT / "experiments" / "README.md"}
    for readme in sorted((ROOT / "experiments").glob("*/README.md")):
        name = readme.parent.name
        pages[f"results/{name}/index.md"] = readme
        for item in sorted((readme.parent / "results").glob("*.png")):
            pages[f"results/{name}/results/{item.name}"] = item
    return {site: path for site, path in pages.items() if path.exists()}


def _repo_to_site(config: Any) -> dict[str, str]:
    docs = Path(config["docs_dir"]).resolve()
    table = {path.resolve().relative_to(ROOT).as_posix(): site
             for site, path in _extra_pages().items()}
    for path in docs.rglob("*"):
        if path.is_file():
            site = path.relative_to(docs).as_posix()
            table[f"docs/{site}"] = site
    return table


def on_config(config: Any) -> Any:
    guide = Path(config["docs_dir"]) / "guide"
    nav = config["nav"] or []
    listed = {str(v) for item in _walk(nav) for v in [item]}
    unlisted = {
        GUIDE_SECTION: [f"guide/{page.name}" for page in sorted(guide.glob("*.md"))],
        RESULTS_SECTION: [f"results/{readme.parent.name}/index.md"
                          for readme in sorted((ROOT / "experiments").glob("*/README.md"))],
    }
    for section in nav:
        if isinstance(section, dict):
            for title, uris in unlisted.items():
                if title in section:
                    section[title].extend(uri for uri in uris if uri not in listed)
    config["_repo_to_site"] = _repo_to_site(config)
    config["_site_to_repo"] = {s: r for r, s in config["_repo_to_site"].items()}
    return config


def _walk(nav: Any):
    if isinstance(nav, list):
        for item in nav:
            yield from _walk(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _walk(value)
    else:
        yield nav


def on_files(files: Files, config: Any) -> Files:
    for site, path in _extra_pages().items():
        files.append(File.generated(config, site, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    site_uri = page.file.src_uri
    repo_uri = config["_site_to_repo"].get(site_uri)
    if repo_uri is None:
        return markdown
    table = config["_repo_to_site"]

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("mailto:", "/")):
            return match.group(0)
        in_repo = posixpath.normpath(posixpath.join(posixpath.dirname(repo_uri), target))
        if in_repo.endswith("/") or in_repo in ("experiments", "docs") or \
                (ROOT / in_repo).is_dir():
            readme = posixpath.join(in_repo, "README.md")
            in_repo = readme if readme in table else in_repo
        site = table.get(in_repo)
        if site is None:
            return match.group(0)
        new = posixpath.relpath(site, posixpath.dirname(site_uri) or ".")
        return f"{match.group(1)}{new}{match.group(3) or ''}{match.group(4) or ''})"

    return LINK.sub(rewrite, markdown)


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    return ROLE.sub("", html)
