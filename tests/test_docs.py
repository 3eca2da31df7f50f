"""The documentation builds and stays true: the MkDocs site with --strict, docs/cli.md against the commands'
--help, docs/api.md and docs/chat.md against the code, the links and anchors of every page read from its own
place in the repository, README's shell blocks and install command, and the text speaks of the software (no
issue numbers, no account of how it was developed, measured machines named on the performance page).

The examples in docs/*.md are run by tests/test_docs_examples.py.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Iterator, Optional

import pytest
from mdblocks import fenced_blocks, prose_lines

REPO = Path(__file__).resolve().parent.parent

DOCS = sorted((REPO / "docs").rglob("*.md"))
#: Every page a reader sees, on the repository's pages and (README, docs, results) in the built site: the
#: README, the docs, the benchmarks' README and the results files with their index.
PAGES = [REPO / "README.md", *DOCS, REPO / "benchmarks" / "README.md",
         *sorted((REPO / "benchmarks" / "results").glob("*.md"))]
#: The pages whose prose is checked for narrative (all of them).
PROSE = PAGES
#: The product's code, whose docstrings, comments and messages a user reads too.
CODE = sorted([*(REPO / "localspec").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py"),
               *(p for p in (REPO / "scripts").iterdir() if p.is_file())])


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# -- the site ------------------------------------------------------------------------------------------


def test_site_builds_strict(tmp_path: Path):
    """`mkdocs build --strict`: every nav page exists, no page is left out of the nav, every link and anchor
    resolves (results pages included), and the API reference renders without griffe warnings."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]'; the test extra has it)")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith(("WARNING", "ERROR"))]
    assert r.returncode == 0, "\n".join(problems) or (r.stdout + r.stderr)[-4000:]
    assert (tmp_path / "site" / "results" / "index.html").is_file()
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert 'href="install/"' in home and "benchmarks/results/" not in home, "the home page's links were not mapped"


def test_cli_reference_matches_the_commands():
    """docs/cli.md is what scripts/cli_docs.py generates from every command's --help."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "cli_docs.py"), "--check"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, (r.stderr or r.stdout).strip()


def test_every_results_file_is_in_the_results_index():
    """benchmarks/results/README.md, which the site shows as the results index, links every dated file."""
    readme = REPO / "benchmarks" / "results" / "README.md"
    if not readme.is_file():
        pytest.skip("no benchmarks/results/README.md: the site generates the index itself")
    linked = {urllib.parse.unquote(t.split("#")[0]) for _, t in links(readme.read_text(encoding="utf-8"))}
    missing = [p.name for p in (REPO / "benchmarks" / "results").glob("*.md")
               if p.name != "README.md" and p.name not in linked]
    assert not missing, f"benchmarks/results/README.md does not link {', '.join(sorted(missing))}"


def hooks():
    """scripts/mkdocs_hooks.py as a module (it needs mkdocs to import)."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]'; the test extra has it)")
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", REPO / "scripts" / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_home_page_is_the_readme():
    """The site's home page is README.md itself, published by the hook with its links pointed within the
    site, so the two cannot drift apart: there is no docs/index.md to keep equal, and the published text
    differs from the README in link targets only."""
    assert not (REPO / "docs" / "index.md").exists(), \
        "docs/index.md exists, but the site's home page is README.md (scripts/mkdocs_hooks.py); delete it"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    home = hooks().site_markdown(readme, from_readme=True)
    strip = functools.partial(re.sub, r"\]\([^)]*\)", "]()")
    assert strip(home) == strip(readme)
    assert "](docs/" not in home and "](benchmarks/results/" not in home


def test_site_link_rules():
    h = hooks()
    assert h.site_markdown("[install](docs/install.md), [runs](benchmarks/results/README.md), "
                           "[one](benchmarks/results/2026-12-03-x.md#a), [web](https://x.org/docs/a)", True) == \
        "[install](install.md), [runs](results/index.md), [one](results/2026-12-03-x.md#a), [web](https://x.org/docs/a)"
    assert h.site_markdown("[a](../benchmarks/results/2026-12-03-x.md), [i](../benchmarks/results/README.md), "
                           "[p](performance.md#on-a-gpu), [s](#here)") == \
        "[a](results/2026-12-03-x.md), [i](results/index.md), [p](performance.md#on-a-gpu), [s](#here)"


