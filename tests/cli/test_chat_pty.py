"""`localspec chat` in a pseudo-terminal on the tiny models: pasted blocks, quoted blocks, history."""

from __future__ import annotations

import base64
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


def test_an_image_attached_or_dropped_goes_with_the_next_message(tmp_path):
    pytest.importorskip("llama_cpp.mtmd_cpp")
    from tinymodel import write_tiny_model
    from tinyvision import png_bytes, write_tiny_mmproj

    write_tiny_model(tmp_path / "target.gguf", seed=0)
    write_tiny_mmproj(tmp_path / "mmproj-target.gguf")
    (tmp_path / "my shot.png").write_bytes(png_bytes(32, 32, seed=1))
    (tmp_path / "bad.png").write_bytes(b"not a png")
    saved = tmp_path / "conv.json"
    child = spawn_localspec(["chat", "-t", str(tmp_path / "target.gguf"), "-n", "4", "--method", "plain"],
                            tmp_path / "home")
    try:
        child.expect("images through mmproj-target.gguf")
        child.expect(">>>")
        child.send(f"/image {tmp_path / 'my shot.png'}\r")
        child.expect("image 1 attached: my shot.png")
        child.expect(">>>")
        child.send("What is this?\r")
        child.expect(r"\[\d+ tokens")
        child.expect(">>>")
        child.send(f"And this one? '{tmp_path / 'my shot.png'}'\r")  # a file dropped on the terminal, quoted
        child.expect(r"\[\d+ tokens")
        child.expect(">>>")
        child.send(f"/image {tmp_path / 'bad.png'}\r")
        child.expect(">>>")
        child.send("Broken?\r")
        child.expect("could not be read")
        child.expect(">>>")
        child.send(f"/save {saved}\r")
        child.expect("saved 4 messages")
        child.send("/exit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    users = [m["content"] for m in json.loads(saved.read_text())["messages"] if m["role"] == "user"]
    shot = str(tmp_path / "my shot.png")
    url = "data:image/png;base64," + base64.b64encode((tmp_path / "my shot.png").read_bytes()).decode()
    assert users == [[{"type": "image", "image": url, "name": shot}, {"type": "text", "text": "What is this?"}],
                     [{"type": "image", "image": url, "name": shot}, {"type": "text", "text": "And this one?"}]]
