"""The chat session on tiny models: turns, cache reuse, commands, Ctrl-C; and the terminal loop."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
from clirun import run_cli

import localspec
from localspec.cli.chat_session import ChatSession, Reader
from localspec.errors import ConfigError, SamplingError
from localspec.options import GenerationOptions

OPTS = GenerationOptions(max_tokens=12, temperature=0.0, method="draft", k=3)
SUMMARY = re.compile(r"^\[\d+ tokens, [\d.]+ tok/s, [^\]]*finish: \w+\]$", re.MULTILINE)


@pytest.fixture
def session(tiny_pair):
    return ChatSession(tiny_pair, "be brief", OPTS)


def test_turns_build_the_conversation_and_reuse_the_cache(session, tiny_pair):
    r1, stopped = session.reply("hello there", lambda ev: None)
    assert not stopped and len(r1.tokens) > 0
    assert [m["role"] for m in session.messages] == ["system", "user", "assistant"]
    assert tiny_pair.target.n_past >= len(r1.prompt_tokens) + len(r1.tokens) - 2  # the cache holds the turn
    session.messages.append({"role": "user", "content": "and again"})
    next_prompt = np.asarray(tiny_pair.chat_tokens(session.messages))
    session.messages.pop()
    # Everything up to the reply is reused; the reply itself is reused as far as its
    # re-tokenised text matches the generated ids (random tiny models often differ).
    assert tiny_pair.target.common_prefix(next_prompt) >= len(r1.prompt_tokens)
    r2, _ = session.reply("and again", lambda ev: None)
    tiny_pair.target.reset()
    tiny_pair.draft.reset()
    assert tiny_pair.chat(session.messages[:-1], OPTS).text == r2.text


def test_ctrl_c_keeps_the_partial_reply_and_the_next_turn_is_exact(session, tiny_pair):
    seen = []

    def interrupt_after_three(ev):
        seen.append(ev.text)
        if len(seen) == 3:
            raise KeyboardInterrupt

    r, stopped = session.reply("tell me a long story", interrupt_after_three)
    assert stopped and len(r.tokens) == 3 and r.finish_reason == "interrupted"
    assert session.messages[-1] == {"role": "assistant", "content": "".join(seen)}
    r2, _ = session.reply("go on", lambda ev: None)
    with localspec.load(tiny_pair.target.path, tiny_pair.draft.path) as fresh:
        assert fresh.chat(session.messages[:-1], OPTS).text == r2.text


def test_ctrl_c_while_the_prompt_is_processed_drops_the_turn(session, tiny_pair, monkeypatch):
    session.reply("hello there", lambda ev: None)
    before = list(session.messages)

    def interrupted_prefill(tokens, abort=None):
        raise KeyboardInterrupt  # Ctrl-C inside the first step, before any token

    monkeypatch.setattr(tiny_pair.target, "sync", interrupted_prefill)
    with pytest.raises(KeyboardInterrupt):
        session.reply("a long document to read " * 20, lambda ev: pytest.fail("no token can come"))
    monkeypatch.undo()
    assert session.messages == before  # no user turn, no empty assistant turn
    r, _ = session.reply("go on", lambda ev: None)
    tiny_pair.target.reset()
    tiny_pair.draft.reset()
    assert tiny_pair.chat(session.messages[:-1], OPTS).text == r.text


def test_commands_change_settings_and_refuse_bad_values(session, tmp_path):
    assert session.command("/method lookup") == ("method: lookup", False)
    assert session.options.method == "lookup" and session.options.k is None
    assert session.command("/k 5")[0] == "k: 5" and session.options.k == 5
    assert session.command("/temperature 0.7")[0] == "temperature: 0.7"
    assert session.command("/top-p 0.9")[0] == "top-p: 0.9" and session.options.top_p == 0.9
    assert session.command("/max-tokens 20")[0] == "max-tokens: 20" and session.options.max_tokens == 20
    for bad, cls in [("/method beam", ConfigError), ("/k many", ConfigError), ("/k 17", ConfigError),
                     ("/k -1", ConfigError), ("/temperature hot", ConfigError), ("/top-p 0", SamplingError),
                     ("/max-tokens 0", ConfigError), ("/max-tokens 2.5", ConfigError),
                     ("/temperature -1", SamplingError), ("/frobnicate", ConfigError), ("/save", ConfigError)]:
        before = session.options
        with pytest.raises(cls):
            session.command(bad)
        assert session.options == before
    session.reply("hi", lambda ev: None)
    text, _ = session.command(f"/save {tmp_path / 'c.json'}")
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved["messages"] == session.messages and "saved 3 messages" in text
    assert saved["settings"]["method"] == "lookup" and saved["settings"]["temperature"] == 0.7
    assert "turns 1" in session.command("/stats")[0]
    session.command("/reset")
    assert session.messages == [{"role": "system", "content": "be brief"}]
    assert session.command("/exit") == ("", True)
    assert "/temperature" in session.command("/help")[0]


def test_terminal_loop_without_a_tty_prints_plain_text(tiny_dir):
    lines = "hello\n/stats\n/method plain\nagain\n/bogus\n/exit\n"
    r = run_cli(["chat", "-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"),
                                 "-n", "8", "--show-drafts"], input=lines)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "\x1b[" not in out  # no colour codes when stdout is not a terminal
    assert len(SUMMARY.findall(out)) == 2  # one summary line per reply
    assert "turns 1" in out and "method: plain" in out and "error: Unknown command /bogus" in out
    ours = [line for line in out.splitlines() if line.startswith(("[", "localspec", "turns", "accepted", "method",
                                                                 "context", "error"))]
    assert len(ours) >= 8 and all(len(line) <= 80 for line in ours)  # readable in an 80-column terminal
    assert all(len(line) <= 80 for summary in SUMMARY.findall(out) for line in summary.splitlines())


def test_a_long_summary_wraps_at_80_columns_off_a_terminal():
    from localspec.cli.chat_session import _fit

    line = ("[96 tokens, 41.2 tok/s, auto (lookup 10, draft 5, plain 3 rounds), accepted 40/52, "
            "1800/2000 prompt tokens cached, finish: length]")
    wrapped = _fit(line, io.StringIO())
    assert " ".join(part.strip() for part in wrapped.splitlines()) == line
    assert len(wrapped.splitlines()) == 2 and all(len(part) <= 80 for part in wrapped.splitlines())
    assert SUMMARY.fullmatch(wrapped)


def test_chat_without_models_offers_nothing_when_not_interactive(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    r = run_cli(["chat"], input="")
    assert r.exit_code == 1 and "localspec pull qwen2.5-coder-1.5b" in r.stderr


def test_a_block_between_triple_quotes_is_one_message():
    text = 'first\n"""\nline one\n  line two\n"""\n"""single"""\n"""start\nend"""\n'
    reader = Reader(interactive=False, stdin=io.StringIO(text))
    assert [reader.read() for _ in range(4)] == ["first", "line one\n  line two", "single", "start\nend"]
    with pytest.raises(EOFError):
        reader.read()


def test_chat_loop_sends_a_quoted_block_as_one_turn(tiny_dir, tmp_path):
    saved = tmp_path / "c.json"
    lines = f'"""\nRewrite this:\ndef f(x):\n    return x\n"""\n/save {saved}\n/exit\n'
    r = run_cli(["chat", "-t", str(tiny_dir / "target.gguf"), "-n", "4"], input=lines)
    assert r.exit_code == 0, r.output
    messages = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"] == "Rewrite this:\ndef f(x):\n    return x"
