"""Hub files checked by their headers before any download, and drafts found for a Hub target (a local fake Hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run_cli
from hfserver import FakeHub
from tinymodel import write_tiny_model

from localspec.catalog import registry
from localspec.catalog.remote import find_drafts, parse_hf, remote_header
from localspec.errors import HubError, ModelFileError

TARGET = ("org/Tiny-1B-Instruct-GGUF", "tiny-1b-instruct-q4_k_m.gguf")
DRAFT = ("org/Tiny-0.1B-Instruct-GGUF", "tiny-0.1b-instruct-q4_k_m.gguf")
PADDED = ("org/Tiny-0.2B-Padded-GGUF", "tiny-0.2b-padded-q4_k_m.gguf")
FOREIGN = ("org/Tiny-0.3B-Other-GGUF", "tiny-0.3b-other-q4_k_m.gguf")  # another vocabulary
TOO_BIG = ("org/Tiny-0.9B-Instruct-GGUF", "tiny-0.9b-instruct-q4_k_m.gguf")  # not several times smaller


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """GGUFs of a few MB (weights, not just a header), so reading the header is a small share of each."""
    d = tmp_path_factory.mktemp("remote")
    big = {"n_embd": 256, "n_ff": 1024, "n_head": 8, "n_head_kv": 4}
    out = {TARGET: write_tiny_model(d / "t.gguf", seed=0, **big),
           DRAFT: write_tiny_model(d / "d.gguf", seed=0, noise=0.3, **big),
           PADDED: write_tiny_model(d / "p.gguf", seed=0, pad_to=300, **big),
           FOREIGN: write_tiny_model(d / "f.gguf", seed=7, rename={100: "XYZ"}, **big),
           TOO_BIG: write_tiny_model(d / "b.gguf", seed=0, noise=0.1, **big)}
    assert all(p.stat().st_size > 5_000_000 for p in out.values())
    return out


@pytest.fixture
def hub(files, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with FakeHub() as server:
        for key, path in files.items():
            server.files[key] = path.read_bytes()
        server.files[("org/Notes-GGUF", "notes.gguf")] = b"these are notes, not a model\n" * 100
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def hf(key: tuple[str, str]) -> str:
    return f"hf:{key[0]}/{key[1]}"


@pytest.mark.parametrize("draft, verdict", [(DRAFT, "ok: Vocabularies match"), (PADDED, "warning: "),
                                            (FOREIGN, "different vocabularies: token id 100")])
def test_check_on_hub_files_reads_a_few_percent_and_agrees_with_the_local_check(hub, files, draft, verdict):
    remote = run_cli(["check", "-t", hf(TARGET), "-d", hf(draft)])
    local = run_cli(["check", "-t", str(files[TARGET]), "-d", str(files[draft])])
    assert verdict in remote.output and remote.exit_code == local.exit_code, remote.output
    # The same verdict, word for word, up to the files' names.
    last = [r.output.strip().splitlines()[-1] for r in (remote, local)]
    assert last[0].replace(draft[1], "D").replace(TARGET[1], "T") == \
        last[1].replace(files[draft].name, "D").replace(files[TARGET].name, "T")
    for key in (TARGET, draft):
        assert 0 < hub.sent[key] < 0.05 * files[key].stat().st_size, (key, hub.sent[key])
    assert "header read:" in remote.output


def test_a_hub_target_gets_the_compatible_draft_found_by_header_and_downloaded(hub, files):
    r = run_cli(["pull", "tiny", "--target", hf(TARGET)])
    assert r.exit_code == 0, r.output
    assert f"draft: hf:{DRAFT[0]}/{DRAFT[1]}" in r.output
    assert TOO_BIG not in hub.sent  # its name says 0.9B, too large for a 1B target: not even its header is read
    assert "different vocabularies" in r.output  # the foreign one was read and refused
    spec = registry.get_pair("tiny")
    assert (spec.target.repo, spec.target.file, spec.draft.repo, spec.draft.file) == (*TARGET, *DRAFT)
    assert hub.sent[DRAFT] >= files[DRAFT].stat().st_size  # downloaded whole
    assert hub.sent[FOREIGN] < 0.05 * files[FOREIGN].stat().st_size  # only its header
    r = run_cli(["check", "tiny"])
    assert r.exit_code == 0 and "ok: Vocabularies match" in r.output


def test_a_given_draft_with_another_vocabulary_is_refused_before_downloading(hub, files):
    r = run_cli(["pull", "x", "--target", hf(TARGET), "--draft", hf(FOREIGN)])
    assert r.exit_code == 1 and "different vocabularies" in r.output
    assert all(sent < 0.05 * files[key].stat().st_size for key, sent in hub.sent.items())


def test_draft_search_ranks_an_identical_vocabulary_first_and_skips_what_is_too_large(hub):
    target = remote_header(parse_hf(hf(TARGET)))
    matches, spent = find_drafts(target)
    assert [m.remote.ref.repo for m in matches] == [DRAFT[0], PADDED[0]]  # identical before padded; 0.9B is too big
    assert "vocabulary padded" in matches[1].reason and spent > 0
    catalog_only, _ = find_drafts(target, [parse_hf(hf(DRAFT))], search=False)
    assert [m.remote.ref.repo for m in catalog_only] == [DRAFT[0]]


def test_bad_remote_files_and_an_unreachable_hub_are_one_sentence(hub, monkeypatch):
    with pytest.raises(ModelFileError, match=r"notes\.gguf is not a GGUF file"):
        remote_header(parse_hf("hf:org/Notes-GGUF/notes.gguf"))
    with pytest.raises(HubError, match="no file"):
        remote_header(parse_hf("hf:org/Tiny-1B-Instruct-GGUF/missing.gguf"))
    for bad in ("hf:org/only-a-repo", "hf:org/../x.gguf", "hf:org/r//x.gguf", "hf:org/r/notes.txt"):
        with pytest.raises(HubError, match="not a Hub file reference"):
            parse_hf(bad)
    hub.errors[TARGET[0]] = (403, "GatedRepo")
    with pytest.raises(HubError, match="gated or private"):
        remote_header(parse_hf(hf(TARGET)))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    r = run_cli(["check", "-t", hf(DRAFT), "-d", hf(DRAFT)])
    assert r.exit_code == 1 and "Could not reach the Hub" in r.output and "Traceback" not in r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("Error")]) == 1


def test_pulled_pair_files_are_recorded_with_their_checksums(hub, tmp_path):
    r = run_cli(["pull", "--target", hf(TARGET), "--draft", hf(DRAFT), "-q"])
    assert r.exit_code == 0, r.output
    assert "added tiny-1b-instruct to" in r.output  # named after the target file
    recorded = json.loads((tmp_path / "home" / "checksums.json").read_text())["recorded"]
    assert {f"{TARGET[0]}/{TARGET[1]}@main", f"{DRAFT[0]}/{DRAFT[1]}@main"} <= set(recorded)


def test_pulling_a_registered_pair_checks_its_vocabularies_by_header_before_downloading(hub, files, tmp_path):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "models.toml").write_text(
        f'[pairs.bad]\ndescription = "x"\ntarget = {{ repo = "{TARGET[0]}", file = "{TARGET[1]}" }}\n'
        f'draft = {{ repo = "{FOREIGN[0]}", file = "{FOREIGN[1]}" }}\n'
        f'[pairs.good]\ndescription = "y"\ntarget = {{ repo = "{TARGET[0]}", file = "{TARGET[1]}" }}\n'
        f'draft = {{ repo = "{DRAFT[0]}", file = "{DRAFT[1]}" }}\n')
    r = run_cli(["pull", "bad", "-q"])
    assert r.exit_code == 1 and "different vocabularies" in r.output and "nothing was downloaded" in r.output
    assert all(sent < 0.05 * files[key].stat().st_size for key, sent in hub.sent.items())
    r = run_cli(["pull", "good", "-q"])
    assert r.exit_code == 0 and "checked the vocabularies from the headers first" in r.output
    assert hub.sent[DRAFT] >= files[DRAFT].stat().st_size


def test_a_server_that_sends_more_than_asked_cannot_make_the_check_download_the_model(hub, files, monkeypatch):
    import localspec.catalog.remote as remote

    hub.bad_ranges = "tail"  # every reply runs on to the end of the 8 MB file
    got = remote_header(parse_hf(hf(TARGET)))
    assert got.bytes_read < 0.05 * files[TARGET].stat().st_size  # read only what was asked for
    hub.bad_ranges = "shift"  # bytes from the wrong place
    with pytest.raises(HubError, match="did not answer .* with the bytes asked for"):
        remote_header(parse_hf(hf(TARGET)))
    hub.bad_ranges = None
    monkeypatch.setattr(remote, "MAX_HEADER_BYTES", 20_000)  # a header that never ends, in effect
    with pytest.raises(HubError, match="goes on past"):
        remote_header(parse_hf(hf(TARGET)))


def test_offline_the_header_check_says_so(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = run_cli(["check", "-t", hf(TARGET), "-d", hf(DRAFT)])
    assert r.exit_code == 1 and "HF_HUB_OFFLINE is set" in r.output


def test_the_header_check_follows_the_hubs_redirect_to_its_cdn_keeping_the_range(hub, files, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub.redirect = True
    got = remote_header(parse_hf(hf(TARGET)))
    assert got.size == files[TARGET].stat().st_size and got.header.architecture == "llama"
    assert hub.sent[TARGET] < 0.05 * files[TARGET].stat().st_size
    assert hub.redirect_auth and all(auth == "Bearer hf_secret" for auth in hub.redirect_auth)  # to the Hub
    assert hub.cdn_auth and not any(hub.cdn_auth)  # the token does not follow the redirect to another host


def test_a_hub_targets_vision_projector_comes_with_it_and_loads_beside_it(hub, files, tmp_path):
    pytest.importorskip("llama_cpp.mtmd_cpp")
    from tinyvision import write_tiny_mmproj

    import localspec

    mmproj = write_tiny_mmproj(tmp_path / "mmproj.gguf", n_embd_target=256)
    hub.files[(TARGET[0], "mmproj-tiny-1b-instruct-f16.gguf")] = mmproj.read_bytes()
    hub.files[(TARGET[0], "mmproj-other-q8_0.gguf")] = b"not chosen"
    r = run_cli(["pull", "seeing", "--target", hf(TARGET), "--draft", hf(DRAFT)])
    assert r.exit_code == 0, r.output
    assert f"vision projector: hf:{TARGET[0]}/mmproj-tiny-1b-instruct-f16.gguf" in r.output
    spec = registry.get_pair("seeing")
    assert spec.mmproj is not None and spec.mmproj.file == "mmproj-tiny-1b-instruct-f16.gguf"
    with localspec.load("seeing", history=False, prompt_cache=False, notify=lambda _: None) as pair:
        assert pair.target.projector is not None
        assert pair.target.projector.path.name == "mmproj-tiny-1b-instruct-f16.gguf"


def test_a_hub_target_without_a_projector_pulls_as_before(hub, files):
    r = run_cli(["pull", "plain", "--target", hf(TARGET), "--draft", hf(DRAFT)])
    assert r.exit_code == 0 and "vision projector" not in r.output
