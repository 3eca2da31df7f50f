"""The history store and drafter: matching, persistence, damage, concurrency, privacy, exactness, controls."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clirun import run_cli
from helpers import same_distribution, token_counts

import localspec
from localspec.drafting.costs import CostProfile
from localspec.drafting.history import HistoryIndex, HistoryStore, list_stores
from localspec.drafting.history.drafter import HistoryDrafter
from localspec.drafting.history.index import MAX_MATCH, MIN_AGREEMENT

GPU = CostProfile.synthetic([1.0 + 0.02 * n for n in range(9)], 0.1, name="gpu-like")
PROMPT = "The cat sat on the mat and the dog sat on the"


# -- the index against a brute-force search -----------------------------------------------------


def _brute_match(corpus: np.ndarray, context: np.ndarray) -> tuple[int, set[int]]:
    best, ends = 0, set()
    for p in range(len(corpus)):
        n = 0
        while n < min(MAX_MATCH, len(context)) and p - n >= 0 and corpus[p - n] == context[len(context) - 1 - n]:
            n += 1
        if n > best:
            best, ends = n, {p}
        elif n == best and n > 0:
            ends.add(p)
    return (best, ends) if best >= 2 else (0, set())


def _brute_continuation(corpus: np.ndarray, ends: set[int], k: int) -> list[int]:
    out: list[int] = []
    pos = sorted(ends)
    while len(out) < k and pos:
        nxt = [int(corpus[p + 1]) for p in pos]
        counts = {t: nxt.count(t) for t in set(nxt) if t >= 0}
        if not counts:
            break
        top = max(counts.values())
        if len(pos) > 1 and top < MIN_AGREEMENT * len(pos):
            break
        tied = [t for t in counts if counts[t] == top]
        choice = tied[0] if len(tied) == 1 else [t for t in nxt if t in tied][-1]
        out.append(choice)
        pos = [p + 1 for p, t in zip(pos, nxt, strict=True) if t == choice]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_index_finds_the_longest_match_and_the_majority_continuation(seed):
    rng = np.random.default_rng(seed)
    vocab = 6 if seed % 2 else 30  # small vocabularies: many competing matches
    records = [rng.integers(0, vocab, size=rng.integers(1, 60)) for _ in range(25)]
    index = HistoryIndex()
    index.extend(records[:10])  # the bulk path
    for r in records[10:]:
        index.add(r)  # the incremental path
    corpus = index.corpus
    for trial in range(40):
        source = records[rng.integers(len(records))]
        cut = int(rng.integers(1, len(source) + 1))
        context = np.concatenate([rng.integers(0, vocab, size=int(rng.integers(0, 5))), source[:cut]]).astype(np.int32)
        length, ends = index.match(context)
        want_length, want_ends = _brute_match(corpus, context)
        assert length == want_length, f"trial {trial}"
        assert set(int(e) for e in ends) == want_ends
        if length:
            tokens, agreement = index.continuation(ends, 6)
            assert tokens == _brute_continuation(corpus, want_ends, 6)
            assert all(MIN_AGREEMENT <= a <= 1 for a in agreement)


def test_a_drafter_copies_a_generation_seen_before():
    index = HistoryIndex()
    seen = np.arange(100, 140, dtype=np.int32)
    index.add(seen)
    drafter = HistoryDrafter(index)
    draft = drafter.propose(np.array([7, 8, *seen[:12]], dtype=np.int32), 8, np.random.default_rng())
    assert draft.tokens == list(seen[12:20]) and draft.by == "history" and drafter.last_match == 12
    assert drafter.propose(np.array([1, 2, 3], dtype=np.int32), 8, np.random.default_rng()).tokens == []


# -- the store on disk ----------------------------------------------------------------------------


def _store(tiny_dir: Path, directory: Path, **kw) -> HistoryStore:
    warnings: list[str] = []
    store = HistoryStore(tiny_dir / "target.gguf", directory=directory, warn=warnings.append, **kw)
    store.warnings = warnings  # type: ignore[attr-defined]
    return store


def test_a_store_survives_a_restart_and_drops_the_oldest_records_past_its_limit(tiny_dir, tmp_path):
    store = _store(tiny_dir, tmp_path, limit_tokens=100)
    for i in range(12):
        store.add(list(range(i * 10, i * 10 + 10)), drafted=2, accepted=1)
    again = _store(tiny_dir, tmp_path, limit_tokens=100)
    assert again.counts.records == store.counts.records and 0 < again.counts.tokens <= 100
    assert np.array_equal(again.index.corpus, store.index.corpus)
    assert again.index.corpus[-11:-1].tolist() == list(range(110, 120))  # the newest record is kept
    assert 0 not in again.index.corpus.tolist()  # the oldest went
    assert again.counts.drafted == 2 * again.counts.records and again.counts.hit_rate == 0.5
    assert not again.warnings


def test_a_store_is_readable_by_its_user_only(tiny_dir, tmp_path):
    store = _store(tiny_dir, tmp_path / "history")
    store.add([1, 2, 3])
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "history").st_mode) == 0o700


def test_different_models_never_share_a_store_and_a_moved_copy_keeps_its_own(tiny_dir, tmp_path):
    a = HistoryStore(tiny_dir / "target.gguf", directory=tmp_path)
    b = HistoryStore(tiny_dir / "other.gguf", directory=tmp_path)
    assert a.path != b.path
    shutil.copy(tiny_dir / "target.gguf", tmp_path / "moved.gguf")
    assert HistoryStore(tmp_path / "moved.gguf", directory=tmp_path).path == a.path


@pytest.mark.parametrize("damage", ["torn last record", "flipped byte", "not a store"])
def test_a_damaged_store_is_set_aside_with_a_warning_and_rebuilt(tiny_dir, tmp_path, damage):
    store = _store(tiny_dir, tmp_path)
    for i in range(5):
        store.add([i] * 20)
    data = bytearray(store.path.read_bytes())
    if damage == "torn last record":
        data = data[:-7]
    elif damage == "flipped byte":
        data[-104 - 50] ^= 0xFF  # inside the fourth record's tokens (records are 24 + 80 bytes)
    else:
        data = bytearray(b"hello, not a history file")
    store.path.write_bytes(bytes(data))
    again = _store(tiny_dir, tmp_path)
    assert len(again.warnings) == 1 and "moved to" in again.warnings[0] and "\n" not in again.warnings[0]
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 1
    want = {"torn last record": 4, "flipped byte": 3, "not a store": 0}[damage]
    assert again.counts.records == want  # the records before the damage are kept
    assert again.counts.bytes == again.path.stat().st_size
    again.add([9] * 20)
    assert _store(tiny_dir, tmp_path).counts.records == want + 1  # and the rebuilt store works


def test_a_store_of_another_format_version_is_set_aside_and_started_afresh(tiny_dir, tmp_path):
    store = _store(tiny_dir, tmp_path)
    store.add([1, 2, 3, 4])
    data = bytearray(store.path.read_bytes())
    data[6] = 99  # the version field
    store.path.write_bytes(bytes(data))
    again = _store(tiny_dir, tmp_path)
    assert "format version 99" in again.warnings[0] and again.counts.records == 0


_WRITER = """
import sys
from pathlib import Path
from localspec.drafting.history import HistoryStore
store = HistoryStore(Path(sys.argv[1]), directory=Path(sys.argv[2]))
for i in range(40):
    store.add([int(sys.argv[3])] * 5 + [i] * 5)
