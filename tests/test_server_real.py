"""`localspec serve` on the real pair: a streamed chat answer end to end, a full queue, a client leaving."""

from __future__ import annotations

import threading
import time

import openai
import pytest
from conftest import real_models_dir
from serverproc import ServeProcess

pytestmark = pytest.mark.real
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = real_models_dir()
    s = ServeProcess(["-t", str(d / "target.gguf"), "-d", str(d / "draft.gguf"), "--ctx", "2048",
                      "--max-queue", "1"], tmp_path_factory.mktemp("serve-real"), timeout=300)
    yield s
    s.close()


def test_a_streamed_chat_answer_with_speculation_stats(server):
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    chunks = list(client.chat.completions.create(model="target", messages=QUESTION, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert final.choices[0].finish_reason == "stop"
    timings = final.model_extra["timings"]
    assert "draft_n_accepted" in timings and timings["predicted_n"] == chunks[-1].usage.completion_tokens
    assert timings["predicted_per_second"] > 0 and final.model_extra["localspec"]["method"] == "auto"


def test_a_full_queue_answers_503_and_a_leaving_client_cancels_its_generation(server):
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    before = server.get("/health")["generations"]
    answer = client.chat.completions.create(model="target", messages=QUESTION, max_tokens=16,
                                            temperature=0).choices[0].message.content
    long = client.chat.completions.create(model="target", stream=True, max_tokens=400, temperature=0, messages=[
        {"role": "user", "content": "Write a very long story about a lighthouse keeper."}])
    next(iter(long))  # it is generating now
    queued: dict[str, str] = {}
    waiting = threading.Thread(target=lambda: queued.setdefault("text", client.chat.completions.create(
        model="target", messages=QUESTION, max_tokens=16, temperature=0).choices[0].message.content))
    waiting.start()
    deadline = time.monotonic() + 30
    while server.get("/health")["queued"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    status, reply, headers = server.post("/v1/completions", b'{"prompt": "hi", "max_tokens": 2}')
    assert status == 503 and reply["error"]["code"] == "server_busy" and int(headers["Retry-After"]) > 0
    started = time.monotonic()
    long.close()  # the client goes away mid-stream
    waiting.join(timeout=60)
    assert time.monotonic() - started < 20  # far less than the 400 tokens the story asked for
    after = server.get("/health")["generations"]
    assert after["cancelled"] == before["cancelled"] + 1 and after["failed"] == 0
    assert queued["text"] == answer  # the queued request ran next, on consistent caches
