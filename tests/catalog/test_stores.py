"""The GGUF header reader and the scan of model stores (Ollama, LM Studio, HF cache, llama.cpp cache, folders).

Fake stores are built under a temporary folder from tiny GGUFs, with broken
entries among them; nothing here touches the real stores of the machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Optional

import pytest
from clirun import run_cli
from conftest import real_models_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tinymodel import vocabulary, write_tiny_model

from localspec.catalog import pairing, stores
from localspec.catalog.stores import Roots
from localspec.errors import ConfigError, ModelFileError
from localspec.runtime import gguf_metadata as gguf_header
from localspec.runtime.process import read_vocab
from localspec.runtime.vocab_match import compare

N_TOKENS = len(vocabulary()[0])
REV = "0123456789abcdef0123456789abcdef01234567"  # a snapshot's commit hash
SMALL = {"n_embd": 16, "n_layer": 1, "n_head": 2, "n_head_kv": 1, "n_ff": 32}  # a model a few times smaller
MID = {"n_embd": 32, "n_layer": 1, "n_head": 2, "n_head_kv": 1, "n_ff": 64}


# -- the header reader ------------------------------------------------------------


def reader(data: bytes, log: Optional[list[tuple[int, int]]] = None):
    def read(offset: int, size: int) -> bytes:
        if log is not None:
            log.append((offset, size))
        return data[offset:offset + size]
    return read


@pytest.fixture(scope="module")
def variants(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_dir's files plus a padded, an SPM-typed and a smaller model."""
    d = tmp_path_factory.mktemp("variants")
    for f in tiny_dir.glob("*.gguf"):
        shutil.copy(f, d / f.name)
    write_tiny_model(d / "padded.gguf", seed=0, pad_to=N_TOKENS + 29)
    write_tiny_model(d / "spm.gguf", seed=0, tokenizer="llama")
    write_tiny_model(d / "small.gguf", seed=0, **SMALL)
    return d


def test_vocab_matches_llama_cpp(variants: Path):
    """The header's vocabulary is what llama.cpp reads: type, BOS, EOS and every token's bytes."""
    for f in sorted(variants.glob("*.gguf")):
        mine, theirs = gguf_header.read_local(f).vocab(), read_vocab(f)
        assert (mine.path, mine.type, mine.bos, mine.eos) == (theirs.path, theirs.type, theirs.bos, theirs.eos), f
        assert mine.texts == theirs.texts, f


def test_compare_verdicts_match_llama_cpp(variants: Path):
    files = sorted(variants.glob("*.gguf"))
    headers = {f: gguf_header.read_local(f) for f in files}
    for a in files:
        for b in files:
            assert compare(headers[a].vocab(), headers[b].vocab()) == compare(read_vocab(a), read_vocab(b)), (a, b)
            same = headers[a].vocab_fingerprint() == headers[b].vocab_fingerprint()
            assert same == (compare(read_vocab(a), read_vocab(b)) == compare(read_vocab(a), read_vocab(a))
                            and read_vocab(a).texts == read_vocab(b).texts)
    t, p = headers[variants / "target.gguf"], headers[variants / "padded.gguf"]
    verdict = gguf_header.same_vocabulary(t, p)
    assert verdict.ok and verdict.padded
    assert not gguf_header.same_vocabulary(t, headers[variants / "renamed.gguf"]).ok
    assert t.vocab_fingerprint() == headers[variants / "small.gguf"].vocab_fingerprint()
    assert t.vocab_fingerprint() != headers[variants / "spm.gguf"].vocab_fingerprint()


def test_header_fields(tmp_path: Path):
    path = write_tiny_model(tmp_path / "m.gguf", seed=0, n_ctx=2048, metadata={
        "general.size_label": "1.5B", "general.base_model.0.repo_url": "https://huggingface.co/org/base",
        "general.base_model.0.name": "Base", "general.source.repo_url": "https://github.com/org/src",
        "general.parameter_count": 1_543_714_304})
    h = gguf_header.read_local(path)
    assert (h.version, h.n_tensors) == (3, 2 * 9 + 3)
    assert (h.architecture, h.name, h.context_length, h.quantization, h.file_type) == ("llama", "tiny", 2048, "F32", 0)
    assert (h.size_label, h.parameter_count, h.parameters) == ("1.5B", 1_543_714_304, 1_543_714_304)
    assert h.source_hints == {"general.base_model.0.repo_url": "https://huggingface.co/org/base",
                              "general.base_model.0.name": "Base",
                              "general.source.repo_url": "https://github.com/org/src"}
    assert h.metadata["tokenizer.ggml.tokens"] == vocabulary()[0]
    assert isinstance(h.metadata["tokenizer.ggml.merges"], gguf_header.SkippedValue)
    assert h.metadata["tokenizer.ggml.merges"].count == 12
    assert h.n_tokens == N_TOKENS and h.split_count == 1 and h.model_type is None
    assert h.kv_end < path.stat().st_size and h.bytes_read <= path.stat().st_size
    plain = gguf_header.read_local(tmp_path / "m.gguf", skip=frozenset())
    assert plain.metadata["tokenizer.ggml.merges"][0] == "Ġ t"
    assert plain.metadata["tokenizer.ggml.token_type"][-1] == 3


@pytest.mark.parametrize("label, count", [("1.5B", 1_500_000_000), ("494M", 494_000_000), ("8x7B", 56_000_000_000),
                                          ("30B-A3B", 30_000_000_000), ("7b", 7_000_000_000), ("big", None),
                                          (None, None), ("", None)])
