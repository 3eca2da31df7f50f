"""MkDocs hooks: the README as the home page, and the dated benchmark results next to the docs.

* The site's home page (``index.md``) is the repository's README.md, so the two cannot drift apart;
  its links, written from the repository's root (``docs/install.md``), are made relative to the site.
* ``benchmarks/results/*.md`` stay where the benchmarks write them; this hook adds each one to the site
  as ``results/<same name>.md``, adds a ``results/index.md`` (the folder's README.md when it has one,
  else a generated list of the files, newest first), and fills the ``Results`` entry of the nav with
  the index and every file, newest first.
* A docs page links a results file by its path in the repository, ``../benchmarks/results/X.md``, which
  resolves where GitHub shows the page; the hook points that link at the site's ``results/X.md``.

The hook lives outside ``docs_dir`` so it is not published itself; ``mkdocs.yml`` names it under
``hooks:``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
README = REPO / "README.md"
NAV_TITLE = "Results"
#: A Markdown link's or image's target: ``](target`` up to the closing parenthesis, a space or a ``#``.
LINK = re.compile(r"\]\(\s*<?([^)\s>#]*)")


def site_link(target: str, from_readme: bool) -> str:
    """Where a link of a docs page (or, ``from_readme``, of README.md) points in the site: results files by
    their place in the repository to the site's ``results/``, and the README's ``docs/`` pages to the site's
    own pages. Other links are returned as they are."""
    prefix = "" if from_readme else "../"
    if target == f"{prefix}benchmarks/results/README.md":
        return "results/index.md"
    if target.startswith(f"{prefix}benchmarks/results/"):
        return "results/" + target[len(f"{prefix}benchmarks/results/"):]
    if from_readme and target.startswith("docs/"):
        return target[len("docs/"):]
    return target


def site_markdown(markdown: str, from_readme: bool = False) -> str:
    """A page's Markdown with every link target passed through ``site_link``."""
    return LINK.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + site_link(m.group(1), from_readme), markdown)


def results_files(folder: Path = RESULTS) -> list[Path]:
    """The dated results files (every ``*.md`` but README.md), newest first (names start with the date)."""
    return sorted((p for p in folder.glob("*.md") if p.name != "README.md"), key=lambda p: p.name, reverse=True)


def title(path: Path) -> str:
    """A results file's first ``# `` heading, else its name."""
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#\s+(.+?)\s*#*\s*$", line)
        if m:
            return m.group(1)
    return path.stem


def index_page(folder: Path = RESULTS) -> str:
    """The results index: the folder's README.md, or a list of the files newest first when it has none."""
    readme = folder / "README.md"
    if readme.is_file():
        return readme.read_text(encoding="utf-8")
    lines = ["# Benchmark results", "", "Dated records of what was measured, newest first.", ""]
    lines += [f"- [{p.stem}]({p.name}): {title(p)}" for p in results_files(folder)]
    return "\n".join(lines) + "\n"


def on_config(config: MkDocsConfig, **kwargs: Any) -> MkDocsConfig:
    """Give the nav's ``Results`` entry the index and every results file, newest first."""
    entries: list[Any] = ["results/index.md"] + [f"results/{p.name}" for p in results_files()]
    nav = config.nav or []
    for i, item in enumerate(nav):
        if isinstance(item, dict) and NAV_TITLE in item:
            nav[i] = {NAV_TITLE: entries}
            break
    else:
        nav.append({NAV_TITLE: entries})
    config.nav = nav
    return config


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    """Add the README as the home page, and the results files and their index, to the site."""
    old = files.get_file_from_path("index.md")
    if old is not None:
        files.remove(old)
    files.append(File.generated(config, "index.md", content=site_markdown(README.read_text(encoding="utf-8"), True)))
    for path in results_files():
        files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    files.append(File.generated(config, "results/index.md", content=index_page()))
    return files


def on_page_markdown(markdown: str, page: Any, config: MkDocsConfig, files: Files, **kwargs: Any) -> str:
    """Point a docs page's links to results files at the site's copies (the home page was done in on_files)."""
    if page.file.src_uri.startswith("results/") or page.file.src_uri == "index.md":
        return markdown
    return site_markdown(markdown)
