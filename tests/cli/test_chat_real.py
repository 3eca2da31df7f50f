"""`localspec chat` end to end in a pseudo-terminal on the real pair."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from clirun import spawn_localspec
from conftest import real_models_dir

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.real
SUMMARY = re.compile(r"\[\d+ tokens, [\d.]+ tok/s, [^\]]*finish: \w+\]")


def test_chat_session_in_a_terminal(tmp_path, localspec_home):
    # The newcomer's path: the fetched test pair is registered as the built-in pair
    # (as scripts/fetch_test_models.py does), and `localspec chat` needs no arguments.
    d = real_models_dir()  # also puts scripts/ on the import path
    from fetch_test_models import register

    register(d)
    child = spawn_localspec(["chat", "-n", "48", "--show-drafts", "--ctx", "2048"], localspec_home, timeout=240,
                            cols=80)
    transcript = Path(os.environ.get("LOCALSPEC_CHAT_TRANSCRIPT", tmp_path / "transcript.txt"))
    child.logfile_read = open(transcript, "w")  # the screen as a person saw it
    try:
        child.expect(">>>")

        def turn(text: str) -> str:
            child.sendline(text)
            child.expect(SUMMARY)
            reply = child.before
            child.expect(">>>")
            return reply

        turn("My name is Ada Lovelace. Reply with one short sentence.")
        second = turn("What is my name? Answer in a few words.")
        assert "Ada" in second
        assert "\x1b[" in second  # coloured tokens on a terminal with --show-drafts
        child.sendline("/stats")
        child.expect(r"turns 2, tokens \d+")
        child.expect(">>>")
        # Ctrl-C in the middle of a long reply: long enough that it cannot end before the interrupt
        # arrives, even when a loaded machine hands the screen over late
        child.sendline("/max-tokens 400")
        child.expect("max-tokens: 400")
        child.expect(">>>")
        child.sendline("Write a long poem about the sea, at least twenty lines.")
        child.expect_exact("twenty lines.")  # the echo of the line as typed
        child.expect_exact("\x1b[?2004l")  # the input prompt has finished (bracketed paste off)
        child.expect(r"[A-Za-z]+ [A-Za-z]+ [A-Za-z]+")  # then some words of the reply have streamed
        child.sendintr()
        child.expect(r"\[interrupted\]")
        child.expect(SUMMARY)
        child.expect(">>>")
        child.sendline("/max-tokens 48")  # the next turn is compared with a fresh chat of 48 tokens
        child.expect("max-tokens: 48")
        child.expect(">>>")
        after = turn("Now say just the word 'done'.")
        saved = tmp_path / "conv.json"
        child.sendline(f"/save {saved}")
        child.expect("saved 8 messages")
        child.expect(">>>")
        child.sendline("/reset")
        child.expect("conversation cleared")
        child.expect(">>>")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
        child.logfile_read.close()

    # The turn after Ctrl-C equals a fresh conversation with the same history.
    import localspec

    messages = json.loads(saved.read_text())["messages"]
    assert messages[-1]["content"] and messages[-1]["role"] == "assistant"
    with localspec.load(d / "target.gguf", d / "draft.gguf", n_ctx=2048) as pair:
        fresh = pair.chat(messages[:-1], max_tokens=48, temperature=0.0)
    assert fresh.text == messages[-1]["content"]
    assert fresh.text.strip() in re.sub(r"\x1b\[[0-9;]*m", "", after).replace("\r", "")
