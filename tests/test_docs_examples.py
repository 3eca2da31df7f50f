"""Run the examples of the docs: every ```bash and ```python block of docs/*.md and README.md (the site's
home page), each on its own.

Each block runs in a fresh sandbox, as a reader would run it on a machine that has localspec:

* the working folder is a new temporary one holding tiny random GGUF models ``target.gguf`` and
  ``draft.gguf`` (same vocabulary, a ChatML template that offers tools and writes Hermes-style
  ``<tool_call>`` calls as Qwen2.5's does, ``<tool_call>`` and ``</tool_call>`` single tokens), so the tool-call
  examples run as they would on Qwen2.5-Coder; their weights are altered so that a string closes and a turn
  ends soon (``close_strings_and_turns``), and a call fits an example's ``max_tokens``;
* ``LOCALSPEC_HOME`` is a new folder whose ``models.toml`` maps the built-in pair names
  ``qwen2.5-coder-1.5b`` and ``qwen2.5-coder-7b`` to those files (a user's entry overrides the built-in one);
* ``OLLAMA_MODELS`` is a fake Ollama store holding ``qwen2.5-coder:7b`` and ``qwen2.5-coder:0.5b`` (the
  same tiny files);
* ``HOME`` is a new folder, the Hub is offline, and ``PATH`` starts with this Python's bin folder, so
  ``localspec`` and ``python`` are the installed ones.

Markers, on the line directly above a block's opening fence:

* ``<!-- docs-test: skip (reason) -->``: not run (an install, a download, something that runs until
  stopped); the reason is required and is the test's skip reason;
* ``<!-- docs-test: server -->``: run against ``localspec serve NAME`` on the tiny pair, NAME the first
  built-in pair name the block mentions (``qwen2.5-coder-1.5b`` where it names none), each started once for
  this module on a free port; every ``127.0.0.1:8000`` and ``localhost:8000`` in the block is replaced with
  its address;
* ``<!-- docs-test: expect (REGEX) -->``, or ``server expect (REGEX)``: the block's stdout must also
  match REGEX (``re.search``), for the shape of what it prints (a tool call's name, a field), never a
  model's words: the tiny models write random text;
* ``<!-- docs-test: file (NAME) -->``, above a block of any language: the block is a file the page's
  later examples read; it is written as NAME into their working folder.

One test per block, named ``page.md:LINE`` (the opening fence's line). ``DOCS_EXAMPLES_DIR`` points the
runner at another folder of pages.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest
from mdblocks import fenced_blocks, prose_lines

REPO = Path(__file__).resolve().parent.parent
DOCS = Path(os.environ.get("DOCS_EXAMPLES_DIR") or REPO / "docs")
#: Info strings whose blocks run, and how.
RUN = ("bash", "python")
#: Info strings that look runnable but would be shown only: a page uses bash/python (run) or text/console.
AMBIGUOUS = ("sh", "shell", "zsh", "py", "python3", "shell-session")
MARKER = re.compile(r"<!--\s*docs-test:?(.*?)-->")
SKIP = re.compile(r"skip\s*\((.*)\)")
RUNS = re.compile(r"(server)?\s*(?:expect\s*\((.+)\))?")  # server, expect (REGEX), or both
FILE = re.compile(r"file\s*\(([\w.-]+)\)")
#: The built-in pair names the sandbox's models.toml maps to the tiny pair, and the fake Ollama models.
PAIRS = ("qwen2.5-coder-1.5b", "qwen2.5-coder-7b")
OLLAMA = (("qwen2.5-coder", "7b", "target.gguf"), ("qwen2.5-coder", "0.5b", "draft.gguf"))
ADDRESSES = re.compile(r"\b(?:127\.0\.0\.1|localhost):8000\b")
TIMEOUT = 180  # seconds a block may run
TAIL = 40  # lines of a failed block's stderr shown


@dataclass(frozen=True)
class Example:
    page: str  # relative to DOCS
    line: int  # the opening fence's
    lang: str
    code: str
    marker: Optional[str]  # "server", "skip", or None
    reason: str = ""
    expect: str = ""  # a pattern its stdout must match
    files: tuple[tuple[str, str], ...] = ()  # (name, content) of the page's file blocks above it

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """The docs pages, and README.md with them when the docs are the repository's own."""
    return sorted(DOCS.glob("*.md")) + ([REPO / "README.md"] if DOCS == REPO / "docs" else [])