def test_reference_pages_match_the_code():
    """docs/api.md (the Python API's docstrings) and docs/chat.md (chat's /help table) are what
    scripts/reference_docs.py generates from the code."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "reference_docs.py"), "--check"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, (r.stderr or r.stdout).strip()


def readme_block_after(heading: str) -> str:
    """The first bash block under a README heading."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(heading)
    block = next(b for b in fenced_blocks(text[start:]) if b.info == "bash")
    return block.code.strip()


def test_readme_first_command_installs_what_the_readme_uses():
    """The README's first command (install and a first answer) installs the server and structured extras,
    which its later sections use (`localspec serve`, tool calls), and the per-platform install lines do too."""
    first = readme_block_after("Two commands on a fresh machine")
    install = next(w for line in first.splitlines() for w in simple_commands(line)
                   if w[:2] == ["bash", "scripts/install.sh"])
    extras = {e for a in install[2:] if not a.startswith("-") for e in a.split(",")}
    assert {"server", "structured"} <= extras, f"the README's first command installs {extras or 'no extras'}"
    assert "--with-models" in install
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = [ln for b in fenced_blocks(text[: text.index("## Contributing")])
             for ln in b.code.splitlines() if "scripts/install.sh" in ln]
    assert len(lines) >= 4 and all("server,structured" in ln for ln in lines), lines


def test_readme_test_command_is_what_ci_runs():
    """`.ci/run` runs exactly the README's test command."""
    command = readme_block_after("## Contributing")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert command == ci, f"README: {command}\n.ci/run: {ci}"


#: Where a machine may be called a VM or virtual machine: the performance page names each figure's machine.
MACHINE_PAGE = REPO / "docs" / "performance.md"
VIRTUAL = re.compile(r"\bVMs?\b|\bvirtual\s+machines?\b", re.I)


def test_measured_machines_are_named_on_the_performance_page_only():
    """The README and the user's pages speak of what the software does; how a figure's machine was set up
    (a virtual machine, its cores) is said on the performance page, next to the figure."""
    hits = [f"{rel(p)}:{no}: {m.group(0)!r}" for p in [REPO / "README.md", *DOCS] if p != MACHINE_PAGE
            for no, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            for m in VIRTUAL.finditer(line)]
    assert not hits, "\n".join(hits)


#: A command line as a results file shows one: a program, then its arguments.
COMMAND = re.compile(r"(?:[A-Z_]+=\S*\s+)*(?:localspec|python3?|\.venv/bin/\S+|bash|\./\S+|pipx?|git|curl|time|cmake)"
                     r"\s+\S")
#: What a results file says where its command was not kept.
NO_COMMAND = re.compile(r"command[^.]*\bnot (?:recorded|kept)|not recorded[^.]*\bcommand", re.I | re.S)
#: Dated results files that need not name a command or a machine, each with the reason (none today).
RESULTS_EXCEPTIONS: dict[str, str] = {}
#: Options a results file's command took that the command has since renamed: ``{file: {option: new name}}``.
#: An entry is allowed only while the option is indeed gone and the file itself says, in a sentence naming
#: the old option, that it was renamed (none today).
RENAMED_OPTIONS: dict[str, dict[str, str]] = {}

RESULTS = sorted((REPO / "benchmarks" / "results").glob("2*.md"))


def logical_lines(lines: list[str]) -> list[str]:
    """Shell lines with their backslash continuations joined."""
    out: list[str] = []
    pending = ""
    for line in lines:
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        if pending:
            out.append(pending)
        pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def results_commands(text: str) -> list[str]:
    """The command lines a results file shows, continuations joined: in its fenced code blocks, its indented
    code (at any depth, as in a list item) and its code spans."""
    lines = [c for b in fenced_blocks(text) for c in logical_lines(b.code.splitlines())]
    prose = [ln for _, ln in prose_lines(text, blank_code=False)]
    i = 0
    while i < len(prose):
        if re.match(r"(?: {4,}|\t)\S", prose[i]):
            block = [prose[i]]
            while prose[i].rstrip().endswith("\\") and i + 1 < len(prose):
                i += 1
                block.append(prose[i])
            lines += logical_lines(block)
        else:
            lines += [m.group(2) for m in re.finditer(r"(`+)(.+?)\1", prose[i])]
        i += 1
    return [c.strip() for c in lines if COMMAND.match(c.strip())]


