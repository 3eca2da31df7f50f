"""MkDocs hooks: publish the dated benchmark results next to the docs.

``benchmarks/results/*.md`` stay where the benchmarks write them; this hook adds
each one to the site as ``results/<same name>.md`` (so a docs page links
``results/2026-12-03-busy-first-calibration.md``), adds a ``results/index.md``
(the folder's README.md when it has one, else a generated list of the files,
newest first), and fills the ``Results`` entry of the nav with the index and
every file, newest first. The hook lives outside ``docs_dir`` so it is not
published itself; ``mkdocs.yml`` names it under ``hooks:``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
NAV_TITLE = "Results"


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
    """Add the results files and their index to the site."""
    for path in results_files():
        files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    files.append(File.generated(config, "results/index.md", content=index_page()))
    return files