def marker_above(lines: list[str], fence_line: int) -> Optional[re.Match[str]]:
    """The docs-test marker on the line directly above the fence on ``fence_line`` (1-based), if any."""
    return MARKER.search(lines[fence_line - 2]) if fence_line >= 2 else None


def parse_marker(text: str) -> tuple[Optional[str], str]:
    """``(kind, argument)`` of a marker's text, kind None when it is no known marker: ``("skip", reason)``,
    ``("file", name)``, ``("server", pattern)`` or ``("run", pattern)`` (pattern "" when none)."""
    text = text.strip()
    m = SKIP.fullmatch(text)
    if m or re.fullmatch(r"skip\b.*", text):
        return "skip", m.group(1).strip() if m else ""
    m = FILE.fullmatch(text)
    if m:
        return "file", m.group(1)
    m = RUNS.fullmatch(text)
    if m and text:
        return ("server" if m.group(1) else "run"), (m.group(2) or "").strip()
    return None, ""


def examples() -> Iterator[Example]:
    for page in pages():
        text = page.read_text(encoding="utf-8")
        lines = text.splitlines()
        files: dict[str, str] = {}
        for block in fenced_blocks(text):
            m = marker_above(lines, block.line)
            kind, arg = parse_marker(m.group(1)) if m else (None, "")
            if kind == "file":
                files[arg] = block.code
                continue
            if block.info not in RUN:
                continue
            if kind == "skip":
                yield Example(page.name, block.line, block.info, block.code, "skip", reason=arg)
            else:
                yield Example(page.name, block.line, block.info, block.code, "server" if kind == "server" else None,
                              expect=arg, files=tuple(files.items()))


def marker_problems(page: Path) -> list[str]:
    """Markers that are unknown, lack a reason, or sit anywhere but directly above a runnable block."""
    text = page.read_text(encoding="utf-8")
    above = {b.line - 1: b for b in fenced_blocks(text)}  # the 1-based line above each fence
    problems = []
    for no, line in prose_lines(text):  # a marker shown in code (a span or a block) is no marker
        for m in MARKER.finditer(line):
            where = f"{page.name}:{no}: {m.group(0)}"
            kind, arg = parse_marker(m.group(1))
            if kind is None:
                problems.append(f"{where}: unknown marker (known: 'docs-test: skip (reason)', 'docs-test: server', "
                                "'docs-test: expect (REGEX)', 'docs-test: server expect (REGEX)', "
                                "'docs-test: file (NAME)')")
            elif kind == "skip" and not arg:
                problems.append(f"{where}: a skip needs its reason in the parentheses")
            elif kind in ("server", "run") and arg:
                try:
                    re.compile(arg)
                except re.error as exc:
                    problems.append(f"{where}: the expected pattern does not compile: {exc}")
            block = above.get(no)
            if block is None:
                problems.append(f"{where}: not directly above a code block's opening fence")
            elif block.info not in RUN and kind != "file":
                problems.append(f"{where}: above a ```{block.info or '(no language)'} block, which is not run")
    for b in fenced_blocks(text):
        if b.info in AMBIGUOUS:
            problems.append(f"{page.name}:{b.line}: ```{b.info} is not run; write ```bash or ```python "
                            "(run), or ```text / ```console (shown only)")
    return problems


ALL = list(examples())


def params() -> list:
    out = []
    for ex in ALL:
        marks = [pytest.mark.skip(reason=f"docs-test: {ex.reason}")] if ex.marker == "skip" else []
        out.append(pytest.param(ex, id=ex.id, marks=marks))
    return out or [pytest.param(None, id="no-examples", marks=pytest.mark.skip(reason=f"no examples in {DOCS}"))]


# -- the sandbox ---------------------------------------------------------------------------------------