def simple_commands(command: str) -> list[list[str]]:
    """The words of each simple command in a shell line (split at ``&&``, ``;``, pipes and redirections),
    without leading ``NAME=value`` assignments, ``time``, comments, or the brackets of optional parts."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    for word in lex:
        if word and set(word) <= set("&|;()<>"):
            out.append([])
        else:
            out[-1].append(word.strip("[]"))
    cleaned: list[list[str]] = []
    for words in out:
        while words and (re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]) or words[0] == "time"):
            words = words[1:]
        if words and words[0].startswith("-") and cleaned:
            cleaned[-1] += words  # the other side of an alternative, [--a 1 | --b 2]: the same command's options
        elif words:
            cleaned.append(words)
    return cleaned


OPTION = re.compile(r"--?[A-Za-z][\w-]*")


def localspec_problems(words: list[str]) -> list[str]:
    """What is wrong with a ``localspec ...`` command: a subcommand that does not exist, or an option its
    (sub)command does not take, as the Click app itself says."""
    import click

    from localspec.cli import cli

    command: click.Command = cli
    where = "localspec"
    args = words[1:]
    problems = []
    i = 0
    while isinstance(command, click.Group):
        while i < len(args) and args[i].startswith("-"):
            i += 1  # the group's own options (--help, --version) are checked below with the rest
        if i == len(args):
            break
        sub = command.commands.get(args[i])
        if sub is None:
            if not any(isinstance(p, click.Argument) for p in command.params):  # nothing else takes the word
                return [f"`{where} {args[i]}` is not a command (commands: {', '.join(sorted(command.commands))})"]
            break
        command, where, i = sub, f"{where} {args[i]}", i + 1
    known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
    takes_value = {o for p in command.params if isinstance(p, click.Option) and not p.is_flag for o in p.opts}
    for arg in args:
        name = arg.split("=", 1)[0]
        if name[:2] in takes_value and not name.startswith("--"):  # a short option with its value: -n96
            continue
        if OPTION.fullmatch(name) and name not in known:
            problems.append(f"`{where}` has no option {name}")
    return problems


@functools.cache
def script_options(script: Path, subcommand: str = "") -> Optional[tuple[frozenset[str], frozenset[str]]]:
    """``(options, subcommands)`` of a script as its ``--help`` lists them; None where --help fails."""
    r = subprocess.run([sys.executable, str(script), *([subcommand] if subcommand else []), "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None
    usage = r.stdout.split("\n\n", 1)[0]
    subs = next((m.group(1).split(",") for m in re.finditer(r"\{([\w,-]+)\}", usage)), [])
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", r.stdout)), frozenset(subs)


def script_problems(words: list[str]) -> list[str]:
    """What is wrong with a ``python path/x.py ...`` command: a script that does not exist, or, for a
    benchmark script, an option its ``--help`` does not list."""
    if len(words) < 2 or words[1].startswith("-") or not words[1].endswith(".py"):
        return []  # python -c / -m, or no script
    script = REPO / words[1]
    if not script.is_file():
        return [f"{words[1]} does not exist"]
    if script.parent != REPO / "benchmarks":
        return []
    found = script_options(script)
    if found is None:
        return [f"{words[1]} --help fails"]
    options, subs = found
    args = words[2:]
    first = next((a for a in args if not a.startswith("-")), "")
    if first in subs:
        found = script_options(script, first)
        if found is None:
            return [f"{words[1]} {first} --help fails"]
        options = found[0]
    return [f"{words[1]} has no option {name}" for name in (a.split("=", 1)[0] for a in args)
            if OPTION.fullmatch(name) and name not in options]


def command_problems(command: str) -> list[str]:
    """What is wrong with a command line a results file quotes, for the parts of it that are localspec's own:
    the ``localspec`` command line and the scripts of the repository."""
    problems = []
    for words in simple_commands(command):
        program = words[0].rsplit("/", 1)[-1]
        if program == "localspec":
            problems += localspec_problems(words)
        elif re.fullmatch(r"python(?:3(?:\.\d+)?)?", program):
            problems += script_problems(words)
    return problems


@pytest.mark.parametrize("page", RESULTS, ids=lambda p: p.name)
def test_a_results_file_names_its_command_and_machine(page: Path):
    """Each dated results file shows the command that produced its figures, or says plainly that it was not
    recorded, and names the machine (or says it was not recorded); the curve and threads are checked by
    reading, since which figures need them is not a pattern."""
    if page.name in RESULTS_EXCEPTIONS:
        pytest.skip(RESULTS_EXCEPTIONS[page.name])
    text = page.read_text(encoding="utf-8")
    assert results_commands(text) or NO_COMMAND.search(text), \
        f"{rel(page)} shows no command (a block or span starting with localspec, python...) and does not say " \
        "that it was not recorded"
    assert re.search(r"\bmachines?\b|\bGPU\b", text, re.I), f"{rel(page)} names no machine"


@pytest.mark.parametrize("page", RESULTS, ids=lambda p: p.name)
def test_a_results_files_commands_run_today(page: Path):
    """Every `localspec ...` a results file quotes names a real command and only options it takes, and every
    `python benchmarks/x.py ...` a script that exists and options its --help lists; an option renamed since
    is allowed only as RENAMED_OPTIONS records it and the file itself says so."""
    text = page.read_text(encoding="utf-8")
    renamed = RENAMED_OPTIONS.get(page.name, {})
    problems = []
    for command in results_commands(text):
        for problem in command_problems(command):
            old = problem.rsplit(" ", 1)[-1] if " has no option " in problem else None
            if old not in renamed:
                problems.append(f"{problem}, in: {command}")
    flat = re.sub(r"\s+", " ", text)
    for old, new in renamed.items():
        assert any(old in s and "renamed" in s for s in re.split(r"(?<=[.:;])\s", flat)), \
            f"{rel(page)} uses {old}, since renamed {new}, but no sentence of it says so"
        assert any(f" has no option {old}" in p for c in results_commands(text) for p in command_problems(c)), \
            f"RENAMED_OPTIONS lists {old} for {page.name}, but no command there needs the exception"
    assert not problems, f"{rel(page)}:\n" + "\n".join(problems)


def test_results_command_rules():
    assert results_commands("Run:\n\n    localspec bench -t T --quick \\\n        --reps 3\n\nthen "
                            "`python benchmarks/x.py --v`, `localspec`, `bench`.\n\n- item:\n\n"
                            "      localspec check -t A\n```bash\nCMAKE_ARGS=-DX=on pip install .\n```\n") == [
        "CMAKE_ARGS=-DX=on pip install .", "localspec bench -t T --quick --reps 3", "python benchmarks/x.py --v",
        "localspec check -t A"]
    assert NO_COMMAND.search("The exact command and the\nthread counts were not kept.")
    assert not NO_COMMAND.search("The command ran. The threads were not recorded.")
    assert simple_commands("A=1 time localspec x --y 2 [--z S | --w] && .venv/bin/localspec q # note") == [
        ["localspec", "x", "--y", "2", "--z", "S", "--w"], [".venv/bin/localspec", "q"]]
    assert command_problems("localspec bench -t T -d D --reps 3 --width=0.04 --threads-batch 1") == []
    assert command_problems("localspec history clear --help") == []
    assert command_problems("localspec benchmark -t T") == [
        "`localspec benchmark` is not a command (commands: add, bench, cache, calibrate, chat, check, embed, export, "
        "generate, history, models, pull, serve)"]
    assert command_problems("localspec bench -t T --quik") == ["`localspec bench` has no option --quik"]
    assert command_problems("localspec history clearr") == [
        "`localspec history clearr` is not a command (commands: clear)"]
    assert command_problems("localspec bench -t T -n96 --category doc-qa") == []  # a short option's value attached
    assert command_problems("python benchmarks/no_such.py --x") == ["benchmarks/no_such.py does not exist"]
    assert command_problems("python benchmarks/replay.py predict T --verify 1,2 --draft-step 0.3") == []
    assert command_problems("python benchmarks/replay.py record T --verify 1,2") == [
        "benchmarks/replay.py has no option --verify"]
    assert command_problems("python3 -c 'while True: pass' && python -m llama_cpp.server --port 1") == []


# -- Markdown as GitHub shows it -------------------------------------------------------------------------

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.I)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def links(text: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every link and image outside code."""
    out = []
    for no, line in prose_lines(text):
        for rx in (INLINE_LINK, HTML_LINK, REFERENCE_DEF):
            out += [(no, m.group(1)) for m in rx.finditer(line)]
    return out


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown file as GitHub renders it (duplicate headings get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(text, blank_code=False):  # code spans are part of heading texts
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = github_slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
        out.update(re.findall(r"<a\s[^>]*?(?:name|id)=\"([^\"]+)\"", line, re.I))
    return out


#: Where a docs page may link outside docs/: the results files, which the site publishes as results/.
SITE_RESULTS = REPO / "benchmarks" / "results"


def broken_links(page: Path) -> list[str]:
    """What does not resolve from the page's own place in the repository (as GitHub shows it): a file that
    does not exist, an anchor its target lacks, an absolute path; and, for a docs page, a link out of docs/
    to anything but a results file, which the built site would not have."""
    text = page.read_text(encoding="utf-8")
    problems = []
    in_docs = REPO / "docs" in page.parents
    for no, target in links(text):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # a web address: not checked (no network)
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / urllib.parse.unquote(path_part)).resolve() if path_part else page
        where = f"{rel(page)}:{no}: {target}"
        if target.startswith("/"):
            problems.append(f"{where}: absolute path (GitHub resolves it from the repository root); make it "
                            "relative")
            continue
        if not dest.exists():
            problems.append(f"{where}: no such file")
            continue
        if REPO not in dest.parents and dest != REPO:
            problems.append(f"{where}: points outside the repository")
            continue
        if in_docs and REPO / "docs" not in dest.parents and dest.parent != SITE_RESULTS:
            problems.append(f"{where}: the site publishes docs/ and benchmarks/results/ only; link a page there "
                            "or name the file in code")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md":
            if urllib.parse.unquote(anchor).lower() not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{where}: {rel(dest)} has no heading with the anchor #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_links_and_anchors_resolve(page: Path):
    """Relative links, read from the page's own folder, name files that exist, and their #anchors headings
    that exist (GitHub's slugs); the site build checks the same links as the hook maps them."""
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


