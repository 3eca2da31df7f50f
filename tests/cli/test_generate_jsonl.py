"""``localspec generate --input FILE.jsonl``: every line answered, decoded together, resumable, bad lines named."""

from __future__ import annotations

import json

from clirun import run_cli

LINES = [
    {"id": "cat", "prompt": "The cat sat on the"},
    {"messages": [{"role": "user", "content": "Say hi"}]},
    {"id": 7, "message": "Count to five", "system": "Be brief.", "max_tokens": 6},
    {"id": "sampled", "prompt": "Once upon a time", "temperature": 0.8, "seed": 3},
    {"id": "code", "prompt": "def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "stop": ["\n\n"]},
]


def _files(tiny_dir):
    return ["-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf")]


def _alone(tiny_dir, line):
    args = ["generate", *_files(tiny_dir), "-n", str(line.get("max_tokens", 12)), "--method", "lookup", "--json"]
    if "prompt" in line:
        args += ["--prompt", line["prompt"]]
    elif "message" in line:
        args += ["--message", line["message"], "--system", line["system"]]
    else:
        args += ["--message", line["messages"][0]["content"]]
    for name in ("temperature", "seed"):
        if name in line:
            args += [f"--{name}", str(line[name])]
    if "stop" in line:
        args += ["--stop", line["stop"][0]]
    r = run_cli(args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_every_line_is_answered_as_generate_answers_it_alone(tmp_path, tiny_dir):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, LINES)
    r = run_cli(["generate", *_files(tiny_dir), "--input", str(src), "--output", str(out), "--parallel", "3",
                 "-n", "12", "--method", "lookup"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    got = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert sorted(got, key=str) == sorted(["cat", 2, 7, "sampled", "code"], key=str)  # no id: its line number
    for n, line in enumerate(LINES, start=1):
        mine = got[line.get("id", n)]
        assert mine["tokens"] == _alone(tiny_dir, line)["tokens"], line
        assert mine["stats"]["batch_width"] >= 1
    assert len(got[7]["tokens"]) <= 6  # the line's own max_tokens
    assert max(x["stats"]["batch_width"] for x in got.values()) > 1  # they were decoded together


def test_a_stopped_run_goes_on_where_it_stopped(tmp_path, tiny_dir):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, LINES)
    first = {"id": "cat", "text": "earlier", "tokens": [1], "finish_reason": "length", "stats": {}}
    failed = {"id": 7, "error": "was refused last time"}
    out.write_text(json.dumps(first) + "\n" + json.dumps(failed) + "\n" + '{"id": "sampled", "te')  # cut short
    r = run_cli(["generate", *_files(tiny_dir), "--input", str(src), "--output", str(out), "-n", "8"],
                catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "1 of 5 lines are in" in r.stderr
    lines = out.read_text().splitlines()
    assert json.loads(lines[0]) == first and lines[2] == '{"id": "sampled", "te'  # kept as it was
    again = [json.loads(x) for x in lines[3:]]
    assert sorted((x["id"] for x in again), key=str) == sorted([2, 7, "sampled", "code"], key=str)
    assert all("tokens" in x for x in again)
    r = run_cli(["generate", *_files(tiny_dir), "--input", str(src), "--output", str(out), "-n", "8"],
                catch_exceptions=False)
    assert r.exit_code == 0 and "0 to go" in r.stderr and len(out.read_text().splitlines()) == len(lines)


def test_a_line_that_fails_gets_its_reason_and_the_others_their_results(tmp_path, tiny_dir):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [{"id": "ok", "prompt": "The cat"}, {"id": "long", "prompt": "word " * 400},
                 {"id": "also", "prompt": "A dog"}])
    r = run_cli(["generate", *_files(tiny_dir), "--input", str(src), "--output", str(out), "--ctx", "256",
                 "--parallel", "2", "-n", "8"])
    assert r.exit_code == 1 and "1 line failed" in r.stderr and "Traceback" not in r.output
    got = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert "context" in got["long"]["error"] and got["ok"]["tokens"] and got["also"]["tokens"]


def test_bad_lines_and_flags_are_named_before_any_model_loads(tmp_path, tiny_dir):
    src = tmp_path / "in.jsonl"
    cases = [
        ('{"prompt": "a"}\n\n{"prompt": "b"\n', "line 3 is not JSON"),
        ('{"prompt": "a", "temprature": 0.5}\n', "'temprature'"),
        ('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', "the id 1 is on an earlier line"),
        ('{"prompt": "a", "messages": []}\n', "exactly one of"),
        ('["a"]\n', "not a JSON object"),
        ('{"prompt": "a", "system": "s"}\n', '"system" goes with "message"'),
        ('{"prompt": "a", "max_tokens": 0}\n', "line 1"),
    ]
    for text, needle in cases:
        src.write_text(text)
        r = run_cli(["generate", "-t", str(tmp_path / "missing.gguf"), "--input", str(src)])
        if needle == "line 1":  # an option's value is checked once the pair's defaults are known
            r = run_cli(["generate", *_files(tiny_dir), "--input", str(src)])
        assert r.exit_code == 2 and needle in r.stderr, (text, r.stderr)
    r = run_cli(["generate", *_files(tiny_dir), "--output", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 2 and "go with --input" in r.stderr
    src.write_text('{"prompt": "a"}\n')
    r = run_cli(["generate", *_files(tiny_dir), "--input", str(src), "--prompt", "b"])
    assert r.exit_code == 2 and "leave out --prompt" in r.stderr
