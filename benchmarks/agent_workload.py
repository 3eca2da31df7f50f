"""An agent-shaped workload against any OpenAI-compatible server: two conversations taking turns.

Each conversation has a long system prompt (rules and tool definitions) and a
source file in its first user turn, and every request resends the whole
conversation, as coding agents do. The requests go A1 B1 A2 B2 A3 B3, each
streamed, and the script prints each one's time to first token and total
time, and the follow-ups' sum (every request but each conversation's first).

    python benchmarks/agent_workload.py --url http://127.0.0.1:8080/v1 [--json out.json]

Start the server first, with the same model and thread budget for every
server compared (``localspec serve -t T -d D --threads 2 --threads-batch 2``,
``python -m llama_cpp.server --model T --n_threads 2 --n_threads_batch 2``,
``llama-server -m T -t 2 -tb 2``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOOLS = [{"name": name, "description": what, "parameters": {"type": "object", "properties": {
    "path": {"type": "string", "description": "a file in the repository"},
    "text": {"type": "string", "description": "the text to write or find"}}, "required": ["path"]}}
    for name, what in (("read_file", "Read a file of the repository and return its text."),
                       ("write_file", "Replace a file's text with new text."),
                       ("grep", "Find the lines of a file that hold a text."),
                       ("run_tests", "Run the tests of one file and return their output."))]


def system_prompt(rules: str, words: int) -> str:
    """Rules for a coding agent, the tools as JSON, cut to about ``words`` words."""
    text = rules + "\n\nTools:\n" + json.dumps(TOOLS, indent=1)
    return " ".join(text.split()[:words])


def conversations(scale: float) -> dict[str, tuple[str, str, list[str]]]:
    """Two conversations: (system prompt, first user turn with a source file, follow-up questions)."""
    # Filler for the long system prompts, cut to a fixed number of words below.
    readme = (REPO / "docs" / "how-it-works.md").read_text() + (REPO / "docs" / "server.md").read_text()
    a_file = (REPO / "localspec" / "costs.py").read_text()
    b_file = (REPO / "localspec" / "drafters.py").read_text()
    return {
        "A": (system_prompt("You are a coding agent working in a Python repository. " + readme, int(900 * scale)),
              "Here is localspec/costs.py:\n```python\n" + a_file[: int(4500 * scale)] + "\n```\nWhat does it do?",
              ["Which function chooses K?", "Suggest one test for it."]),
        "B": (system_prompt("You review Python code for bugs and style. Be brief. " + readme[5000:], int(400 * scale)),
              "Review this file:\n```python\n" + b_file[: int(5000 * scale)] + "\n```",
              ["Which class is the longest?", "Name one possible bug."]),
    }


def ask(client, model: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, float, float, dict]:
    """One streamed request: its reply, time to first token, total time, and the usage when the server gives it."""
    t0 = time.perf_counter()
    first, parts, usage = None, [], {}
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - t0
            parts.append(chunk.choices[0].delta.content)
        if getattr(chunk, "usage", None):
            usage = chunk.usage.model_dump()
    total = time.perf_counter() - t0
    return "".join(parts), first if first is not None else total, total, usage


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server's /v1 base URL")
    ap.add_argument("--model", default="target", help="the model name to send")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--scale", type=float, default=1.0, help="prompt sizes relative to the default (about 1.4k and "
                                                             "0.6k system tokens, 1.1-1.4k file tokens)")
    ap.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = ap.parse_args()
    import openai

    client = openai.OpenAI(base_url=args.url, api_key="none", timeout=3600)
    convs = conversations(args.scale)
    history = {name: [{"role": "system", "content": s}, {"role": "user", "content": u}]
               for name, (s, u, _) in convs.items()}
    rows = []
    for turn in range(3):
        for name, (_, _, follow) in convs.items():
            msgs = history[name]
            reply, ttft, total, usage = ask(client, args.model, msgs, args.max_tokens)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            rows.append({"request": f"{name}{turn + 1}", "ttft": ttft, "total": total,
                         "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached})
            print(f"{name}{turn + 1}: first token {ttft:6.2f} s, total {total:6.2f} s, prompt "
                  f"{usage.get('prompt_tokens')} tokens, cached {cached}", flush=True)
            if turn < 2:
                msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow[turn]}]
    follow_ups = [r for r in rows if not r["request"].endswith("1")]
    print(f"whole run {sum(r['total'] for r in rows):.1f} s; follow-ups {sum(r['total'] for r in follow_ups):.1f} s; "
          f"follow-up first token {min(r['ttft'] for r in follow_ups):.2f}-{max(r['ttft'] for r in follow_ups):.2f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
