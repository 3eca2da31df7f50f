"""`localspec bench --together`: requests sent at once to real servers, each started afresh, and its bad input."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from clirun import run_cli
from serverproc import built_binary
from tinymodel import write_tiny_model

from localspec.bench import agent, together
from localspec.errors import ConfigError


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny pair trained for 16k tokens: the title workload's long prompt, about 3k tokens for a real
    tokenizer, is about 13k for the tiny one's (nearly a token a character)."""
    d = tmp_path_factory.mktemp("together")
    write_tiny_model(d / "target.gguf", seed=0, n_ctx=16384)
    write_tiny_model(d / "draft.gguf", seed=0, noise=0.35, n_ctx=16384)
    return d


def test_every_server_gets_each_workload_at_once_and_each_request_end_is_timed(long_tiny: Path,
                                                                              tmp_path: Path) -> None:
    binary = built_binary()
    extra = ["--llama-server", str(binary)] if binary is not None and os.access(binary, os.X_OK) else []
    out = tmp_path / "together.json"
    r = run_cli(["bench", "--together", "--workload", "title", "--workload", "mixed", "--reps", "1",
                 "-t", str(long_tiny / "target.gguf"), "-d", str(long_tiny / "draft.gguf"), "--ctx", "16384",
                 "--threads", "1", "--json", str(out), *extra])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    names = [s["name"] for s in report["servers"]]
    # localspec at its defaults and plain; llama-cpp-python's server at its defaults only (no cache row)
    assert names[:3] == ["localspec serve", "localspec serve, plain", "llama-cpp-python server"]
    assert names[3:] == (["llama-server", "llama-server + draft"] if extra else [])
    plain = report["servers"][1]["argv"]
    assert plain[plain.index("-d") + 1] == "none" and plain[-2:] == ["--method", "plain"]
    assert report["workloads"] == ["title", "mixed"] and len(report["runs"]) == 2 * len(names)
    for run in report["runs"]:
        sent = together.workloads()[run["workload"]]
        assert len(run["ends"]) == len(run["requests"]) == len(sent)
        for end, request, s in zip(run["ends"], run["requests"], sent, strict=True):
            assert s.delay < end and 0 < request["ttft"] <= request["total"] <= end - s.delay + 0.5
            assert request["reply_tokens"] is None or 0 < request["reply_tokens"] <= s.max_tokens
    for name in names:
        assert name in r.stdout
    assert "title:" in r.stdout and "mixed:" in r.stdout and "vs localspec" in r.stdout


@pytest.mark.parametrize("args, says", [
    (["--workload", "new"], "--workload picks among --together's workloads"),
    (["--together", "--quick"], "leave out --quick"),
    (["--together", "--agent"], "different workloads; give one"),
    (["--together", "--workload", "lunch"], "'lunch' is not one of"),
    (["--together", "--cache-ram", "64"], "leave out --cache-ram"),
])
def test_bad_together_options_get_one_sentence(tiny_dir: Path, args: list[str], says: str) -> None:
    r = run_cli(["bench", "-t", str(tiny_dir / "target.gguf"), "-d", "none", *args])
    assert r.exit_code != 0
    assert says in r.output
    assert "Traceback" not in r.output


def test_an_unknown_workload_from_python_is_named() -> None:
    with pytest.raises(ConfigError, match="no workload 'lunch'"):
        together.run_together_bench([], ["lunch"])


def test_the_command_offers_exactly_the_library_s_workloads() -> None:
    from localspec.cli.bench import bench

    option = next(p for p in bench.params if p.name == "workloads")
    assert list(option.type.choices) == list(together.workloads())  # one list, the library's, offered whole


def test_llama_cpp_python_s_server_row_queues_requests_sent_together_instead_of_cutting_one_short(
        long_tiny: Path) -> None:
    if not agent.llama_cpp_server_installed():
        pytest.skip("llama-cpp-python's server is not installed")
    spec = agent.llama_cpp_python_specs(str(long_tiny / "target.gguf"), 1, 1, 2048, 0)[0]
    server = agent.RunningServer(spec)
    try:
        server.wait_ready()
        story = [{"role": "user", "content": "Tell me a long story about a cat and a boat."}]
        t0 = time.perf_counter()
        alone, _ = agent.ask(server.port, server.model, story, 200)
        seconds = time.perf_counter() - t0
        assert len(alone) > 50  # long enough to be under way when the second request comes
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(agent.ask, server.port, server.model, story, 200)
            time.sleep(seconds / 4)
            second = pool.submit(agent.ask, server.port, server.model, [{"role": "user", "content": "Hi"}], 4)
            # at its default (interrupt_requests) the second request ends the first about a quarter of the way
            # (its text may still differ from alone's by a near-tie: its prompt is partly reused this time)
            assert len(first.result()[0]) > len(alone) / 2
            second.result()
    finally:
        server.close()