def close_strings_and_turns(path: Path) -> None:
    """Make a tiny model end its strings and its turns: a random model writes a JSON string until
    ``max_tokens`` cuts it off (an example's call would come back cut, and unreadable), and after a call
    it starts another rather than ending its turn. Every token's embedding gets a large constant first
    component, which the final norm keeps, and the output rows of ``"`` and ``<|im_end|>`` a large weight
    on it; so a string the grammar opens closes at once, and a turn ends after its calls. Free text is
    mostly ``"`` then: only the shape of what the examples print is checked, never the words."""
    import gguf
    from tinymodel import token_id

    from localspec.structured.tool_use import CLOSE, OPEN

    reader = gguf.GGUFReader(path, "r+")
    tensors = {t.name: t.data for t in reader.tensors}
    tensors["token_embd.weight"][:, 0] = 10.0
    tensors["output.weight"][token_id('"', [OPEN, CLOSE]), 0] = 5.0
    tensors["output.weight"][token_id("<|im_end|>", [OPEN, CLOSE]), 0] = 4.0
    del tensors, reader  # the memory map writes through


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pair the sandboxes' models.toml and Ollama store point at: the suite's target and draft
    (the draft the target with noise), with the tool template and its two tokens, and strings and turns
    that end (``close_strings_and_turns``)."""
    from tinymodel import HERMES_TEMPLATE, write_tiny_model

    from localspec.structured.tool_use import CLOSE, OPEN

    d = tmp_path_factory.mktemp("docs-models")
    for name, noise in (("target.gguf", 0.0), ("draft.gguf", 0.35)):
        write_tiny_model(d / name, seed=0, noise=noise, user_tokens=[OPEN, CLOSE], chat_template=HERMES_TEMPLATE)
        close_strings_and_turns(d / name)
    return d


@pytest.fixture(scope="module")
def ollama_store(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake Ollama model folder (manifests and blobs as Ollama lays them out)."""
    root = tmp_path_factory.mktemp("ollama")
    (root / "blobs").mkdir()
    for model, tag, file in OLLAMA:
        digest = hashlib.sha256((models / file).read_bytes()).hexdigest()
        shutil.copy(models / file, root / "blobs" / f"sha256-{digest}")
        manifest = root / "manifests" / "registry.ollama.ai" / "library" / model / tag
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
             "size": (models / file).stat().st_size}]}))
    return root


def models_toml(models: Path) -> str:
    """The sandbox's models.toml: each of PAIRS as the tiny pair (a JSON string is a TOML basic string)."""
    target, draft = (json.dumps(str(models / name)) for name in ("target.gguf", "draft.gguf"))
    return "".join(f'[pairs."{pair}"]\ndescription = "tiny random pair for the docs examples"\nk = 4\nctx = 1024\n'
                   f"target = {{ path = {target} }}\ndraft = {{ path = {draft} }}\n\n" for pair in PAIRS)


def sandbox(root: Path, models: Path, ollama_store: Path) -> tuple[Path, dict[str, str]]:
    """A working folder with the tiny pair in it, and the environment of the sandbox under ``root``."""
    work, home, lhome = root / "work", root / "home", root / "localspec-home"  # no folder named as a package
    for d in (work, home, lhome):
        d.mkdir(parents=True)
    for name in ("target.gguf", "draft.gguf"):
        shutil.copy(models / name, work / name)
    (lhome / "models.toml").write_text(models_toml(models), encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LOCALSPEC_", "XDG_", "HF_", "HUGGINGFACE_", "OLLAMA_", "PYTEST_"))}
    env.update(HOME=str(home), LOCALSPEC_HOME=str(lhome), OLLAMA_MODELS=str(ollama_store),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
               HF_HUB_OFFLINE="1", LOCALSPEC_HISTORY="on", LOCALSPEC_PROMPT_CACHE="on",
               PYTHONUNBUFFERED="1", NO_COLOR="1", COLUMNS="100")
    return work, env


@pytest.fixture(scope="module")
def docs_servers(models: Path, ollama_store: Path, tmp_path_factory: pytest.TempPathFactory):
    """``localspec serve NAME`` in a sandbox of its own, for the blocks marked server: a function that gives the
    server of a built-in pair name, started the first time a block names it."""
    for module in ("fastapi", "uvicorn", "llguidance"):
        pytest.importorskip(module, reason=f"the server examples need the server and structured extras "
                                           f"({module} is missing)")
    from serverproc import ServeProcess

    servers: dict[str, ServeProcess] = {}

    def server(name: str) -> ServeProcess:
        if name not in servers:
            root = tmp_path_factory.mktemp("docs-server")
            _, env = sandbox(root, models, ollama_store)
            home = Path(env.pop("LOCALSPEC_HOME"))  # ServeProcess sets it
            servers[name] = ServeProcess([name], home, env=env)
        return servers[name]

    yield server
    for started in servers.values():
        started.close()


def served(code: str) -> str:
    """The pair a server block's server serves: the first of ``PAIRS`` the block names (the page's own
    server), else the first of them."""
    named = [(code.find(p), p) for p in PAIRS if p in code]
    return min(named)[1] if named else PAIRS[0]


def tail(text: str, n: int = TAIL) -> str:
    lines = text.rstrip().splitlines()
    return "\n".join((["..."] if len(lines) > n else []) + lines[-n:])


# -- the tests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", params())
def test_example(example: Example, models: Path, ollama_store: Path, tmp_path: Path,
                 request: pytest.FixtureRequest):
    """The block runs to exit status 0 in its sandbox, and prints what its expect pattern says."""
    code = example.code
    if example.marker == "server":
        server = request.getfixturevalue("docs_servers")(served(example.code))
        code = ADDRESSES.sub(f"127.0.0.1:{server.port}", code)
    work, env = sandbox(tmp_path, models, ollama_store)
    for name, content in example.files:
        (work / name).write_text(content, encoding="utf-8")
    script = tmp_path / "block" / ("example.py" if example.lang == "python" else "example.sh")
    script.parent.mkdir()  # python puts the script's folder first on sys.path: nothing else in it
    script.write_text(code, encoding="utf-8")
    argv = [sys.executable, str(script)] if example.lang == "python" else ["bash", "-e", str(script)]
    try:
        r = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"{example.id}: the {example.lang} block ran past {TIMEOUT} s; stderr:\n{tail(err)}",
                    pytrace=False)
    if r.returncode != 0:
        server_log = ""
        if example.marker == "server":
            log = request.getfixturevalue("docs_servers")(served(example.code)).output()
            server_log = f"\n--- the server's log, last lines ---\n{tail(log, 15)}"
        pytest.fail(f"{example.id}: the {example.lang} block exited with {r.returncode}\n"
                    f"--- stderr, last lines ---\n{tail(r.stderr)}\n"
                    f"--- stdout, last lines ---\n{tail(r.stdout, 10)}{server_log}", pytrace=False)
    if example.expect and not re.search(example.expect, r.stdout):
        pytest.fail(f"{example.id}: the {example.lang} block's stdout does not match {example.expect!r}\n"
                    f"--- stdout, last lines ---\n{tail(r.stdout)}", pytrace=False)


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_markers(page: Path):
    """Every docs-test marker is known, a skip says why, and each sits directly above a bash/python block."""
    problems = marker_problems(page)
    assert not problems, "\n".join(problems)


