"""Registry (models.toml), downloads against a local fake Hub, `add`, `models` and `check`."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from clirun import run_cli
from hfserver import FakeHub

from localspec.catalog import hub, registry
from localspec.errors import HubError, RegistryError


def run(*args: str):
    return run_cli(list(args), catch_exceptions=False)


def one_line_error(result, needle: str) -> str:
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("Error: ") and needle in lines[-1], lines
    assert "Traceback" not in result.output
    return lines[-1]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("LOCALSPEC_HOME", str(h))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return h


@pytest.fixture
def fake_hub(home, tiny_dir, monkeypatch):
    with FakeHub() as server:
        server.files[("org/tiny-target", "t.gguf")] = (tiny_dir / "target.gguf").read_bytes()
        server.files[("org/tiny-draft", "d.gguf")] = (tiny_dir / "draft.gguf").read_bytes()
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_user_toml(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "models.toml"
    path.write_text(text)
    return path


def tiny_pair_toml(tiny_dir: Path, target_sha: str | None = None) -> str:
    sha_part = f', sha256 = "{target_sha}"' if target_sha else ""
    return (
        '[pairs.tiny]\ndescription = "tiny test pair"\nk = 3\nctx = 512\n'
        f'target = {{ repo = "org/tiny-target", file = "t.gguf"{sha_part} }}\n'
        'draft = { repo = "org/tiny-draft", file = "d.gguf" }\n'
    )


# -- registry -----------------------------------------------------------------------------------------


def test_builtin_registry_parses_and_names_well_known_pairs():
    pairs = registry.parse(registry.builtin_text(), "built-in")
    assert {"qwen2.5-coder-1.5b", "qwen2.5-coder-7b", "qwen2.5-7b", "llama3.1-8b", "llama3.2-3b"} <= set(pairs)
    for spec in pairs.values():
        assert spec.target.repo and spec.target.file.endswith(".gguf") and spec.draft.file.endswith(".gguf")


def test_user_pairs_override_builtin_ones(home, tiny_dir):
    write_user_toml(home, tiny_pair_toml(tiny_dir).replace("[pairs.tiny]", '[pairs."qwen2.5-coder-1.5b"]'))
    assert registry.get_pair("qwen2.5-coder-1.5b").target.repo == "org/tiny-target"


@pytest.mark.parametrize("text,needle", [
    ("[pairs.x\n", "line 1"),
    ('[pairs.x]\ntarget = { repo = "a/b", file = "f.gguf" }\n', "pairs.x has no 'draft'"),
    ('[pairs.x]\ntarget = { repo = "a/b" }\ndraft = { path = "/d.gguf" }\n', "pairs.x.target is missing 'file'"),
    ('[pairs.x]\ntarget = { path = "/t.gguf" }\ndraft = { path = "/d.gguf" }\nk = "four"\n', "pairs.x.k"),
    ('[pairs.x]\ntarget = { path = "/t.gguf", sha256 = "abc" }\ndraft = { path = "/d.gguf" }\n', "sha256"),
])
def test_registry_errors_name_the_file_and_the_line_or_key(home, text, needle):
    path = write_user_toml(home, text)
    with pytest.raises(RegistryError) as err:
        registry.load_registry()
    assert str(path) in str(err.value) and needle in str(err.value)


def test_unknown_pair_lists_the_known_ones(home):
    r = run("generate", "no-such-pair", "-p", "hi")
    msg = one_line_error(r, "No model pair named 'no-such-pair'")
    assert "qwen2.5-coder-1.5b" in msg


def test_pair_not_downloaded_says_how_to_get_it(home):
    r = run("generate", "qwen2.5-coder-1.5b", "-p", "hi")
    one_line_error(r, "localspec pull qwen2.5-coder-1.5b")


# -- pull ---------------------------------------------------------------------------------------------


def test_pull_downloads_verifies_and_records(fake_hub, home, tiny_dir):
    write_user_toml(home, tiny_pair_toml(tiny_dir, sha(tiny_dir / "target.gguf")))
    r = run("pull", "tiny", "--quiet")
    assert r.exit_code == 0, r.output
    assert "recorded" in r.stderr and "d.gguf" in r.stderr  # the draft had no listed checksum
    recorded = json.loads((home / "checksums.json").read_text())["recorded"]
    assert recorded["org/tiny-draft/d.gguf@main"] == sha(tiny_dir / "draft.gguf")
    files = hub.resolve(registry.get_pair("tiny"))
    assert sha(files.target) == sha(tiny_dir / "target.gguf")
    # the pair now loads by name, with its suggested context
    r = run("generate", "tiny", "-p", "The cat", "-n", "5", "--method", "draft", "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["tokens"]) == 5
    assert json.loads(r.stdout)["stats"]["k"] == 3  # the pair's suggested draft length
    r = run("generate", "tiny", "-p", "The cat", "-n", "5", "--method", "draft", "--k", "2", "--json")
    assert json.loads(r.stdout)["stats"]["k"] == 2  # --k still wins
    listing = json.loads(run("models", "--json").stdout)
    tiny = next(row for row in listing if row["name"] == "tiny")
    assert tiny["downloaded"] and tiny["bytes_on_disk"] > 0 and str(home.parent / "hf") in tiny["target"]


def _pull_in_a_terminal(name: str, *flags: str) -> str:
    """Run `localspec pull` in a pseudo-terminal (progress bars only show on one) and return the screen."""
    import os
    import sys

    pexpect = pytest.importorskip("pexpect")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    child = pexpect.spawn(sys.executable, ["-m", "localspec", "pull", name, *flags], env=env, encoding="utf-8",
                          timeout=60, dimensions=(24, 120))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    return str(child.before)


def test_pull_quiet_shows_no_progress_bar_and_leaves_the_environment_alone(fake_hub, home, tiny_dir):
    import os

    from huggingface_hub.utils import are_progress_bars_disabled

    write_user_toml(home, tiny_pair_toml(tiny_dir))
    screen = _pull_in_a_terminal("tiny", "--quiet")
    assert "%|" not in screen and "draft" in screen, screen
    shutil.rmtree(home.parent / "hf")
    assert "%|" in _pull_in_a_terminal("tiny")  # without --quiet the same pull shows bars: the check can fail
    # in-process, a quiet pull restores huggingface_hub's setting and leaves the environment as it was
    shutil.rmtree(home.parent / "hf")
    hub.pull(registry.get_pair("tiny"), progress=False)
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ and not are_progress_bars_disabled()


def test_a_file_on_disk_with_the_listed_checksum_counts_as_downloaded(home, tiny_dir, tmp_path):
    write_user_toml(home, tiny_pair_toml(tiny_dir, sha(tiny_dir / "target.gguf")).replace(
        'file = "d.gguf" }', f'file = "d.gguf", sha256 = "{sha(tiny_dir / "draft.gguf")}" }}'))
    spec = registry.get_pair("tiny")
    with pytest.raises(RegistryError, match="not downloaded"):
        hub.resolve(spec)
    with pytest.raises(HubError, match="sha256"):
        hub.adopt(spec.target, tiny_dir / "draft.gguf")  # the wrong file is refused
    hub.adopt(spec.target, tiny_dir / "target.gguf")
    hub.adopt(spec.draft, tiny_dir / "draft.gguf", sha(tiny_dir / "draft.gguf"))
    files = hub.resolve(spec)
    assert (files.target, files.draft) == (tiny_dir / "target.gguf", tiny_dir / "draft.gguf")  # nothing copied
    assert next(x for x in json.loads(run("models", "--json").stdout) if x["name"] == "tiny")["downloaded"]
    r = run("pull", "tiny")  # nothing to download: the adopted files are checked and named
    assert r.exit_code == 0 and str(tiny_dir / "target.gguf") in r.stdout


def test_a_dropped_download_is_resumed_with_a_range_request(fake_hub, home, tiny_dir):
    # huggingface_hub keeps what it received in 10 MB chunks, so the file must be larger than one
    big = np.random.default_rng(0).integers(0, 256, 25 << 20, dtype=np.uint8).tobytes()
    fake_hub.files[("org/tiny-target", "t.gguf")] = big
    write_user_toml(home, tiny_pair_toml(tiny_dir, hashlib.sha256(big).hexdigest()))
    fake_hub.drop_after = 22 << 20  # the connection dies after 22 MB
    files = hub.pull(registry.get_pair("tiny"), progress=False)
    ranges = [r for m, p, r in fake_hub.requests if m == "GET" and "tiny-target" in p and r]
    assert ranges and int(ranges[0].removeprefix("bytes=").rstrip("-")) >= 10 << 20  # not from zero
    assert files.target.read_bytes() == big


def test_checksum_mismatch_refuses_the_file_and_deletes_nothing(fake_hub, home, tiny_dir):
    wrong = "0" * 64
    write_user_toml(home, tiny_pair_toml(tiny_dir).replace('file = "d.gguf"', f'file = "d.gguf", sha256 = "{wrong}"'))
    r = run("pull", "tiny", "-q")
    msg = one_line_error(r, "d.gguf")
    assert wrong in msg and sha(tiny_dir / "draft.gguf") in msg
    left = hub.locate(registry.get_pair("tiny").draft)
    assert left is not None and left.exists()  # nothing deleted
    with pytest.raises(HubError, match="refused"):
        hub.resolve(registry.get_pair("tiny"))  # and it is not used


@pytest.mark.parametrize("error,needle", [
    (None, "no repository has that name"),
    ((403, "GatedRepo"), "gated or private"),
    ((401, ""), "set HF_TOKEN"),
    ((403, ""), "gated or private"),
])
def test_hub_errors_say_what_to_do(fake_hub, home, tiny_dir, error, needle):
    text = tiny_pair_toml(tiny_dir).replace("org/tiny-target", "org/missing")
    write_user_toml(home, text)
    if error:
        fake_hub.files[("org/missing", "t.gguf")] = b"x"
        fake_hub.errors["org/missing"] = error
    one_line_error(run("pull", "tiny", "-q"), needle)


def test_missing_file_in_a_repo(fake_hub, home, tiny_dir):
    write_user_toml(home, tiny_pair_toml(tiny_dir).replace('file = "t.gguf"', 'file = "nope.gguf"'))
    one_line_error(run("pull", "tiny", "-q"), "has no file nope.gguf")


def test_network_down_and_offline_mode(home, tiny_dir, monkeypatch):
    write_user_toml(home, tiny_pair_toml(tiny_dir))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    one_line_error(run("pull", "tiny", "-q"), "Could not reach the Hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    one_line_error(run("pull", "tiny", "-q"), "HF_HUB_OFFLINE")


# -- add, check -----------------------------------------------------------------------------------------


def test_add_registers_files_on_disk_without_copying(home, tiny_dir, tmp_path):
    t, d = tmp_path / "mine-t.gguf", tmp_path / "mine-d.gguf"
    shutil.copy(tiny_dir / "target.gguf", t)
    shutil.copy(tiny_dir / "draft.gguf", d)
    r = run("add", "mine", "--target", str(t), "--draft", str(d), "--k", "3")
    assert r.exit_code == 0, r.output
    spec = registry.get_pair("mine")
    assert spec.target.path == str(t.resolve()) and spec.k == 3
    assert not list(home.glob("**/*.gguf"))  # nothing copied
    rows = json.loads(run("models", "--json").stdout)
    assert next(row for row in rows if row["name"] == "mine")["downloaded"]
    assert run("generate", "mine", "-p", "hi", "-n", "3", "--json").exit_code == 0
    one_line_error(run("add", "bad", "--target", str(t), "--draft", str(tiny_dir / "renamed.gguf")), "token id 100")
    t.unlink()
    one_line_error(run("generate", "mine", "-p", "hi"), "does not exist")


def test_check_reports_equal_padded_and_different_vocabularies(tiny_dir, tmp_path):
    from tinymodel import vocabulary, write_tiny_model

    r = run("check", "-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"))
    assert r.exit_code == 0 and "ok: Vocabularies match" in r.output and "BPE" in r.output
    write_tiny_model(tmp_path / "pad.gguf", seed=0, pad_to=len(vocabulary()[0]) + 8)
    r = run("check", "-t", str(tiny_dir / "target.gguf"), "-d", str(tmp_path / "pad.gguf"))
    assert r.exit_code == 0 and "warning:" in r.output and "padding" in r.output
    r = run("check", "-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "renamed.gguf"))
    one_line_error(r, "token id 100")
    write_tiny_model(tmp_path / "spm.gguf", seed=0, tokenizer="llama")
    one_line_error(run("check", "-t", str(tiny_dir / "target.gguf"), "-d", str(tmp_path / "spm.gguf")), "tokenizer")


# -- embedding models -----------------------------------------------------------------------------------


def test_the_catalog_names_an_embedding_model_and_bad_entries_are_one_sentence(home):
    known = registry.load_embedding_registry()
    assert known["nomic-embed-text-v1.5"].kind == "embedding"
    assert known["nomic-embed-text-v1.5"].model.file.endswith(".gguf")
    write_user_toml(home, '[embeddings.e]\nkind = "vector"\nmodel = { path = "/e.gguf" }\n')
    with pytest.raises(RegistryError, match=r"embeddings\.e\.kind must be one of embedding, reranker"):
        registry.load_embedding_registry()
    write_user_toml(home, '[embeddings.e]\nkind = "embedding"\n')
    with pytest.raises(RegistryError, match=r"embeddings\.e needs model ="):
        registry.load_embedding_registry()


def test_an_embedding_model_is_pulled_listed_and_loaded_by_its_name(home, fake_hub, tmp_path):
    """`localspec pull NAME` downloads a catalog embedding model; `models` lists it as one; load_embedding and
    `embed` take the name (and say to pull it first when it is not downloaded)."""
    from tinyarch import write_tiny_bert

    import localspec

    bert = write_tiny_bert(tmp_path / "bert.gguf", seed=3)
    fake_hub.files[("org/tiny-embed", "e.gguf")] = bert.read_bytes()
    write_user_toml(home, '[embeddings.tiny-embed]\ndescription = "a tiny bert"\nkind = "embedding"\n'
                          'model = { repo = "org/tiny-embed", file = "e.gguf" }\n')
    with pytest.raises(RegistryError, match="run `localspec pull tiny-embed`"):
        localspec.load_embedding("tiny-embed")
    with pytest.raises(RegistryError, match="No embedding model named 'nope'"):
        localspec.load_embedding("nope")
    r = run("pull", "tiny-embed", "--quiet")
    assert r.exit_code == 0 and r.stdout.startswith("tiny-embed: "), r.output
    listed = json.loads(run("models", "--json").stdout)
    row = next(x for x in listed if x["name"] == "tiny-embed")
    assert row["kind"] == "embedding" and row["downloaded"] and row["bytes_on_disk"] == bert.stat().st_size
    assert "tiny-embed             embedding model, downloaded" in run("models").stdout
    with localspec.load_embedding("tiny-embed") as e:
        assert e.name == "tiny-embed" and e.embed("hi").shape == (1, 32)