def test_size_labels(label, count):
    assert gguf_header.parse_size_label(label) == count


def test_reads_grow_and_stop_at_the_key_values(tmp_path: Path):
    path = write_tiny_model(tmp_path / "m.gguf", seed=0)
    data = path.read_bytes()
    log: list[tuple[int, int]] = []
    h = gguf_header.parse(reader(data, log), len(data), name="m", first_chunk=256)
    assert len(log) > 3  # the 4.9 KB key/value section took several growing reads
    sizes = [size for _, size in log]
    # each request at least as large as the one before (the last may be clipped at the end of the file)
    assert all(b >= a for a, b in zip(sizes, sizes[1:-1], strict=False))
    assert max(o + s for o, s in log) <= len(data)
    assert h.bytes_read == sum(min(s, len(data) - o) for o, s in log)
    assert h.kv_end <= h.bytes_read < h.kv_end + 2 * sizes[-1] + 256
    assert h.bytes_read < len(data) / 10  # the tensors were never read


def test_skipped_arrays_are_not_fetched():
    """A skipped array of fixed-size elements is stepped over, not read (what an HTTP range reader wants)."""
    n = 1_000_000
    data = header(kv(b"tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, n) + b"\0" * 4 * n),
                  kv(b"general.name", 8, gstr(b"after")))
    log: list[tuple[int, int]] = []
    h = gguf_header.parse(reader(data, log), len(data), first_chunk=4096)
    assert h.name == "after" and h.metadata["tokenizer.ggml.scores"] == gguf_header.SkippedValue(6, n)
    assert h.kv_end == len(data) and h.bytes_read < 3 * 8192 < len(data) / 100
    assert [o for o, _ in log] == [0, 4 * n + 24 + 8 + len(b"tokenizer.ggml.scores") + 4 + 12]


def header(*kvs: bytes, n_kv: Optional[int] = None, version: int = 3, n_tensors: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kvs) if n_kv is None else n_kv) + b"".join(kvs)


