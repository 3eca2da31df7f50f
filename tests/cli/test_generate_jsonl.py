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


def test_each_bad_line_gets_its_sentence_and_every_good_line_its_answer(tmp_path, tiny_dir):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    good = [{"id": "first", "prompt": "The cat sat on the"}, {"id": "last", "message": "Say hi"}]
    bad = [  # each line, the id its error is written under, and what the sentence says
        ('{"prompt": "b"', 2, "line 2 is not JSON"),
        ('{"id": "typo", "prompt": "a", "temprature": 0.5}', "typo", "'temprature'"),
        ('{"id": "first", "prompt": "b"}', "first", "the id 'first' is on an earlier line"),
        ('{"id": "both", "prompt": "a", "messages": []}', "both", "exactly one of"),
        ('["a"]', 6, "not a JSON object"),
        ('{"id": "sys", "prompt": "a", "system": "s"}', "sys", '"system" goes with "message"'),
        ('{"id": "zero", "prompt": "a", "max_tokens": 0}', "zero", "max_tokens"),
        ('{"id": "empty", "messages": [{"role": "user"}]}', "empty", "has no content"),
    ]
    lines = [json.dumps(good[0]), *(text for text, _, _ in bad), json.dumps(good[1])]
    src.write_text("\n".join(lines) + "\n")
    r = run_cli(["generate", *_files(tiny_dir), "--input", str(src), "--output", str(out), "--parallel", "2",
                 "-n", "12", "--method", "lookup"])
    assert r.exit_code == 1 and f"{len(bad)} lines failed" in r.stderr and "Traceback" not in r.output, r.output
    written = [json.loads(x) for x in out.read_text().splitlines()]
    errors = [x for x in written if "error" in x]
    assert len(errors) == len(bad)
    for (_, ident, needle), error in zip(bad, errors, strict=True):  # in the file's order, each with its reason
        assert error["id"] == ident and needle in error["error"], (needle, error)
        assert str(src) in error["error"] or "no content" in error["error"]
    answers = {x["id"]: x for x in written if "error" not in x}
    assert answers["first"]["tokens"] == _alone(tiny_dir, good[0])["tokens"]
    assert answers["last"]["tokens"] == _alone(tiny_dir, {"messages": [{"role": "user", "content": "Say hi"}]})[
        "tokens"]


def test_flags_that_do_not_go_together_are_named_before_any_model_loads(tmp_path, tiny_dir):
    src = tmp_path / "in.jsonl"
    r = run_cli(["generate", *_files(tiny_dir), "--output", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 2 and "go with --input" in r.stderr
    src.write_text('{"prompt": "a"}\n')
    r = run_cli(["generate", *_files(tiny_dir), "--input", str(src), "--prompt", "b"])
    assert r.exit_code == 2 and "leave out --prompt" in r.stderr
    r = run_cli(["generate", "-t", str(tmp_path / "missing.gguf"), "--input", str(tmp_path / "none.jsonl")])
    assert r.exit_code == 2 and "could not be read" in r.stderr
