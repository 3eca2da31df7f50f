"""The prompt cache: a restored state gives the tokens the live context gives, on every memory kind; damaged,
foreign and half-written disk entries are never loaded; the budgets hold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tinyarch import write_tiny_gemma2, write_tiny_lfm2, write_tiny_mamba, write_tiny_qwen35

import localspec
from localspec.prompt_cache import files as cache_files
from localspec.prompt_cache.cache import MAX_REFUSALS, PromptCache
from localspec.prompt_cache.index import PrefixIndex
from localspec.runtime.model import Model

WRITERS = {"mamba": write_tiny_mamba, "qwen35": write_tiny_qwen35, "lfm2": write_tiny_lfm2,
           "gemma2": write_tiny_gemma2}
SYSTEM_A = "You are a careful assistant who answers in short sentences. " * 12
SYSTEM_B = "Another system prompt, about cats and mats and other things entirely. " * 12
METHODS = [("plain", None), ("lookup", 3), ("draft", 3), ("auto", None)]


def conversation(system: str, user: str, reply: str = "", follow: str = "") -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    if follow:
        msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow}]
    return msgs


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> dict[str, tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("cachearch")
    out = {"llama": (tiny_dir / "target.gguf", tiny_dir / "draft.gguf")}
    for name, write in WRITERS.items():
        write(d / f"{name}.gguf", seed=0)
        write(d / f"{name}-draft.gguf", seed=0, noise=0.35)
        out[name] = (d / f"{name}.gguf", d / f"{name}-draft.gguf")
    return out


def interleaved(pair, method: str, k, **options) -> list[list[int]]:
    """A1 B1 A2 B2: two conversations taking turns, each follow-up resending its whole conversation."""
    a1 = pair.chat(conversation(SYSTEM_A, "in the end, in the end, in the end"), max_tokens=12, method=method,
                   k=k, **options)
    b1 = pair.chat(conversation(SYSTEM_B, "the cat sat on the mat"), max_tokens=12, method=method, k=k, **options)
    a2 = pair.chat(conversation(SYSTEM_A, "in the end, in the end, in the end", a1.text, "and then?"),
                   max_tokens=12, method=method, k=k, **options)
    b2 = pair.chat(conversation(SYSTEM_B, "the cat sat on the mat", b1.text, "where?"), max_tokens=12,
                   method=method, k=k, **options)
    return [r.tokens for r in (a1, b1, a2, b2)] + [[r.stats.restored_prompt_tokens for r in (a1, b1, a2, b2)]]


@pytest.mark.parametrize("arch", ["llama", *WRITERS])
def test_interleaved_conversations_restored_from_ram_and_disk_give_the_live_contexts_tokens(models, tmp_path, arch):
    target, draft = models[arch]
    with localspec.load(target, draft, n_ctx=2048, prompt_cache=False) as live:
        expected = {m: interleaved(live, m, k)[:4] for m, k in METHODS}
    cache = PromptCache(64 * 2**20, tmp_path / "prompts", 256 * 2**20, weigh=False)
    with localspec.load(target, draft, n_ctx=2048, prompt_cache=cache) as pair:
        for method, k in METHODS:
            *got, restored = interleaved(pair, method, k)
            assert got == expected[method], f"{arch} {method} after a restore from RAM"
            assert restored[2] > 100 and restored[3] > 100, f"{arch}: the follow-ups were not restored"
        pair.cache.flush()
    assert any((tmp_path / "prompts").rglob("*.lspc"))
    fresh = PromptCache(0, tmp_path / "prompts", 256 * 2**20, weigh=False)  # a new process: the disk tier only
    with localspec.load(target, draft, n_ctx=2048, prompt_cache=fresh) as pair:
        *got, restored = interleaved(pair, "draft", 3)
        assert got == expected["draft"] and restored[0] > 100 and fresh.stats.disk_reads > 0


@pytest.mark.parametrize("arch", ["qwen35", "mamba", "llama"])
def test_a_restore_at_a_message_boundary_followed_by_a_divergent_last_turn_is_exact(models, tmp_path, arch):
    target, draft = models[arch]
    first = conversation(SYSTEM_A, "in the end, in the end", "the end", "and then?")
    other = conversation(SYSTEM_A, "in the end, in the end", "the end", "something else entirely, cats")
    with localspec.load(target, draft, n_ctx=2048, prompt_cache=False) as live:
        want = [live.chat(m, max_tokens=12, method="draft", k=3).tokens for m in (first, other)]
    with localspec.load(target, draft, n_ctx=2048, prompt_cache=PromptCache(64 * 2**20, weigh=False)) as pair:
        pair.chat(first, max_tokens=12, method="draft", k=3)
        pair.chat(conversation(SYSTEM_B, "unrelated"), max_tokens=4, method="plain")  # the live context moves away
        r = pair.chat(other, max_tokens=12, method="draft", k=3)
        assert r.tokens == want[1]
        assert r.stats.restored_prompt_tokens > 0  # from the boundary before the last user turn


def test_a_sampled_reply_after_a_restore_is_the_same_sample(models, tmp_path):
    target, draft = models["qwen35"]
    msgs = conversation(SYSTEM_A, "in the end, in the end")
    with localspec.load(target, draft, n_ctx=2048, prompt_cache=False) as live:
        want = [live.chat(msgs, max_tokens=16, method=m, temperature=1.0, seed=s).tokens
                for m in ("plain", "draft") for s in range(3)]
    with localspec.load(target, draft, n_ctx=2048, prompt_cache=PromptCache(64 * 2**20, weigh=False)) as pair:
        got = []
        pair.chat(msgs, max_tokens=2, method="plain")  # saved once
        for m in ("plain", "draft"):
            for s in range(3):
                pair.chat(conversation(SYSTEM_B, "away"), max_tokens=2, method="plain")
                r = pair.chat(msgs, max_tokens=16, method=m, temperature=1.0, seed=s)
                assert r.stats.restored_prompt_tokens > 0
                got.append(r.tokens)
    assert got == want


def _one_entry(models, tmp_path) -> tuple[Path, list[dict[str, str]], list[int]]:
    target, _ = models["llama"]
    msgs = conversation(SYSTEM_A, "in the end")
    with localspec.load(target, n_ctx=2048, prompt_cache=PromptCache(0, tmp_path, 2**30, weigh=False)) as pair:
        tokens = pair.chat(msgs, max_tokens=8, method="plain").tokens
        pair.cache.flush()
    return target, msgs, tokens


@pytest.mark.parametrize("damage", ["flip a state byte", "truncate", "other version", "other model", "garbage"])
def test_a_damaged_or_foreign_disk_entry_is_ignored_with_one_notice_and_deleted(models, tmp_path, damage):
    target, msgs, tokens = _one_entry(models, tmp_path)
    files = sorted(tmp_path.rglob("*.lspc"))
    assert files
    damaged = {}
    for f in files:
        raw = bytearray(f.read_bytes())
        if damage == "flip a state byte":
            raw[-100] ^= 0xFF
        elif damage == "truncate":
            raw = raw[: len(raw) // 2]
        elif damage == "other version":
            raw[4:8] = (cache_files.FORMAT_VERSION + 1).to_bytes(4, "little")
        elif damage == "other model":
            n = int.from_bytes(raw[8:12], "little")
            header = json.loads(raw[12 : 12 + n])
            header["identity"] = header["identity"].replace("ngl=", "ngl=9")
            new = json.dumps(header).encode()
            raw = raw[:8] + len(new).to_bytes(4, "little") + new + raw[12 + n :]
        else:
            raw = bytearray(os.urandom(len(raw)))
        f.write_bytes(bytes(raw))
        damaged[f] = bytes(raw)
    notices: list[str] = []
    cache = PromptCache(0, tmp_path, 2**30, notify=notices.append, weigh=False)
    with localspec.load(target, n_ctx=2048, prompt_cache=cache) as pair:
        r = pair.chat(msgs, max_tokens=8, method="plain")
    assert r.tokens == tokens and r.stats.restored_prompt_tokens == 0
    assert len(notices) >= 1 and all("ignored and deleted" in n for n in notices)
    # every damaged file is gone (those of the same name now are this run's own saves, whole and loadable)
    left = [f for f, raw in damaged.items() if f.exists() and f.read_bytes() == raw]
    if damage == "flip a state byte":  # a whole header: found out when its state is read, for this prompt's
        assert len(left) < len(damaged)
    else:  # found out by its header, when the model's files are first listed
        assert not left


def test_a_process_killed_while_saving_leaves_no_entry_that_loads(models, tmp_path):
    target, _ = models["llama"]
    script = f"""