def test_readme_shell_blocks_parse(tmp_path: Path):
    """Every bash/sh block of README.md is at least valid shell (`bash -n`)."""
    blocks = [b for b in fenced_blocks((REPO / "README.md").read_text(encoding="utf-8"))
              if b.info in ("bash", "sh", "shell")]
    problems = []
    for b in blocks:
        r = subprocess.run(["bash", "-n"], input=b.code, capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"README.md:{b.line}: {r.stderr.strip()}")
    assert not problems, "\n".join(problems)


# -- the text speaks of the software ----------------------------------------------------------------------

ORDINAL = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|next|previous|earlier|later|last|"
           r"\d+(?:st|nd|rd|th)")

#: Phrases that narrate how the software was developed, and what each one is.
NARRATIVE = [
    (r"\bissues?\s*#?\d+", "an issue number"),
    (r"\btest[ -](?:vms?|machines?|box(?:es)?|hosts?)\b", "the development machine (name the machine instead)"),
    (r"\bdev(?:elopment)?\s+(?:vms?|machines?|box|environment)\b", "the development machine"),
    (rf"(?<!\ba )\b(?:{ORDINAL})\s+session\b", "a session of the work"),
    (r"\b(?:this|that|each|every|same|another)\s+session\b", "a session of the work"),
    (r"\bsessions?\s+(?:of|with|that|which)\b", "a session of the work"),
    (r"\b(?:for|in|during|by)\s+the\s+session\b", "a session of the work"),
    (r"\btoday(?:'s)?\b(?!\()", "'today' (give the date where a figure has one)"),
    (r"\b(?:yesterday|tonight|this morning|this afternoon|the evening before)\b", "a day of the work"),
    (r"\bhelpers?\b(?!\.py)", "a helper"),
    (r"\b(?:the|a)\s+(?:device|run|search|fetch)\s+tool\b", "the development tools"),
    (r"\bwe\s+(?:found|tried|measured|saw|noticed|ran|fixed|decided|changed|added|learned)\b",
     "'we' narrating the work"),
    (r"\b(?:the\s+lead|CEO)\b", "the development team"),
    (r"(?<![\w./-])shared/", "the development environment"),
    (r"\bdevice\s+(?:run|call|machine)s?\b", "the development environment's GPU tool"),
    (r"\$OUT\b|\bcarry\s*=", "the development environment's GPU tool"),
    (r"\bwork\s+items?\b", "a unit of the development work"),
]
#: The subset that can only be narrative in code too (there 'session' and 'helper' are ordinary words).
CODE_NARRATIVE = [
    (r"\bissues?\s*#?\d+", "an issue number"),
    (r"\btest[ -](?:vms?|machines?|box(?:es)?)\b", "the development machine (name the machine instead)"),
    (rf"(?<!\ba )\b(?:{ORDINAL})\s+session\b", "a session of the work"),
    (r"\bsessions?\s+(?:of|with)\s+(?:a|the)\s+(?:gpu|device)\b", "a session of the work"),
    (r"\btoday(?:'s)?\b(?!\()", "'today'"),
    (r"\b(?:the|a)\s+(?:device|run|search|fetch)\s+tool\b", "the development tools"),
    (r"\bwe\s+(?:found|tried|measured|noticed|decided|learned)\b", "'we' narrating the work"),
    (r"\bdevice\s+(?:run|call|machine)s?\b", "the development environment's GPU tool"),
    (r"\$OUT\b|\bcarry\s*=", "the development environment's GPU tool"),
    (r"\bwork\s+items?\b", "a unit of the development work"),
    (r"\((?:it|they|this)\s+(?:did|was|were)\s+(?:so\s+)?here\b", "'here' for the development machine (name the "
     "machine and the date)"),
    (r"\bthe\s+README'?s?\b[^.]{0,40}\bfigures?\b", "figures the README no longer holds (name the results file)"),
]


