"""`localspec chat` in a pseudo-terminal on the tiny models: pasted blocks, quoted blocks, history."""

from __future__ import annotations

import json

import pytest
from clirun import spawn_localspec

pexpect = pytest.importorskip("pexpect")

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"  # what a terminal sends around pasted text


def spawn(tiny_dir, home):
    return spawn_localspec(["chat", "-t", str(tiny_dir / "target.gguf"), "-n", "4", "--method", "plain"], home)


def test_pasted_and_quoted_blocks_are_one_message_each_and_history_persists(tiny_dir, tmp_path):
    home = tmp_path / "home"
    saved = tmp_path / "conv.json"
    child = spawn(tiny_dir, home)
    try:
        child.expect(">>>")
        # a pasted function: three lines, one message
        child.send(PASTE_START + "Fix this:\ndef f(x):\n    return x" + PASTE_END)
        child.send("\r")
        child.expect(r"\[\d+ tokens")
        child.expect(">>>")
        # a typed block between triple quotes
        for line in ('"""', "first typed line", "second typed line", '"""'):
            child.send(line + "\r")
        child.expect(r"\[\d+ tokens")
        child.expect(">>>")
        child.send(f"/save {saved}\r")
        child.expect("saved 4 messages")
        child.expect(">>>")
        child.send("/exit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    users = [m["content"] for m in json.loads(saved.read_text())["messages"] if m["role"] == "user"]
    assert users == ["Fix this:\ndef f(x):\n    return x", "first typed line\nsecond typed line"]
    history = home / "chat_history"
    assert "def f(x):" in history.read_text()
    assert oct(history.stat().st_mode & 0o777) == oct(0o600)  # the user's text, readable by them only

    # the next session can recall the last input with the Up arrow, and tightens a file left readable
    history.chmod(0o644)
    child = spawn(tiny_dir, home)
    try:
        child.expect(">>>")
        child.send("\x1b[A")
        child.expect("/exit")
        child.send("\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert oct(history.stat().st_mode & 0o777) == oct(0o600)