import os, sys, time
import localspec
from localspec.prompt_cache.cache import PromptCache
real = os.fsync
def slow(fd):
    print("writing", flush=True)
    time.sleep(60)
os.fsync = slow
cache = PromptCache(0, {str(tmp_path)!r}, 2**30, weigh=False)
with localspec.load({str(target)!r}, n_ctx=2048, prompt_cache=cache) as pair:
    pair.generate({SYSTEM_A!r}, max_tokens=2, method="plain")
    cache.flush()
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    left = list(tmp_path.rglob("*.tmp"))
    assert left and not any(tmp_path.rglob("*.lspc"))
    for f in left:  # as if the kill were long ago: a later process removes what the write left behind
        os.utime(f, (time.time() - 3600, time.time() - 3600))
    notices: list[str] = []
    cache = PromptCache(0, tmp_path, 2**30, notify=notices.append, weigh=False)
    with localspec.load(target, n_ctx=2048, prompt_cache=cache) as pair:
        r = pair.generate(SYSTEM_A, max_tokens=4, method="plain")
    assert r.stats.restored_prompt_tokens == 0 and not notices
    assert not any(f.exists() for f in left)


def test_two_processes_sharing_the_disk_tier_lose_and_corrupt_nothing(models, tmp_path):
    target, _ = models["llama"]
    prompts = [f"Question {i}. " + SYSTEM_A for i in range(4)]
    script = f"""
import localspec, sys
from localspec.prompt_cache.cache import PromptCache
cache = PromptCache(0, {str(tmp_path)!r}, 2**30, weigh=False)
with localspec.load({str(target)!r}, n_ctx=2048, prompt_cache=cache) as pair:
    for p in {prompts!r}[::int(sys.argv[1])]:
        pair.generate(p, max_tokens=2, method="plain")
    cache.flush()
"""
    procs = [subprocess.Popen([sys.executable, "-c", script, step]) for step in ("1", "-1")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    notices: list[str] = []
    cache = PromptCache(0, tmp_path, 2**30, notify=notices.append, weigh=False)
    with localspec.load(target, n_ctx=2048, prompt_cache=cache) as pair:
        for p in prompts:
            assert pair.generate(p, max_tokens=2, method="plain").stats.restored_prompt_tokens > 0
    assert not notices and not any(tmp_path.rglob("*.tmp"))


def test_the_ram_budget_is_never_exceeded_and_a_shared_prefix_outlives_side_requests(models):
    target, _ = models["llama"]
    with localspec.load(target, n_ctx=2048, prompt_cache=PromptCache(2**30, weigh=False)) as probe:
        probe.generate(SYSTEM_A, max_tokens=1, method="plain")
        one = max(e.size for e in probe.cache.entries())
    cache = PromptCache(int(3.5 * one), weigh=False)
    peak = 0
    with localspec.load(target, n_ctx=2048, prompt_cache=cache) as pair:
        for i in range(8):
            pair.generate(SYSTEM_A, max_tokens=1, method="plain")  # the shared prompt, hit again and again
            pair.generate(f"side request number {i}: " + "words " * 120, max_tokens=1, method="plain")
            peak = max(peak, cache.ram_used())
        assert peak <= cache.ram_bytes
        pair.generate("something else " * 40, max_tokens=1, method="plain")
        assert pair.generate(SYSTEM_A, max_tokens=1, method="plain").stats.restored_prompt_tokens > 0


def test_a_budget_smaller_than_an_entry_or_a_full_disk_means_no_caching_with_one_notice(models, tmp_path,
                                                                                      monkeypatch):
    target, _ = models["llama"]
    notices: list[str] = []
    with localspec.load(target, n_ctx=2048, prompt_cache=PromptCache(1000, notify=notices.append, weigh=False)) as pair:
        for _ in range(3):
            assert pair.generate(SYSTEM_A, max_tokens=3, method="plain").tokens
        assert not pair.cache.entries()
    assert len(notices) == 1 and "larger than the cache's budgets" in notices[0]
    notices.clear()
    real_open = os.open

    def full(path, flags, *args, **kwargs):
        if flags & os.O_WRONLY and str(path).endswith(".tmp"):
            raise OSError(28, "No space left on device")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full)
    cache = PromptCache(0, tmp_path, 2**30, notify=notices.append, weigh=False)
    with localspec.load(target, n_ctx=2048, prompt_cache=cache) as pair:
        for i in range(3):
            assert pair.generate(SYSTEM_A + str(i), max_tokens=3, method="plain").tokens
        assert len(notices) == 1 and "No space left" in notices[0]
        assert not any(tmp_path.rglob("*.lspc")) and not any(tmp_path.rglob("*.tmp"))
        assert not cache.entries()  # nothing half-kept that would stop a later save
        monkeypatch.setattr(os, "open", real_open)  # the disk has room again
        pair.generate(SYSTEM_A + "0", max_tokens=3, method="plain")
        pair.cache.flush()
    assert any(tmp_path.rglob("*.lspc"))