def narrative(text: str, patterns: list[tuple[str, str]]) -> Iterator[tuple[int, str, str]]:
    """``(line, phrase, what it is)`` for each match; lines are joined first, so a phrase broken across a
    line wrap is found too."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    flat = re.sub(r"\s", " ", text)  # same length, so offsets map back to lines
    for pattern, what in patterns:
        for m in re.finditer(pattern, flat, re.I):
            line = next(i for i, s in enumerate(starts[1:], 1) if s > m.start())
            yield line, re.sub(r"\s+", " ", m.group(0)), what


@pytest.mark.parametrize("page", PROSE, ids=rel)
def test_prose_speaks_of_the_software(page: Path):
    """No issue numbers, sessions, test VMs, 'today', helpers or tools of the development: the pages describe
    the software and the machines measured, by what they are."""
    hits = [f"{rel(page)}:{no}: {phrase!r} ({what})"
            for no, phrase, what in narrative(page.read_text(encoding="utf-8"), NARRATIVE)]
    assert not hits, "\n".join(sorted(hits, key=lambda h: int(h.split(":")[1])))


def test_code_speaks_of_the_software():
    """The same of the product's docstrings, comments and messages (localspec, benchmarks, scripts)."""
    hits = []
    for path in CODE:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{rel(path)}:{no}: {phrase!r} ({what})" for no, phrase, what in narrative(text, CODE_NARRATIVE)]
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("text, found", [
    ("as issue 29 asks", True), ("see issues #21 and 27", True), ("on the 2-core test\nVM, at one thread", True),
    ("(2026-12-02, third session).", True), ("This\nsession's edits ran beside it", True),
    ("both of today's curves", True), ("a check written for the session", True),
    ("the chat session", False), ("a second session, a sub-agent", False), ("tests/helpers.py", False),
    ("`datetime.date.today()`", False), ("the server's worker thread", False), ("issue a request", False),
    ("the device run carries it", True), ('--out "$OUT"', True), ("as the work item asks", True),
    ("on a CUDA device, the run", False), ("the device's memory runs out", False),
])
def test_narrative_patterns(text: str, found: bool):
    assert bool(list(narrative(text, NARRATIVE))) is found


@pytest.mark.parametrize("text, found", [
    ("decode speed? (It did here.)", True), ("The README's\n\"Structured output\" figures", True),
    ("as issue 29 asks", True), ("the chat session", False), ("stop here: the caller owns it", False),
    ("the folder's README.md when it has one", False), ("figures in benchmarks/results/x.md", False),
])
def test_code_narrative_patterns(text: str, found: bool):
    assert bool(list(narrative(text, CODE_NARRATIVE))) is found
