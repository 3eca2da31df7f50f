"""`localspec bench --agent`: the agent workload through real servers, side by side, and its bad input."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from clirun import run_cli
from serverproc import built_binary
from tinymodel import write_tiny_model

from localspec.bench import agent
from localspec.errors import ConfigError


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny pair trained for 4096 tokens: llama-server will not go past a model's trained context."""
    d = tmp_path_factory.mktemp("agent")
    write_tiny_model(d / "target.gguf", seed=0, n_ctx=4096)
    write_tiny_model(d / "draft.gguf", seed=0, noise=0.35, n_ctx=4096)
    return d


def test_agent_bench_runs_every_server_on_the_same_conversations(long_tiny: Path, tmp_path: Path) -> None:
    binary = built_binary()
    extra = ["--llama-server", str(binary)] if binary is not None and os.access(binary, os.X_OK) else []
    out = tmp_path / "agent.json"
    r = run_cli(["bench", "--agent", "-t", str(long_tiny / "target.gguf"), "-d", str(long_tiny / "draft.gguf"),
                 "--scale", "0.05", "--max-tokens", "6", "--ctx", "4096", "--threads", "1", "--json", str(out),
                 *extra])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    names = [s["name"] for s in report["servers"]]
    assert names[:3] == ["localspec serve", "llama-cpp-python server", "llama-cpp-python server, RAM cache"]
    assert ("llama-server" in names) == bool(extra)
    assert report["machine"]["threads"] == 1 and report["machine"]["n_ctx"] == 4096
    for run in report["runs"]:
        assert [q["request"] for q in run["requests"]] == ["A1", "B1", "A2", "B2", "A3", "B3"], run["server"]
        assert all(0 < q["ttft"] <= q["total"] for q in run["requests"])
    ours = {q["request"]: q for q in report["runs"][0]["requests"]}
    # each request resends its conversation, longer each turn; localspec's cache serves what it saw before
    assert ours["A1"]["prompt_tokens"] < ours["A2"]["prompt_tokens"] < ours["A3"]["prompt_tokens"]
    for later, earlier in (("A2", "A1"), ("B2", "B1"), ("A3", "A2"), ("B3", "B2")):
        assert ours[later]["cached_tokens"] >= ours[earlier]["prompt_tokens"] - 1, (later, ours[later])
    assert ours["A1"]["cached_tokens"] < ours["A1"]["prompt_tokens"] // 2  # the run starts cold
    table = r.stdout
    for name in names:
        assert name in table
    assert "follow-up first token" in table


def test_a_server_that_exits_at_start_is_named_with_its_log() -> None:
    spec = agent.ServerSpec("broken server", (sys.executable, "-c", "print('no model here'); raise SystemExit(3)"))
    server = agent.RunningServer(spec)
    try:
        with pytest.raises(ConfigError, match=r"broken server exited with status 3 .*no model here"):
            server.wait_ready(seconds=30)
    finally:
        server.close()


def test_a_server_that_never_answers_is_given_up_on() -> None:
    spec = agent.ServerSpec("silent server", (sys.executable, "-c", "import time; time.sleep(60)"))
    server = agent.RunningServer(spec)
    try:
        with pytest.raises(ConfigError, match="silent server did not answer within 1 s"):
            server.wait_ready(seconds=1)
    finally:
        server.close()


@pytest.mark.parametrize("args, says", [
    (["--agent", "--llama-server", "/no/such/llama-server"], "/no/such/llama-server is not a program"),
    (["--cache-ram", "64"], "--cache-ram and --cache-disk size the prompt cache of --agent's server"),
    (["--llama-server", "x"], "--llama-server adds a row to --agent's or --together's workload"),
    (["--agent", "--lockstep"], "--agent runs its own two conversations"),
    (["--agent", "--structured"], "different workloads; give one"),
    (["--agent", "--quick", "--k-draft", "2"], "--quick, --k-draft belong to the suites"),
    (["--agent", "--scale", "0"], "0 is not in the range"),
])
def test_bad_agent_options_get_one_sentence(tiny_dir: Path, args: list[str], says: str) -> None:
    r = run_cli(["bench", "-t", str(tiny_dir / "target.gguf"), "-d", "none", *args])
    assert r.exit_code != 0
    assert says in r.output
    assert "Traceback" not in r.output


def test_the_workload_scales_and_refuses_a_scale_of_zero() -> None:
    small, full = agent.conversations(0.1), agent.conversations(1.0)
    assert [c.name for c in full] == ["A", "B"]
    for s, f in zip(small, full, strict=True):
        assert len(s.system) < len(f.system) and len(s.first) < len(f.first)
        assert s.follow_ups == f.follow_ups and len(f.follow_ups) == 2
        assert '"read_file"' in f.system  # the tools are in the system prompt
    with pytest.raises(ConfigError, match="scale must be above 0"):
        agent.conversations(0)


def test_an_error_in_the_stream_is_an_error_not_a_short_reply() -> None:
    # A server may fail after its 200 and say so as an event; the bench must not time it as a reply.
    import http.server
    import threading

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n')
            self.wfile.write(b'data: {"error": {"message": "decode failed"}}\n\n')

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ConfigError, match="failed during the reply.*decode failed"):
            agent.ask(httpd.server_address[1], "m", [{"role": "user", "content": "Hi"}], 4)
    finally:
        httpd.shutdown()


def test_the_image_workload_runs_beside_llama_server_with_the_same_projector(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp.mtmd_cpp")
    from tinyvision import write_png, write_tiny_mmproj

    write_tiny_model(tmp_path / "target.gguf", seed=0, n_ctx=4096)
    write_tiny_mmproj(tmp_path / "mmproj-target.gguf")
    write_png(tmp_path / "shot.png", 48, 32, seed=2)
    binary = built_binary()
    extra = ["--llama-server", str(binary)] if binary is not None and os.access(binary, os.X_OK) else []
    out = tmp_path / "image.json"
    r = run_cli(["bench", "--agent", "--image", str(tmp_path / "shot.png"), "-t", str(tmp_path / "target.gguf"),
                 "-d", "none", "--max-tokens", "6", "--ctx", "4096", "--threads", "1", "--json", str(out), *extra])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    assert report["workload"]["image"] is True
    names = [s["name"] for s in report["servers"]]
    assert names == ["localspec serve"] + (["llama-server"] if extra else [])
    assert all("--mmproj" in s["argv"] and str(tmp_path / "mmproj-target.gguf") in s["argv"]
               for s in report["servers"])
    for run in report["runs"]:
        assert [q["request"] for q in run["requests"]] == ["A1", "A2", "A3"], run["server"]
    ours = {q["request"]: q for q in report["runs"][0]["requests"]}
    assert ours["A1"]["prompt_tokens"] > 16  # the image's 16 positions and the text
    assert ours["A2"]["cached_tokens"] >= ours["A1"]["prompt_tokens"] - 1  # the image came from the cache
    assert "Image workload" in r.stdout


def test_the_image_workload_needs_a_projector(tiny_dir: Path, tmp_path: Path) -> None:
    from tinyvision import write_png

    write_png(tmp_path / "shot.png", 8, 8)
    r = run_cli(["bench", "--agent", "--image", str(tmp_path / "shot.png"), "-t", str(tiny_dir / "target.gguf"),
                 "-d", "none"])
    assert r.exit_code != 0 and "--image needs the target's vision projector" in r.output
    r = run_cli(["bench", "--image", str(tmp_path / "shot.png"), "-t", str(tiny_dir / "target.gguf")])
    assert r.exit_code != 0 and "add --agent" in r.output