def test_lookup_takes_time_linear_in_the_prompt_not_in_the_entries():
    index = PrefixIndex()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 1000, size=400).astype(np.int32) for _ in range(300)]
    for i, p in enumerate(prompts):
        index.add(i, p)
    wanted = np.concatenate([prompts[123][:300], rng.integers(0, 1000, size=50).astype(np.int32)])
    found = index.candidates(wanted)
    assert 123 in found and len(found) <= 3
    index.remove(123, prompts[123])
    assert 123 not in index.candidates(wanted)


def test_an_entry_is_never_loaded_into_a_model_of_other_settings(models, tmp_path):
    target, _ = models["llama"]
    with localspec.load(target, n_ctx=2048, prompt_cache=PromptCache(0, tmp_path, 2**30, weigh=False)) as pair:
        pair.generate(SYSTEM_A, max_tokens=2, method="plain")
        pair.cache.flush()
        identity = pair.target.state_identity()
    from localspec.runtime.model import Model

    with Model(target, n_ctx=2048, cache_type="f32") as other:
        assert other.state_identity() != identity
        cache = PromptCache(0, tmp_path, 2**30, weigh=False)
        tokens = np.asarray(other.tokenize(SYSTEM_A), dtype=np.int32)
        assert cache.restore(other, tokens[:-1]) == 0 and other.n_past == 0