def gstr(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def kv(key: bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


@pytest.mark.parametrize("data, needle", [
    (b"", "not a GGUF"),
    (b"GG", "not a GGUF"),
    (b"PK\x03\x04 a zip file", "not a GGUF"),
    (b"GGUF" + struct.pack("<I", 1), "version 1"),
    (b"GGUF" + struct.pack(">I", 3), "big-endian"),
    (b"GGUF" + struct.pack("<I", 3) + b"\x00" * 5, "truncated"),
    (header(n_kv=5), "metadata key"),
    (header(kv(b"a", 9, struct.pack("<IQ", 0, 1 << 40))), "more than the file could hold"),
    (header(kv(b"a", 9, struct.pack("<IQ", 8, 1 << 40))), "more than the file could hold"),
    (header(kv(b"a", 8, struct.pack("<Q", 1 << 50))), "claims"),
    (header(gstr(b"k" * 70000) + struct.pack("<I", 4) + b"\0" * 4), "claims"),
    (header(kv(b"a", 13, b"")), "unknown value type"),
    (header(kv(b"a", 9, struct.pack("<IQ", 77, 1))), "unknown element type"),
    (header(kv(b"a", 4, b"\0\0\0\0"), kv(b"a", 4, b"\0\0\0\0")), "appears twice"),
    (header(n_kv=1 << 40), "more than the file could hold"),
    (header(n_tensors=1 << 62), "more than the file could hold"),
])
def test_bad_headers(data: bytes, needle: str):
    """Each one sentence naming the file, with or without the size known; nothing huge is allocated."""
    for total in (len(data), None):
        log: list[tuple[int, int]] = []
        with pytest.raises(ModelFileError) as info:
            gguf_header.parse(reader(data, log), total, name="/models/x.gguf")
        msg = str(info.value)
        assert msg.startswith("/models/x.gguf ") and (needle in msg or total is None), msg
        assert sum(size for _, size in log) <= 2 * gguf_header.FIRST_CHUNK + (1 << 20)


def test_huge_counts_without_a_size_stop_early():
    """Without the source's size, an absurd array still fails fast: each read comes back short."""
    data = header(kv(b"a", 9, struct.pack("<IQ", 0, (1 << 30) - 1)))
    with pytest.raises(ModelFileError, match="truncated|more than the file could hold"):
        gguf_header.parse(reader(data), None, name="x")
    data = header(kv(b"a", 9, struct.pack("<IQ", 8, 1 << 31)))  # strings: walked one by one until the data ends
    with pytest.raises(ModelFileError, match="truncated|more than the file could hold"):
        gguf_header.parse(reader(data), None, name="x")


def test_read_local_errors(tmp_path: Path):
    with pytest.raises(ModelFileError, match="does not exist"):
        gguf_header.read_local(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="directory"):
        gguf_header.read_local(tmp_path)
    (tmp_path / "t.gguf").write_text("hello, I am text\n")
    with pytest.raises(ModelFileError, match=r"t\.gguf is not a GGUF file"):
        gguf_header.read_local(tmp_path / "t.gguf")


def test_vocab_errors(tmp_path: Path):
    h = gguf_header.parse(reader(header()), name="empty")
    with pytest.raises(ModelFileError, match="no tokenizer"):
        h.vocab()
    assert h.vocab_fingerprint() is None and h.n_tokens == 0
    unknown = gguf_header.parse(reader(header(kv(b"tokenizer.ggml.model", 8, gstr(b"klingon")))), name="k")
    with pytest.raises(ModelFileError, match="klingon"):
        unknown.vocab()
    none = gguf_header.parse(reader(header(kv(b"tokenizer.ggml.model", 8, gstr(b"no_vocab")))), name="n")
    assert (none.vocab().type, none.vocab().bos, none.vocab().eos) == (0, -1, -1)
    huge = gguf_header.parse(reader(header(kv(b"general.architecture", 8, gstr(b"x")),
                                           kv(b"x.vocab_size", 10, struct.pack("<Q", 1 << 40)),
                                           kv(b"tokenizer.ggml.model", 8, gstr(b"none")))), name="h")
    with pytest.raises(ModelFileError, match="vocabulary of"):
        huge.vocab()


@pytest.fixture(scope="module")
def header_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = write_tiny_model(tmp_path_factory.mktemp("hyp") / "m.gguf", seed=0, pad_to=300)
    h = gguf_header.read_local(path)
    return path.read_bytes()[:h.kv_end + 64]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_headers_parse_or_fail_cleanly(header_bytes: bytes, data):
    """Truncated or corrupted headers either parse or raise ModelFileError; no read goes past the bytes given."""
    buf = bytearray(header_bytes)
    cut = data.draw(st.integers(0, len(buf)), label="cut")
    for _ in range(data.draw(st.integers(0, 4), label="edits")):
        at = data.draw(st.integers(0, len(buf) - 8), label="at")
        if data.draw(st.booleans(), label="wide"):
            buf[at:at + 8] = struct.pack("<Q", data.draw(st.sampled_from(
                [0, 1, 2, 7, 8, 9, 12, 13, 255, 1 << 31, 1 << 32, 1 << 40, (1 << 64) - 1]), label="u64"))
        else:
            buf[at] = data.draw(st.integers(0, 255), label="byte")
    blob = bytes(buf[:cut])
    chunk = data.draw(st.sampled_from([64, 1000, gguf_header.FIRST_CHUNK]), label="chunk")
    for total in (len(blob), None):
        log: list[tuple[int, int]] = []
        try:
            h = gguf_header.parse(reader(blob, log), total, name="m", first_chunk=chunk)
        except ModelFileError as exc:
            assert str(exc).startswith("m ")
        else:
            assert h.kv_end <= len(blob)
            h.vocab_fingerprint()  # a parsed header's vocabulary either builds or is None
        if total is not None:  # never past the end, never the same byte twice
            assert all(0 <= o and o + s <= len(blob) for o, s in log), log
            assert sum(s for _, s in log) <= len(blob)
        else:  # doubling requests: at most about twice what is there, however large a count claims to be
            assert sum(s for _, s in log) <= 4 * (len(blob) + chunk)


@pytest.mark.real
def test_real_pair_header_matches_llama_cpp():
    d = real_models_dir()
    files = [d / "target.gguf", d / "draft.gguf"]
    if not all(f.is_file() for f in files):
        pytest.fail(f"The real model pair is not in {d}; run `python scripts/fetch_test_models.py` first.")
    headers = [gguf_header.read_local(f) for f in files]
    for f, h in zip(files, headers, strict=True):
        theirs = read_vocab(f)
        mine = h.vocab()
        assert (mine.type, mine.bos, mine.eos, mine.texts) == (theirs.type, theirs.bos, theirs.eos, theirs.texts)
        assert h.architecture == "qwen2" and h.bytes_read < 0.05 * f.stat().st_size
    assert compare(headers[0].vocab(), headers[1].vocab()) == compare(read_vocab(files[0]), read_vocab(files[1]))


# -- the stores ---------------------------------------------------------------------


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ollama_model(root: Path, name: tuple[str, str, str, str], digest: Optional[str], text: Optional[str] = None):
    manifest = root / "manifests" / Path(*name)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    if text is None:
        text = json.dumps({"schemaVersion": 2, "layers": [
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": 1}]})
    manifest.write_text(text)


def ollama_blob(root: Path, model: Path) -> str:
    digest = sha(model)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    shutil.copy(model, root / "blobs" / f"sha256-{digest}")
    return digest


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fake stores with good and broken entries.

    Vocabularies: every model is the tiny GPT-2-style BPE vocabulary except
    ``renamed`` (one token differs), ``spm`` (another tokenizer type) and
    ``padded`` (the same plus padding). Sizes: ``1.5B`` targets, ``0.5B``
    drafts (by size label), a ``1B`` split model, and unlabelled folder files
    paired by file size.
    """
    base = tmp_path_factory.mktemp("stores")
    src = base / "src"
    src.mkdir()
    big = write_tiny_model(src / "big.gguf", seed=0, metadata={"general.size_label": "1.5B"})
    big2 = write_tiny_model(src / "big2.gguf", seed=3, metadata={"general.size_label": "1.5B"})
    small = write_tiny_model(src / "small.gguf", seed=0, noise=0.3, **SMALL, metadata={"general.size_label": "0.5B"})
    padded = write_tiny_model(src / "padded.gguf", seed=1, pad_to=N_TOKENS + 29, **SMALL,
                              metadata={"general.size_label": "0.5B"})
    renamed = write_tiny_model(src / "renamed.gguf", seed=0, rename={100: "XYZ"}, **SMALL,
                               metadata={"general.size_label": "0.5B"})
    spm = write_tiny_model(src / "spm.gguf", seed=0, tokenizer="llama", **SMALL)
    mid = write_tiny_model(src / "mid.gguf", seed=2, **MID, metadata={"general.size_label": "1B"})
    mmproj = write_tiny_model(src / "mmproj.gguf", seed=0, **SMALL, metadata={"general.type": "mmproj"})
    unlabelled_big = write_tiny_model(src / "ub.gguf", seed=5)
    unlabelled_small = write_tiny_model(src / "us.gguf", seed=5, **SMALL)

    ol = base / "ollama"
    ollama_model(ol, ("registry.ollama.ai", "library", "tiny", "1.5b"), ollama_blob(ol, big))
    ollama_model(ol, ("registry.ollama.ai", "library", "tiny", "latest"), sha(big))  # the same blob again
    ollama_model(ol, ("registry.ollama.ai", "someone", "tiny", "0.5b"), ollama_blob(ol, small))
    ollama_model(ol, ("hf.co", "org", "renamed-GGUF", "Q4"), ollama_blob(ol, renamed))
    ollama_model(ol, ("registry.ollama.ai", "library", "gone", "1b"), "ab" * 32)  # blob missing
    ollama_model(ol, ("registry.ollama.ai", "library", "broken", "1b"), None, text="{not json")

    hf = base / "hf"
    repo = hf / "models--org--tiny-GGUF"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    blob = repo / "blobs" / sha(big2)
    shutil.copy(big2, blob)
    snap = repo / "snapshots" / REV
    snap.mkdir(parents=True)
    (snap / "tiny-1.5b.gguf").symlink_to(Path("..", "..", "blobs", blob.name))
    (hf / "models--org--tiny-GGUF" / ".no_exist").mkdir()

    lm = base / "lmstudio"
    (lm / "pub" / "tiny-GGUF").mkdir(parents=True)
    shutil.copy(padded, lm / "pub" / "tiny-GGUF" / "tiny-pad-0.5b.gguf")
    shutil.copy(mmproj, lm / "pub" / "tiny-GGUF" / "mmproj-tiny-f16.gguf")
    (lm / "pub" / "linked").mkdir()
    (lm / "pub" / "linked" / "tiny-1.5b.gguf").symlink_to(blob)  # the HF cache's file, reached again
    bad = lm / "pub" / "bad"
    bad.mkdir()
    (bad / "truncated.gguf").write_bytes(big.read_bytes()[:3000])
    (bad / "notes.gguf").write_text("not a model\n")
    (bad / "loop.gguf").symlink_to(bad / "loop.gguf")
    (bad / "dangling.gguf").symlink_to(base / "nowhere.gguf")
    split = lm / "pub" / "split"
    split.mkdir()
    shutil.copy(mid, split / "mid-00001-of-00002.gguf")
    shutil.copy(mid, split / "mid-00002-of-00002.gguf")
    (lm / "pub" / "half").mkdir()
    shutil.copy(mid, lm / "pub" / "half" / "half-00001-of-00003.gguf")

    lc = base / "llamacpp"
    lc.mkdir()
    shutil.copy(spm, lc / "org_spm-GGUF_spm.gguf")
    (lc / "org_spm-GGUF_spm.gguf.etag").write_text("x")
    (lc / "manifest=org=spm-GGUF=latest.json").write_text("{}")

    folder = base / "folder"
    (folder / "a" / "b").mkdir(parents=True)
    shutil.copy(unlabelled_big, folder / "a" / "ub.gguf")
    shutil.copy(unlabelled_small, folder / "a" / "b" / "us.gguf")
    (folder / "a" / "b" / "back").symlink_to(folder)  # a folder loop
    return base


def roots(tree: Path, **kw) -> Roots:
    args = {"ollama": (tree / "ollama",), "lmstudio": (tree / "lmstudio", tree / "no-such-store"),
            "hf": (tree / "hf",), "llamacpp": (tree / "llamacpp",), "folders": (tree / "folder",)}
    args.update(kw)
    return Roots(**args)


@pytest.fixture(scope="module")
def scanned(tree: Path) -> stores.Scan:
    return stores.scan(roots(tree))


def by_name(scan: stores.Scan) -> dict[str, stores.FoundModel]:
    return {m.name: m for m in scan.models}


def snapshot(tree: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st_ = os.lstat(p)
            out[p] = (st_.st_size, st_.st_mtime_ns)
    return out


def test_listing(scanned: stores.Scan, tree: Path):
    found = by_name(scanned)
    folder = tree / "folder" / "a"
    assert list(found) == [
        "ollama:hf.co/org/renamed-GGUF:Q4",
        "ollama:tiny:1.5b",
        "ollama:someone/tiny:0.5b",
        "lmstudio:pub/linked/tiny-1.5b.gguf",
        "lmstudio:pub/split/mid-00001-of-00002.gguf",
        "lmstudio:pub/tiny-GGUF/tiny-pad-0.5b.gguf",
        "llamacpp:org_spm-GGUF_spm.gguf",
        str(folder / "ub.gguf"),
        str(folder / "b" / "us.gguf"),
    ]
    assert [m.store for m in scanned.models] == ["ollama"] * 3 + ["lmstudio"] * 3 + ["llamacpp", "folder", "folder"]
    assert {m.architecture for m in scanned.models} == {"llama"}
    assert found["ollama:tiny:1.5b"].aliases == ["ollama:tiny:latest"]
    assert found["ollama:tiny:1.5b"].path.parent == tree / "ollama" / "blobs"
    assert found["lmstudio:pub/linked/tiny-1.5b.gguf"].aliases == ["hf:org/tiny-GGUF/tiny-1.5b.gguf"]
    assert found["ollama:tiny:1.5b"].parameters == 1_500_000_000
    assert found["ollama:someone/tiny:0.5b"].label() == "0.5B"
    assert found[str(folder / "ub.gguf")].parameters is None
    split = found["lmstudio:pub/split/mid-00001-of-00002.gguf"]
    assert split.size == 2 * split.path.stat().st_size
    prints = {name: m.fingerprint for name, m in found.items()}
    bpe = prints["ollama:tiny:1.5b"]
    assert bpe is not None and len(bpe) == 16
    same = {n for n, p in prints.items() if p == bpe}
    assert same == set(found) - {"ollama:hf.co/org/renamed-GGUF:Q4", "llamacpp:org_spm-GGUF_spm.gguf",
                                 "lmstudio:pub/tiny-GGUF/tiny-pad-0.5b.gguf"}
    assert len(set(prints.values())) == 4
    assert found["lmstudio:pub/tiny-GGUF/tiny-pad-0.5b.gguf"].n_tokens == N_TOKENS + 29
    assert all(m.n_tokens == N_TOKENS for n, m in found.items() if n in same)


def test_broken_entries_are_skipped_with_reasons(tree: Path):
    lines: list[str] = []
    scan = stores.scan(roots(tree), say=lines.append)
    assert lines == [str(s) for s in scan.skipped]
    reasons = {s.where: s.why for s in scan.skipped}
    expected = {
        "ollama:gone:1b": "missing",
        "ollama:broken:1b": "not JSON",
        "lmstudio:pub/bad/truncated.gguf": "truncated",
        "lmstudio:pub/bad/notes.gguf": "not a GGUF file",
        "lmstudio:pub/bad/loop.gguf": "symlink loop",
        "lmstudio:pub/bad/dangling.gguf": "dangling symlink",
        "lmstudio:pub/half/half-00001-of-00003.gguf": "half-00002-of-00003.gguf, half-00003-of-00003.gguf are missing",
        "lmstudio:pub/tiny-GGUF/mmproj-tiny-f16.gguf": "vision projector (mmproj), loaded with the model",
    }
    for where, needle in expected.items():
        assert needle in reasons.get(where, ""), (where, reasons)
    assert set(reasons) == set(expected)  # the missing store and the folder loop are not errors
    assert "ollama pull gone:1b" in reasons["ollama:gone:1b"]
    assert str(tree / "lmstudio" / "pub" / "bad" / "truncated.gguf") in reasons["lmstudio:pub/bad/truncated.gguf"]


def test_scan_writes_nothing(tree: Path):
    before = snapshot(tree)
    stores.scan(roots(tree))
    assert snapshot(tree) == before


def test_missing_stores_are_silent(tmp_path: Path):
    none = tmp_path / "none"
    scan = stores.scan(Roots(ollama=(none,), lmstudio=(none,), hf=(none,), llamacpp=(none,)))
    assert scan.models == [] and scan.skipped == []
    named = stores.scan(Roots(), folders=[none])
    assert [s.where for s in named.skipped] == [str(none)]  # a folder the user named is worth a line


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every folder")
def test_unreadable_store_is_reported(tmp_path: Path):
    store = tmp_path / "ollama"
    (store / "manifests").mkdir(parents=True)
    (store / "manifests").chmod(0)
    try:
        scan = stores.scan(Roots(ollama=(store,)))
    finally:
        (store / "manifests").chmod(0o755)
    assert [s.where for s in scan.skipped] == [str(store / "manifests")]
    assert "permission" in scan.skipped[0].why


def test_pairing(scanned: stores.Scan, tree: Path):
    pairs = pairing.pair_models(scanned.models)
    assert pairs, "nothing paired"
    named = [(p.target.name, p.draft.name) for p in pairs]
    incompatible = {"ollama:hf.co/org/renamed-GGUF:Q4", "llamacpp:org_spm-GGUF_spm.gguf"}
    assert not incompatible & {n for pair in named for n in pair}
    for p in pairs:
        ok = compare(read_vocab(p.target.path), read_vocab(p.draft.path))
        assert ok.ok and ok.padded == p.padded
    drafts = [d for t, d in named if t == "ollama:tiny:1.5b"]
    us = str(tree / "folder" / "a" / "b" / "us.gguf")
    # the exact 0.5B draft first, then the exact unlabelled one (compared by file size), the padded one last;
    # the 1B split model is not 3x smaller than 1.5B
    assert drafts == ["ollama:someone/tiny:0.5b", us, "lmstudio:pub/tiny-GGUF/tiny-pad-0.5b.gguf"]
    first = next(p for p in pairs if p.target.name == "ollama:tiny:1.5b")
    assert first.reason == f"same vocabulary (BPE, {N_TOKENS} tokens); draft 0.5B is 3x smaller than 1.5B"
    padded = next(p for p in pairs if p.draft.name.endswith("tiny-pad-0.5b.gguf"))
    assert padded.reason.startswith(f"same vocabulary except padding (BPE, {N_TOKENS} and {N_TOKENS + 29} tokens)")
    by_size = next(p for p in pairs if p.target.name == str(tree / "folder" / "a" / "ub.gguf"))
    assert "draft file" in by_size.reason and "smaller than" in by_size.reason
    assert ("lmstudio:pub/split/mid-00001-of-00002.gguf", "ollama:someone/tiny:0.5b") not in named
    # no model drafts for itself or for a model of its own size
    assert all(p.target.path != p.draft.path for p in pairs)
    assert ("ollama:tiny:1.5b", "lmstudio:pub/linked/tiny-1.5b.gguf") not in named


def test_find_draft(scanned: stores.Scan, tree: Path, tiny_dir: Path):
    target = by_name(scanned)["ollama:tiny:1.5b"]
    best = pairing.find_draft(target.path, scanned.models)
    assert best is not None and best.draft.name == "ollama:someone/tiny:0.5b"
    # the same file by another path (the HF snapshot's symlink) is recognised as the scanned model
    linked = pairing.find_draft(tree / "hf" / "models--org--tiny-GGUF" / "snapshots" / REV / "tiny-1.5b.gguf",
                               scanned.models)
    assert linked is not None and linked.target.name == "lmstudio:pub/linked/tiny-1.5b.gguf"
    # a file outside every store: read on the spot; no label, so sizes decide
    outside = pairing.find_draft(tiny_dir / "target.gguf", scanned.models)
    assert outside is not None and outside.draft.name == "ollama:someone/tiny:0.5b"
    renamed = pairing.find_draft(tiny_dir / "renamed.gguf", scanned.models)  # only its own kind fits
    assert renamed is not None and renamed.draft.name == "ollama:hf.co/org/renamed-GGUF:Q4"
    assert pairing.find_draft(tree / "src" / "spm.gguf", scanned.models) is None
    small = by_name(scanned)["ollama:someone/tiny:0.5b"]
    assert pairing.find_draft(small, scanned.models) is None  # nothing is 3x smaller than the smallest
    with pytest.raises(ModelFileError, match="not a GGUF"):
        pairing.find_draft(tree / "lmstudio" / "pub" / "bad" / "notes.gguf", scanned.models)
    second = pairing.find_draft(tree / "lmstudio" / "pub" / "split" / "mid-00002-of-00002.gguf", scanned.models,
                               min_ratio=1.5)  # a later part stands for its split model
    assert second is not None and second.target.name == "lmstudio:pub/split/mid-00001-of-00002.gguf"
    assert second.draft.name == "ollama:someone/tiny:0.5b" and "2x smaller than 1B" in second.reason


def test_resolve_name(scanned: stores.Scan, tree: Path):
    r = roots(tree)
    found = by_name(scanned)
    for name, m in found.items():
        if stores.is_store_name(name):
            assert stores.resolve_name(name, roots=r) == m.path, name  # from the stores alone
        assert stores.resolve_name(name, scanned.models) == m.path
    snap = tree / "hf" / "models--org--tiny-GGUF" / "snapshots" / REV
    assert stores.resolve_name("hf:org/tiny-GGUF/tiny-1.5b.gguf", roots=r) == snap / "tiny-1.5b.gguf"
    assert stores.resolve_name("hf:org/tiny-GGUF/tiny-1.5b.gguf@" + REV[:12], roots=r) == snap / "tiny-1.5b.gguf"
    assert stores.resolve_name("ollama:tiny", roots=r) == found["ollama:tiny:1.5b"].path  # :latest
    assert stores.resolve_name("ollama:registry.ollama.ai/library/tiny:1.5b", roots=r) == found["ollama:tiny:1.5b"].path
    assert stores.resolve_name("ollama:tiny:latest", scanned.models) == found["ollama:tiny:1.5b"].path  # an alias


@pytest.mark.parametrize("ref, error, needle", [
    ("ollama:qwen2.5-coder:7b", ModelFileError, "ollama pull qwen2.5-coder:7b"),
    ("ollama:gone:1b", ModelFileError, "missing"),
    ("hf:org/other-GGUF/x.gguf", ModelFileError, "localspec pull NAME --target hf:org/other-GGUF/x.gguf"),
    ("hf:org/tiny-GGUF/x.gguf@" + "f" * 12, ModelFileError, "localspec pull NAME --target hf:org/tiny-GGUF/x.gguf"),
    ("lmstudio:pub/nope.gguf", ModelFileError, "LM Studio"),
    ("llamacpp:nope.gguf", ModelFileError, "llama.cpp's cache"),
    ("hf:org/only-two", ConfigError, "not a valid model name"),
    ("lmstudio:../../etc/passwd", ConfigError, "not a valid model name"),
    ("ollama:a/b/c/d:tag", ConfigError, "not a valid Ollama model name"),
    ("s3:bucket/file.gguf", ConfigError, "not a model name localspec knows"),
])
def test_resolve_name_errors(tree: Path, ref: str, error: type, needle: str):
    with pytest.raises(error) as info:
        stores.resolve_name(ref, roots=roots(tree))
    assert needle in str(info.value)


def test_default_roots_follow_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "o"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "l"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "h"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    r = Roots.default(folders=[tmp_path / "f"])
    assert (r.ollama, r.llamacpp, r.hf, r.folders) == ((tmp_path / "o",), (tmp_path / "l",), (tmp_path / "h",),
                                                       (tmp_path / "f",))
    assert r.lmstudio == (tmp_path / "home" / ".lmstudio" / "models", tmp_path / "home" / ".cache" / "lm-studio" /
                          "models")
    monkeypatch.delenv("LLAMA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if os.name == "posix" and os.uname().sysname == "Linux":
        assert stores.llamacpp_roots() == (tmp_path / "xdg" / "llama.cpp",)


def test_llamacpp_hf_layout(tmp_path: Path, tree: Path):
    """Newer llama.cpp keeps Hugging Face's layout in its cache: listed as llamacpp:ORG/REPO/FILE."""
    lc = tmp_path / "lc"
    snap = lc / "models--org--x-GGUF" / "snapshots" / "r1"
    snap.mkdir(parents=True)
    shutil.copy(tree / "src" / "small.gguf", snap / "x.gguf")
    scan = stores.scan(Roots(llamacpp=(lc,)))
    assert [m.name for m in scan.models] == ["llamacpp:org/x-GGUF/x.gguf"]
    assert stores.resolve_name("llamacpp:org/x-GGUF/x.gguf", roots=Roots(llamacpp=(lc,))) == snap / "x.gguf"


# -- the command line: the scan, and a target without a draft ------------------------------------------------


@pytest.fixture
def stores_env(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake stores as this user's stores: every root comes from the environment, as on a real machine."""
    home = tmp_path / "user"
    (home / ".lmstudio").mkdir(parents=True)
    (home / ".lmstudio" / "models").symlink_to(tree / "lmstudio")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OLLAMA_MODELS", str(tree / "ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tree / "hf"))
    monkeypatch.setenv("LLAMA_CACHE", str(tree / "llamacpp"))
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "ls"))
    return tree


def test_models_scan_lists_pairs_and_what_was_skipped(stores_env: Path):
    r = run_cli(["models", "--scan", "--folder", str(stores_env / "folder")])
    assert r.exit_code == 0, r.output
    assert "ollama:tiny:1.5b <- ollama:someone/tiny:0.5b: same vocabulary" in r.stdout
    assert "renamed" not in r.stdout.split("pairs")[1]  # another vocabulary: listed, never paired
    add_line = next(line for line in r.stdout.splitlines() if "localspec add tiny-1.5b" in line)
    assert str(stores_env / "ollama" / "blobs") in add_line
    assert "skipped ollama:gone:1b" in r.stderr and "truncated.gguf" in r.stderr
    data = json.loads(run_cli(["models", "--scan", "--json"]).stdout)
    assert {"ollama:tiny:1.5b", "ollama:someone/tiny:0.5b"} <= {m["name"] for m in data["models"]}
    assert {"target": "ollama:tiny:1.5b", "draft": "ollama:someone/tiny:0.5b"} in [
        {k: p[k] for k in ("target", "draft")} for p in data["pairs"]]
    r = run_cli(["models", "--scan", "--add"])
    assert r.exit_code == 0 and "added tiny-1.5b" in r.output
    r = run_cli(["check", "tiny-1.5b"])
    assert r.exit_code == 0 and "ok: Vocabularies match" in r.output


@pytest.mark.parametrize("how", [["-t", "ollama:tiny:1.5b"], ["ollama:tiny:latest"]])
def test_a_target_alone_gets_the_draft_found_on_this_machine(stores_env: Path, how: list[str]):
    base = ["generate", *how, "-p", "the cat sat on the mat", "-n", "12", "--json", "--threads", "1"]
    r = run_cli([*base, "--method", "draft", "--k", "2"])
    assert r.exit_code == 0, r.output
    assert "drafting with ollama:someone/tiny:0.5b: same vocabulary" in r.stderr
    assert json.loads(r.stdout)["stats"]["draft_model_tokens"] > 0  # the draft model ran
    plain = run_cli([*base, "--method", "plain"])
    assert "drafting with" not in plain.stderr  # plain decoding needs no draft, so none is looked for
    assert json.loads(plain.stdout)["tokens"] == json.loads(r.stdout)["tokens"]
    r = run_cli([*base, "--method", "draft", "--draft", "none"])
    assert r.exit_code == 1 and "drafting with" not in r.stderr and "draft model" in r.output


def test_a_target_with_no_draft_on_this_machine_says_so_and_what_to_do(stores_env: Path):
    r = run_cli(["generate", "-t", "ollama:hf.co/org/renamed-GGUF:Q4", "-p", "hi", "-n", "4"])
    assert r.exit_code == 0, r.output
    assert "no model on this machine can draft for" in r.stderr and "localspec pull NAME --target" in r.stderr
    r = run_cli(["generate", "-t", "ollama:nothing:here", "-p", "hi"])
    assert r.exit_code == 1 and "ollama pull nothing:here" in r.output


def test_hostile_manifests_and_odd_split_names_are_skipped_not_fatal(tmp_path: Path, tiny_dir: Path):
    """A manifest nested 200,000 deep, one that is a FIFO or never ends, and split names with no parts."""
    ol = tmp_path / "ollama"
    ollama_model(ol, ("registry.ollama.ai", "library", "deep", "1b"), None, text="[" * 200_000)
    fifo = ol / "manifests" / "registry.ollama.ai" / "library" / "fifo" / "1b"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    endless = ol / "manifests" / "registry.ollama.ai" / "library" / "zero" / "1b"
    endless.parent.mkdir(parents=True)
    endless.symlink_to("/dev/zero")
    folder = tmp_path / "f"
    folder.mkdir()
    shutil.copy(tiny_dir / "target.gguf", folder / "x-00002-of-00000.gguf")
    shutil.copy(tiny_dir / "target.gguf", folder / "y-00003-of-00002.gguf")
    found = stores.scan(Roots(ollama=(ol,), folders=(folder,)))
    why = {k.where: k.why for k in found.skipped}
    assert "not JSON" in why["ollama:deep:1b"]
    assert "not a regular file" in why["ollama:fifo:1b"] and "not a regular file" in why["ollama:zero:1b"]
    assert sorted(m.path.name for m in found.models) == ["x-00002-of-00000.gguf", "y-00003-of-00002.gguf"]
    assert pairing.find_draft(folder / "x-00002-of-00000.gguf", found.models) is None


def test_chat_with_a_model_alone_and_draft_none(stores_env: Path):
    r = run_cli(["chat", "ollama:tiny:1.5b", "-n", "4", "--method", "draft"],
                           input="hi\n/stats\n/exit\n")
    assert r.exit_code == 0, r.output
    assert "drafting with ollama:someone/tiny:0.5b" in r.stderr and "draft" in r.stdout
    r = run_cli(["check", "-t", "ollama:tiny:1.5b", "-d", "ollama:someone/tiny:0.5b"])
    assert r.exit_code == 0 and "ok: Vocabularies match" in r.output  # scan names work in check too
    run_cli(["models", "--scan", "--add"])
    r = run_cli(["generate", "tiny-1.5b", "-p", "hi", "-n", "4", "--draft", "none", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["stats"]["draft_model_tokens"] == 0, r.output
    r = run_cli(["generate", "tiny-1.5b", "-p", "hi", "--draft", "x.gguf"])
    assert r.exit_code == 2 and "brings its own draft" in r.output


def test_pair_names_from_a_scan_are_unique_and_added_once(stores_env: Path, tmp_path: Path, tiny_dir: Path):
    for sub in ("a", "b"):  # two targets with the same file name, each with a draft beside it
        d = tmp_path / "more" / sub
        d.mkdir(parents=True)
        shutil.copy(stores_env / "src" / "big.gguf", d / "same.gguf")
        shutil.copy(stores_env / "src" / "small.gguf", d / "little.gguf")
    args = ["models", "--scan", "--folder", str(tmp_path / "more" / "a"), "--folder", str(tmp_path / "more" / "b")]
    out = run_cli(args).stdout
    assert "localspec add same " in out and "localspec add same-2 " in out
    first = run_cli([*args, "--add"])
    assert "added same " in first.output and "added same-2 " in first.output
    again = run_cli([*args, "--add"])
    assert "added" not in again.output and "same is registered already" in again.output


# -- the same names through the Python API ---------------------------------------------------------------


def test_load_takes_a_store_name_and_finds_the_draft_on_disk(stores_env: Path):
    import localspec

    notes: list[str] = []
    with localspec.load("ollama:tiny:1.5b", "auto", notify=notes.append) as pair:
        assert pair.draft is not None and pair.draft.path == stores.resolve_name("ollama:someone/tiny:0.5b")
        r = pair.generate("the cat sat on the mat", max_tokens=12, method="draft", k=2)
        plain = pair.generate("the cat sat on the mat", max_tokens=12, method="plain")
        assert r.tokens == plain.tokens and r.stats.draft_model_tokens > 0
    assert any("drafting with ollama:someone/tiny:0.5b: same vocabulary" in n for n in notes)
    with localspec.load("ollama:tiny:1.5b") as pair:  # a model alone: no draft unless asked for
        assert pair.draft is None


def test_load_takes_a_registered_pair_name(stores_env: Path):
    import localspec
    from localspec.catalog.hub import resolve
    from localspec.catalog.registry import get_pair

    assert run_cli(["models", "--scan", "--add"]).exit_code == 0  # registers tiny-1.5b
    files = resolve(get_pair("tiny-1.5b"))
    with localspec.load("tiny-1.5b") as pair:
        assert pair.target.path == files.target and pair.draft is not None and pair.draft.path == files.draft
    with localspec.load("tiny-1.5b", "none") as pair:
        assert pair.draft is None
    with pytest.raises(localspec.ConfigError, match="brings its own draft"):
        localspec.load("tiny-1.5b", "some-draft.gguf")
    with pytest.raises(localspec.LocalspecError, match="No model pair named 'no-such-pair'"):
        localspec.load("no-such-pair")


def test_pair_names_drop_the_quantization_tag_unless_another_pair_has_that_name():
    assert pairing.pair_name("hf:org/Repo/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf") == "qwen2.5-coder-1.5b-instruct"
    assert pairing.pair_name("ollama:tiny:1.5b") == "ollama-tiny-1.5b"
    assert pairing.pair_name("x/model-Q8_0.gguf", ["model"]) == "model-q8_0"
    assert pairing.pair_name("x/model-Q8_0.gguf", ["model", "model-q8_0"]) == "model-q8_0-2"
    assert pairing.pair_name("same.gguf", ["same"]) == "same-2"
    assert pairing.pair_name("???.gguf") == "model"


def test_an_embedding_model_found_is_marked_as_one_and_never_paired(stores_env: Path):
    from tinyarch import write_tiny_bert

    folder = stores_env / "folder"
    write_tiny_bert(folder / "bert-embed.gguf", seed=3)
    write_tiny_bert(folder / "bert-rank.gguf", seed=5, pooling="rank")
    r = run_cli(["models", "--scan", "--folder", str(folder)])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.stdout.splitlines() if "bert-embed.gguf" in x)
    assert "embedding model (serve --embedding-model)" in line
    assert "reranker model (serve --rerank-model)" in next(x for x in r.stdout.splitlines() if "bert-rank" in x)
    assert "bert-" not in r.stdout.split("pairs")[1]
    data = json.loads(run_cli(["models", "--scan", "--folder", str(folder), "--json"]).stdout)
    roles = {Path(m["path"]).name: m["role"] for m in data["models"]}
    assert roles["bert-embed.gguf"] == "embedding" and roles["bert-rank.gguf"] == "reranker"
