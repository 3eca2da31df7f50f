"""The command line: JSON output, exactness through the CLI, one-line errors."""

from __future__ import annotations

import json

from clirun import run_cli


def run(*args: str):
    return run_cli(list(args), catch_exceptions=False)


def test_generate_json_has_the_documented_fields(tiny_dir):
    base = ["generate", "-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"),
            "--prompt", "The cat sat on the", "--max-tokens", "24", "--json"]
    plain = json.loads(run(*base, "--method", "plain").stdout)  # notices go to stderr
    spec = json.loads(run(*base, "--method", "draft", "--k", "4").stdout)
    assert set(spec) == {"text", "tokens", "finish_reason", "stats"}
    for key in ("method", "k", "rounds", "drafted", "accepted", "prefill_seconds", "decode_seconds",
                "decode_tokens_per_second"):
        assert key in spec["stats"]
    assert spec["stats"]["method"] == "draft" and spec["stats"]["k"] == 4
    assert spec["tokens"] == plain["tokens"] and spec["text"] == plain["text"]
    assert spec["finish_reason"] == "length"


def test_generate_message_uses_the_chat_template(tiny_dir):
    r = run("generate", "-t", str(tiny_dir / "target.gguf"), "--message", "hi", "--system", "be brief",
            "-n", "8", "--method", "lookup", "--json")
    assert r.exit_code == 0
    assert len(json.loads(r.stdout)["tokens"]) <= 8


def test_plain_output_streams_text_and_a_summary(tiny_dir):
    r = run("generate", "-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"),
            "-p", "The cat", "-n", "10", "--method", "draft")
    assert r.exit_code == 0
    assert "10 tokens" in r.stderr and "draft k=4" in r.stderr
    r = run("generate", "-t", str(tiny_dir / "target.gguf"), "-p", "The cat", "-n", "10")
    assert r.exit_code == 0 and "auto (" in r.stderr  # auto is the default


def test_errors_are_one_sentence_without_traceback(tmp_path, tiny_dir):
    bad = tmp_path / "x.gguf"
    bad.write_text("hello")
    cases = [
        (["-t", str(tmp_path / "missing.gguf"), "-p", "hi"], "does not exist"),
        (["-t", str(bad), "-p", "hi"], "not a GGUF file"),
        (["-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "renamed.gguf"), "-p", "hi"], "token id 100"),
        (["-t", str(tiny_dir / "target.gguf"), "-p", "hi", "--top-p", "0", "--temperature", "1"], "top_p"),
        (["-t", str(tiny_dir / "target.gguf"), "-p", "word " * 80, "--ctx", "32"], "context"),
    ]
    for args, needle in cases:
        r = run("generate", *args)
        assert r.exit_code == 1, r.output
        assert "Traceback" not in r.output
        # Notices ("localspec: ...", such as which draft was looked for) may come first; the error is one line.
        lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("localspec: ")]
        assert len(lines) == 1 and lines[0].startswith("Error: ") and needle in lines[0], lines


def test_prompt_or_message_is_required(tiny_dir):
    r = run("generate", "-t", str(tiny_dir / "target.gguf"))
    assert r.exit_code == 2 and "exactly one of --prompt" in r.stderr