def test_the_stats_say_what_the_cache_gave(models):
    target, _ = models["llama"]
    with localspec.load(target, n_ctx=2048, prompt_cache=PromptCache(2**28, weigh=False)) as pair:
        first = pair.generate(SYSTEM_A, max_tokens=2, method="plain")
        pair.generate(SYSTEM_B, max_tokens=2, method="plain")
        again = pair.generate(SYSTEM_A, max_tokens=2, method="plain")
    assert first.stats.restored_prompt_tokens == 0
    assert again.stats.restored_prompt_tokens == again.stats.cached_prompt_tokens == len(again.prompt_tokens) - 1
    assert again.tokens == first.tokens


def test_the_writer_thread_does_not_outlive_a_closed_pair(models, tmp_path):
    target, _ = models["llama"]
    with localspec.load(target, n_ctx=2048, prompt_cache=PromptCache(0, tmp_path, 2**30, weigh=False)) as pair:
        pair.generate(SYSTEM_A, max_tokens=2, method="plain")
    assert any(tmp_path.rglob("*.lspc"))  # close waited for the write
    deadline = time.monotonic() + 5
    while any(t.name == "localspec-prompt-cache" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(t.name == "localspec-prompt-cache" for t in threading.enumerate())


def test_serve_reports_cached_prompt_tokens_and_a_restart_starts_from_the_disk_tier(models, tmp_path):
    """Through the `openai` client: interleaved conversations, then the same conversation after a restart."""
    import openai
    from serverproc import ServeProcess

    target, draft = models["llama"]
    # one sequence, so that B1 takes A1's place and A2 comes back from the prompt cache (with several, A2 would
    # share the cells of the sequence that still holds A1: tests/server/test_server_parallel.py)
    args = ["-t", str(target), "-d", str(draft), "--ctx", "2048", "-m", "draft", "--parallel", "1"]
    a1 = conversation(SYSTEM_A, "in the end, in the end, in the end")
    b1 = conversation(SYSTEM_B, "the cat sat on the mat")
    server = ServeProcess(args, tmp_path)
    try:
        client = openai.OpenAI(base_url=server.url, api_key="none")
        first = client.chat.completions.create(model="target", messages=a1, max_tokens=8, temperature=0)
        client.chat.completions.create(model="target", messages=b1, max_tokens=8, temperature=0)
        a2 = a1 + [{"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "and then?"}]
        follow = client.chat.completions.create(model="target", messages=a2, max_tokens=8, temperature=0)
        cached = follow.usage.prompt_tokens_details.cached_tokens
        assert cached >= first.usage.prompt_tokens - 1  # A1's prompt came back from the cache, not from B1's
        assert follow.model_extra["timings"]["cache_n"] == cached
        assert follow.model_extra["localspec"]["restored_prompt_tokens"] > 0
        assert "prompt cache:" in server.output()
    finally:
        server.close()
    again = ServeProcess(args, tmp_path)  # a restart: the RAM tier is gone, the disk tier is not
    try:
        client = openai.OpenAI(base_url=again.url, api_key="none")
        r = client.chat.completions.create(model="target", messages=a2, max_tokens=8, temperature=0)
        assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1
        assert r.choices[0].message.content == follow.choices[0].message.content
    finally:
        again.close()


def test_a_partial_restore_on_an_attention_model_evaluates_nothing_again(models):
    target, _ = models["llama"]
    with localspec.load(target, n_ctx=2048, prompt_cache=PromptCache(2**28, weigh=False)) as pair:
        pair.generate(SYSTEM_A + " first question", max_tokens=8, method="plain")
        pair.generate(SYSTEM_B, max_tokens=2, method="plain")
        r = pair.generate(SYSTEM_A + " another question, quite different", max_tokens=8, method="plain")
        assert r.stats.restored_prompt_tokens > 500  # the shared part of the longer saved state
        assert (r.stats.rewinds, r.stats.replayed_tokens) == (0, 0)
        pair.generate(SYSTEM_A[:200], max_tokens=2, method="plain")  # and the context still cuts back anywhere
        assert pair.target.rewinds == 0


def test_the_writer_queue_counts_in_the_ram_budget(models, tmp_path):
    target, _ = models["llama"]
    with localspec.load(target, n_ctx=2048, prompt_cache=PromptCache(2**30, weigh=False)) as probe:
        probe.generate(SYSTEM_A, max_tokens=1, method="plain")
        one = max(e.size for e in probe.cache.entries())
    cache = PromptCache(int(1.5 * one), tmp_path, 2**30, weigh=False)
    peak = [0]
    real = cache_files.write

    def slow_write(*args, **kwargs):  # a slow disk: states wait in the queue
        peak[0] = max(peak[0], cache.ram_used())
        time.sleep(0.05)
        return real(*args, **kwargs)

    cache_files.write = slow_write
    try:
        with localspec.load(target, n_ctx=2048, prompt_cache=cache) as pair:
            for i in range(6):
                pair.generate(f"{i} " + SYSTEM_A, max_tokens=1, method="plain")
                peak[0] = max(peak[0], cache.ram_used())
    finally:
        cache_files.write = real
    assert 0 < peak[0] <= cache.ram_bytes
    assert len(list(tmp_path.rglob("*.lspc"))) == 6


def test_a_cache_shared_by_two_pairs_outlives_the_first_one_closed(models):
    target, _ = models["llama"]
    cache = PromptCache(2**28, weigh=False)
    with localspec.load(target, n_ctx=2048, prompt_cache=cache) as first:
        first.generate(SYSTEM_A, max_tokens=2, method="plain")
    with localspec.load(target, n_ctx=2048, prompt_cache=cache) as second:
        assert second.generate(SYSTEM_A, max_tokens=2, method="plain").stats.restored_prompt_tokens > 500


def test_a_process_with_a_smaller_context_leaves_longer_entries_alone(models, tmp_path):
    target, _ = models["llama"]
    with localspec.load(target, n_ctx=2048, prompt_cache=PromptCache(0, tmp_path, 2**30, weigh=False)) as pair:
        pair.generate(SYSTEM_A * 2, max_tokens=2, method="plain")
        pair.cache.flush()
    saved = sorted(tmp_path.rglob("*.lspc"))
    notices: list[str] = []
    cache = PromptCache(0, tmp_path, 2**30, notify=notices.append, weigh=False)
    with localspec.load(target, n_ctx=512, prompt_cache=cache) as small:
        small.generate(SYSTEM_A[:300], max_tokens=2, method="plain")
    assert not notices and all(f.exists() for f in saved)


def test_generate_called_again_with_the_same_instructions_starts_from_the_saved_state(models, tmp_path):
    """A script calling `localspec generate` over and over: each new process restores the instructions."""
    from clirun import run_cli

    target, _ = models["llama"]
    args = ["generate", "-t", str(target), "--ctx", "2048", "-m", "plain", "-n", "4", "--system", SYSTEM_A]
    first = run_cli([*args, "--message", "question one"], env={"LOCALSPEC_HOME": str(tmp_path)})
    again = run_cli([*args, "--message", "question two", "--json"], env={"LOCALSPEC_HOME": str(tmp_path)})
    stats = json.loads(again.stdout)["stats"]
    assert "prompt tokens cached" not in first.output
    assert stats["restored_prompt_tokens"] > 100 and stats["cached_prompt_tokens"] >= stats["restored_prompt_tokens"]
    off = run_cli([*args, "--message", "question two", "--json", "--cache-ram", "0", "--cache-disk", "0"],
                  env={"LOCALSPEC_HOME": str(tmp_path)})
    assert json.loads(off.stdout)["stats"]["restored_prompt_tokens"] == 0
    assert json.loads(off.stdout)["tokens"] == json.loads(again.stdout)["tokens"]


def test_the_cache_command_lists_the_saved_states_and_clear_deletes_them_damaged_ones_too(models, tmp_path):
    from clirun import run_cli

    target, _ = models["llama"]
    env = {"LOCALSPEC_HOME": str(tmp_path)}
    assert "holds nothing" in run_cli(["cache"], env=env).stdout
    run_cli(["generate", "-t", str(target), "--ctx", "2048", "-m", "plain", "-n", "2", "--message", SYSTEM_A], env=env)
    listed = json.loads(run_cli(["cache", "--json"], env=env).stdout)
    assert listed and all(e["model"] == target.name and e["tokens"] > 100 for e in listed)
    Path(listed[0]["file"]).write_bytes(b"not an entry")  # damaged: not listed, still deleted
    assert len(json.loads(run_cli(["cache", "--json"], env=env).stdout)) == len(listed) - 1
    r = run_cli(["cache", "clear", "--yes"], env=env)
    assert r.exit_code == 0 and f"({len(listed)} file" in r.stdout
    assert not list((tmp_path / "cache" / "prompts").rglob("*.lspc"))  # LOCALSPEC_HOME's cache folder
    assert "holds nothing" in run_cli(["cache"], env=env).stdout


def test_saved_states_are_readable_by_the_user_alone(tmp_path):
    """A saved state holds the prompt's tokens: 0600 files in 0700 folders, as the history store keeps its own,
    and a folder an older version left open to others is closed."""
    folder = tmp_path / "prompts"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    path = cache_files.model_folder(folder, "model-a") / "entry.state"
    cache_files.write(path, "model-a", np.arange(40, dtype=np.int32), b"state bytes")
    assert path.stat().st_mode & 0o777 == 0o600
    for d in (path.parent, path.parent.parent, folder):
        assert d.stat().st_mode & 0o777 == 0o700, d
    header, tokens = cache_files.read_header(path, "model-a")
    assert list(tokens) == list(range(40)) and cache_files.read_state(path, "model-a") == b"state bytes"


def test_a_state_refused_for_want_of_cells_beside_another_sequence_is_kept_and_restored_later(models):
    target, _ = models["llama"]
    notices: list[str] = []
    cache = PromptCache(2**28, weigh=False, notify=notices.append)
    with Model(target, n_ctx=512, n_seq=2) as shared:
        other = shared.sequence(1)
        text = shared.tokenize(SYSTEM_A + SYSTEM_B)
        wanted, busy = np.array(text[:300], dtype=np.int32), text[-300:]
        shared.eval(wanted, logits="none")
        cache.save(shared)
        shared.reset()
        other.eval(busy, logits="none")  # 300 of the 512 cells held by the other sequence: no room for 300 more
        for _ in range(MAX_REFUSALS):
            assert cache.restore(shared, wanted) == 0 and shared.n_past == 0
        assert other.n_past == len(busy) and notices and "kept" in notices[0]
        other.reset()  # the other request done: the same state now loads
        assert cache.restore(shared, wanted) == 300 and cache.stats.restores == 1
        with Model(target, n_ctx=512) as expected:
            expected.eval(wanted, logits="none")
            np.testing.assert_allclose(shared.eval([5], logits="last")[0], expected.eval([5], logits="last")[0],
                                       atol=1e-3)
        shared.reset()
        other.eval(busy, logits="none")  # refusals count in a row: one that loaded starts them again
        for _ in range(MAX_REFUSALS):
            assert cache.restore(shared, wanted) == 0
        assert cache.restore(shared, wanted) == 0 and "dropped" in notices[-1]  # one too many: a bad state
        other.reset()
        assert cache.restore(shared, wanted) == 0