"""


def test_two_processes_writing_at_once_lose_nothing(tiny_dir, tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tiny_dir / "target.gguf"), str(tmp_path), str(w)])
             for w in (1000, 2000)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    store = _store(tiny_dir, tmp_path)
    assert store.counts.records == 80 and not store.warnings
    corpus = store.index.corpus.tolist()
    assert corpus.count(1000) == corpus.count(2000) == 200


# -- generation with history: exact, learns, can be turned off ------------------------------------


@pytest.fixture
def history_pair(tiny_dir, tmp_path):
    pair = localspec.load(tiny_dir / "target.gguf", tiny_dir / "draft.gguf", n_ctx=1024, history=False)
    pair.set_history(HistoryStore(pair.target.path, directory=tmp_path))
    pair.set_profile(GPU)
    yield pair
    pair.close()


def test_greedy_with_history_equals_plain_decoding_and_a_repeat_is_drafted_from_history(history_pair):
    plain = history_pair.generate(PROMPT, max_tokens=80, method="plain", history=False)
    first = history_pair.generate(PROMPT, max_tokens=80, method="history", k=6)
    assert first.tokens == plain.tokens and first.stats.drafted == 0  # nothing recorded yet
    again = history_pair.generate(PROMPT, max_tokens=80, method="history", k=6)
    assert again.tokens == plain.tokens
    assert again.stats.accepted_by["history"] > 60
    auto = history_pair.generate(PROMPT, max_tokens=80)
    assert auto.tokens == plain.tokens and auto.stats.auto.rounds["history"] > 0


def test_wrong_history_is_rejected_and_the_output_stays_exact(history_pair):
    prompts = (PROMPT, "def add(a, b):")
    plains = [history_pair.generate(p, max_tokens=60, method="plain", history=False) for p in prompts]
    for prompt, plain in zip(prompts, plains, strict=True):  # the real continuation, every 7th token wrong
        wrong = [t if i % 7 != 3 else (t + 1) % 200 for i, t in enumerate(plain.tokens)]
        history_pair.history.add(history_pair.tokenize(prompt) + wrong)
    for prompt, plain in zip(prompts, plains, strict=True):
        r = history_pair.generate(prompt, max_tokens=60, method="history", k=4, history=True)
        assert r.tokens == plain.tokens
        assert r.stats.rejected_rounds > 0 and r.stats.accepted > 0


def test_sampled_history_drafts_keep_the_plain_distribution(history_pair):
    prompt = "in the end, in the end, in the end, in the"
    for seed in range(30):  # history of the target's own samples: often right, often wrong
        history_pair.generate(prompt, max_tokens=12, temperature=1.0, seed=1000 + seed, method="plain")
    n = 2000
    for position in (1, 3):
        plain = token_counts(history_pair, prompt, n, position, method="plain", history=False)
        spec = token_counts(history_pair, prompt, n, position, method="history", k=3)
        p = same_distribution(plain, spec)
        assert p > 1e-3, f"position {position}: chi-square p = {p:.2e}"
    runs = [history_pair.generate(prompt, max_tokens=4, temperature=1.0, seed=s, method="history", k=3).stats
            for s in range(50)]  # the runs above were checked at positions that history drafted, right and wrong
    assert 0 < sum(r.accepted_by.get("history", 0) for r in runs) < sum(r.drafted_by.get("history", 0) for r in runs)


def test_history_off_for_a_call_neither_drafts_nor_records(history_pair):
    history_pair.generate(PROMPT, max_tokens=40, method="plain")
    records = history_pair.history.counts.records
    r = history_pair.generate(PROMPT, max_tokens=40, history=False)
    assert "history" not in r.stats.drafted_by and history_pair.history.counts.records == records
    with pytest.raises(localspec.ConfigError, match="history"):
        history_pair.generate(PROMPT, max_tokens=4, method="history", history=False)


def test_the_environment_turns_history_off_everywhere(tiny_dir, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HISTORY", "off")
    with localspec.load(tiny_dir / "target.gguf", n_ctx=256) as pair:
        assert pair.history is None
    monkeypatch.setenv("LOCALSPEC_HISTORY", "on")
    with localspec.load(tiny_dir / "target.gguf", n_ctx=256) as pair:
        assert pair.history is not None


def test_a_chat_turn_records_only_what_the_cache_did_not_hold(history_pair):
    messages = [{"role": "user", "content": "hello there"}]
    first = history_pair.chat(messages, max_tokens=20, method="plain")
    turn1 = history_pair.history.counts.tokens
    assert turn1 == first.stats.prompt_tokens + len(first.tokens)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "and again"}]
    second = history_pair.chat(messages, max_tokens=20, method="plain")
    added = history_pair.history.counts.tokens - turn1
    assert second.stats.cached_prompt_tokens > 0
    assert added == second.stats.prompt_tokens - second.stats.cached_prompt_tokens + len(second.tokens)


# -- the command line ------------------------------------------------------------------------------


def test_history_command_shows_and_clears_the_store(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    monkeypatch.setenv("LOCALSPEC_HISTORY", "on")
    t = str(tiny_dir / "target.gguf")
    assert "no history yet" in run_cli(["history"]).output
    base = ["generate", "-t", t, "-p", PROMPT, "-n", "30", "--threads", "1"]
    assert run_cli([*base, "--no-history"]).exit_code == 0
    assert "no history yet" in run_cli(["history"]).output  # --no-history records nothing
    assert run_cli(base).exit_code == 0
    out = run_cli(["history"]).output
    assert "target.gguf: 1 generations" in out
    assert list_stores(tmp_path / "history")[0][2].records == 1
    store = list_stores(tmp_path / "history")[0][0]
    aside = store.with_name(store.name + ".corrupt-20260101-000000")  # as a damaged store is set aside
    aside.write_bytes(b"damaged")
    out = run_cli(["history"]).output
    assert "target.gguf: 1 generations" in out and "set aside as damaged" in out and str(aside) in out
    rows = json.loads(run_cli(["history", "--json"]).output)
    assert [r["set_aside"] for r in rows] == [False, True] and rows[1]["file"] == str(aside)
    assert run_cli(["history", "clear", "--yes"]).exit_code == 0
    assert "no history yet" in run_cli(["history"]).output and not aside.exists()


def test_an_unwritable_history_directory_costs_a_warning_not_the_reply(tiny_dir, tmp_path, monkeypatch):
    if os.geteuid() == 0:
        blocked = tmp_path / "home"
        blocked.write_text("a file where the localspec home should be")  # even root cannot mkdir under a file
    else:
        blocked = tmp_path / "home"
        blocked.mkdir(mode=0o500)
    monkeypatch.setenv("LOCALSPEC_HOME", str(blocked))
    notes: list[str] = []
    with localspec.load(tiny_dir / "target.gguf", n_ctx=256, history=True) as pair:
        pair.notify = notes.append
        plain = pair.generate(PROMPT, max_tokens=10, method="plain", history=False)
        r = pair.generate(PROMPT, max_tokens=10, method="plain")
        assert r.tokens == plain.tokens and pair.history is None
    off = [n for n in notes if "history is off" in n]
    assert len(off) == 1 and "\n" not in off[0]
    assert any("could not cache" in n for n in notes)  # the thread sweep could not be cached either: no failure