def test_marker_rules(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "<!-- docs-test: skip (downloads) -->", "```bash", "pip install x", "```",
        "<!-- docs-test: skip -->", "```bash", "true", "```",
        "<!-- docs-test: skip () -->", "```python", "pass", "```",
        "<!-- docs-test: serve -->", "```bash", "true", "```",
        "<!-- docs-test: server -->", "", "```bash", "true", "```",
        "<!-- docs-test: server -->", "```text", "output", "```",
        "```sh", "ls", "```",
        "Write `<!-- docs-test: skip (reason) -->` above it.", "```markdown", "<!-- docs-test: nonsense -->", "```",
        "<!-- docs-test: file (tools.json) -->", "```json", "[]", "```",
        "<!-- docs-test: server expect (\"name\": \"f\") -->", "```bash", "true", "```",
        "<!-- docs-test: expect ([) -->", "```bash", "true", "```",
        "<!-- docs-test: server expect -->", "```bash", "true", "```",
    ]) + "\n")
    problems = marker_problems(page)
    assert [p.split(": ", 1)[0] for p in problems] == [
        "page.md:5", "page.md:9", "page.md:13", "page.md:17", "page.md:22", "page.md:41", "page.md:45",
        "page.md:26"], problems
    assert "unknown marker" in problems[2] and "not directly above" in problems[3] and "not run" in problems[4]
    assert "does not compile" in problems[5] and "unknown marker" in problems[6]
    assert parse_marker(" skip (needs a GPU) ") == ("skip", "needs a GPU") and parse_marker("server") == ("server", "")
    assert parse_marker("server expect (tool_calls) ") == ("server", "tool_calls")
    assert parse_marker("expect (a (b) c)") == ("run", "a (b) c") and parse_marker("file (tools.json)") == (
        "file", "tools.json")
    assert parse_marker("") == (None, "") and parse_marker("file (a/b)") == (None, "")


def test_file_blocks_reach_the_later_examples_of_their_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "page.md").write_text("\n".join([
        "```bash", "true", "```",
        "<!-- docs-test: file (tools.json) -->", "```json", "[1]", "```",
        "<!-- docs-test: expect (\\[1\\]) -->", "```bash", "cat tools.json", "```",
    ]) + "\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", tmp_path)
    first, second = examples()
    assert first.files == () and second.files == (("tools.json", "[1]\n"),) and second.expect == r"\[1\]"
