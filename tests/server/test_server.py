"""`localspec serve` on the tiny models, through the real `openai` client and raw HTTP."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from clirun import run_cli
from serverproc import ServeProcess

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "The cat sat on the mat and"}]
PROMPTS = ["The cat sat on the mat and the dog sat on the", "def add(a, b):\n    return a + b\n",
           "in the end, in the end, in the", "Zebra quartz fjord vex nymph", "once upon a time there was"]


def test_health_and_models(server, client):
    assert server.get("/health")["status"] == "ok"
    assert [m.id for m in client.models.list().data] == ["target"]


def test_chat_equals_the_python_api_with_usage_timings_and_stats(client, tiny_pair):
    want = tiny_pair.chat(MESSAGES, max_tokens=24)
    r = client.chat.completions.create(model="target", messages=MESSAGES, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == want.finish_reason
    assert r.usage.completion_tokens == len(want.tokens) and r.usage.prompt_tokens == len(want.prompt_tokens)
    timings, stats = r.model_extra["timings"], r.model_extra["localspec"]
    assert timings["predicted_n"] == len(want.tokens) and timings["prompt_ms"] > 0
    assert {"draft_n", "draft_n_accepted", "predicted_per_second", "prompt_n"} <= set(timings)
    assert stats["method"] == "auto" and sum(stats["rounds_per_method"].values()) == stats["rounds"]


def test_streamed_chat_has_the_same_text_and_timings_in_the_final_chunk(client, tiny_pair):
    want = tiny_pair.chat(MESSAGES, max_tokens=30, method="draft", k=3)
    chunks = list(client.chat.completions.create(
        model="target", messages=MESSAGES, max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"speculative": {"method": "draft", "k": 3}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    assert chunks[0].choices[0].delta.role == "assistant"
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(final) == 1 and final[0].choices[0].finish_reason == want.finish_reason
    timings = final[0].model_extra["timings"]
    assert timings["draft_n"] == want.stats.drafted and timings["draft_n_accepted"] == want.stats.accepted > 0
    assert final[0].model_extra["localspec"]["method"] == "draft"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.tokens)


def test_completions_streamed_and_not_equal_generate(client, tiny_pair):
    want = tiny_pair.generate(PROMPTS[0], max_tokens=40, method="lookup", k=4)
    r = client.completions.create(model="target", prompt=PROMPTS[0], max_tokens=40, temperature=0,
                                  extra_body={"method": "lookup", "k": 4})
    assert r.choices[0].text == want.text and r.usage.completion_tokens == len(want.tokens)
    streamed = client.completions.create(model="target", prompt=PROMPTS[0], max_tokens=40, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want.text


def test_logit_bias_and_penalties_give_the_python_apis_tokens(client, tiny_pair):
    extra = {"repeat_penalty": 1.3, "repeat_last_n": 16}
    want = tiny_pair.generate(PROMPTS[2], max_tokens=32, logit_bias={5: -100, 9: 2.0}, presence_penalty=0.3,
                              frequency_penalty=0.4, **extra)
    r = client.completions.create(model="target", prompt=PROMPTS[2], max_tokens=32, temperature=0,
                                  logit_bias={"5": -100, "9": 2.0}, presence_penalty=0.3, frequency_penalty=0.4,
                                  extra_body=extra)
    assert r.choices[0].text == want.text and r.usage.completion_tokens == len(want.tokens)
    plain = tiny_pair.generate(PROMPTS[2], max_tokens=32)
    assert plain.text != want.text  # they change the output


def test_stop_strings_cut_the_text(client, tiny_pair):
    ref = tiny_pair.generate(PROMPTS[2], max_tokens=60)
    stop = ref.text[20:23]
    for stream in (False, True):
        r = client.completions.create(model="target", prompt=PROMPTS[2], max_tokens=60, temperature=0,
                                      stop=[stop], stream=stream)
        if stream:
            chunks = list(r)
            text = "".join(c.choices[0].text for c in chunks)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        else:
            text, finish = r.choices[0].text, [r.choices[0].finish_reason]
        assert text == ref.text[: ref.text.find(stop)] and finish == ["stop"]


def test_a_seed_gives_the_same_sample(client):
    def sample(seed: int) -> str:
        r = client.chat.completions.create(model="target", messages=MESSAGES, max_tokens=30, temperature=1.0,
                                           top_p=0.95, seed=seed)
        return r.choices[0].message.content

    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(4)}) > 1  # the seed matters


def test_concurrent_requests_each_get_their_own_exact_answer(client, tiny_pair):
    wants = [tiny_pair.generate(p, max_tokens=64).text for p in PROMPTS]

    def ask(prompt: str) -> str:
        r = client.completions.create(model="target", prompt=prompt, max_tokens=64, temperature=0)
        return r.choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        assert list(pool.map(ask, PROMPTS * 2)) == wants * 2


def test_a_client_leaving_mid_stream_leaves_the_next_request_exact(client, tiny_pair, server):
    want = tiny_pair.chat(MESSAGES, max_tokens=40)
    for _ in range(3):
        stream = client.chat.completions.create(model="target", messages=MESSAGES[:1] + [
            {"role": "user", "content": "Tell a long story " * 20}], max_tokens=900, temperature=0, stream=True)
        for i, _chunk in enumerate(stream):
            if i == 2:
                break
        stream.close()
        r = client.chat.completions.create(model="target", messages=MESSAGES, max_tokens=40, temperature=0)
        assert r.choices[0].message.content == want.text
    assert server.get("/health")["generations"]["failed"] == 0


def test_a_growing_conversation_reuses_the_cache(client):
    first = client.chat.completions.create(model="target", messages=MESSAGES, max_tokens=8, temperature=0)
    turn = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                       {"role": "user", "content": "and then?"}]
    second = client.chat.completions.create(model="target", messages=turn, max_tokens=8, temperature=0)
    timings = second.model_extra["timings"]
    assert timings["cache_n"] >= first.usage.prompt_tokens  # the earlier turn was not processed again
    assert timings["prompt_n"] == second.usage.prompt_tokens - timings["cache_n"]


@pytest.mark.parametrize("body,status,code", [
    ({"model": "gpt-4o", "prompt": "hi"}, 404, "model_not_found"),
    ({"prompt": "word " * 1100}, 400, "context_length_exceeded"),
    ({"prompt": "hi", "temperature": -1}, 400, "invalid_value"),
    ({"prompt": "hi", "top_p": 0}, 400, "invalid_value"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "invalid_value"),
    ({"prompt": "hi", "k": 99}, 400, "invalid_value"),
    ({"prompt": "hi", "method": "beam"}, 400, "invalid_value"),
    ({"prompt": "hi", "n": 2}, 400, "unsupported_parameter"),
    ({"prompt": "hi", "logprobs": 21}, 400, "invalid_value"),
    ({"prompt": "hi", "echo": True}, 400, "unsupported_parameter"),
    ({"prompt": "hi", "typical_p": 0.5}, 400, "unsupported_parameter"),
    ({"prompt": "hi", "presence_penalty": 3}, 400, "invalid_value"),
    ({"prompt": "hi", "logit_bias": {"5": 101}}, 400, "invalid_value"),
    ({"prompt": "hi", "logit_bias": {"1000000": 1}}, 400, "invalid_token_id"),
    ({"prompt": "hi", "stop": [""]}, 400, "invalid_value"),
    ({"prompt": ""}, 400, None),
    ({"prompt": ["a", "b"]}, 400, None),
])
def test_bad_completion_requests_get_openai_error_objects(server, body, status, code):
    got, reply, _ = server.post("/v1/completions", json.dumps(body).encode())
    assert got == status, reply
    error = reply["error"]
    assert error["code"] == code and error["message"].endswith(".") and "Traceback" not in error["message"]
    assert server.get("/health")["status"] == "ok"  # and the server keeps serving


def test_bad_chat_requests_and_raw_http_errors(server, client):
    status, reply, _ = server.post("/v1/chat/completions", b"{not json")
    assert status == 400 and "not valid JSON" in reply["error"]["message"]
    status, reply, _ = server.post("/v1/nothing-here", b"{}")
    assert status == 404 and reply["error"]["type"] == "not_found"
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model="target", messages=MESSAGES, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {}}}}])
    with pytest.raises(openai.BadRequestError, match="logit_bias"):  # served now, with ids in the vocabulary
        client.chat.completions.create(model="target", messages=MESSAGES, logit_bias={"100000000": 1})
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="target", messages=[])
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="target", messages=[{"role": "user", "content": "word " * 1100}],
                                       stream=True)
    assert err.value.code == "context_length_exceeded"  # a streamed request that cannot start is a plain error
    r = client.chat.completions.create(model="target", messages=MESSAGES, max_tokens=4, n=1, logprobs=False,
                                       presence_penalty=0.0, tool_choice="none", response_format={"type": "text"})
    assert r.choices[0].message.content is not None  # the neutral values of unsupported fields are accepted


def test_an_api_key_is_required_when_given(tiny_dir, tmp_path):
    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "--ctx", "512", "--api-key", "s3cret", "-m", "plain"],
                     tmp_path)
    try:
        assert s.get("/health")["status"] == "ok"  # health checks need no key
        for key in ("wrong", ""):
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=s.url, api_key=key or "x", max_retries=0).models.list()
        status, reply, _ = s.post("/v1/completions", b'{"prompt": "hi"}')  # no Authorization header at all
        assert status == 401 and reply["error"]["code"] == "invalid_api_key"
        ok = openai.OpenAI(base_url=s.url, api_key="s3cret", max_retries=0)
        assert ok.completions.create(model="target", prompt="hi", max_tokens=3).usage.completion_tokens <= 3
    finally:
        s.close()


def test_binding_beyond_loopback_without_a_key_is_refused(tiny_dir):
    r = run_cli(["serve", "-t", str(tiny_dir / "target.gguf"), "--host", "0.0.0.0"])
    assert r.exit_code == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: Binding 0.0.0.0") and "--api-key" in lines[0]


def test_the_server_drafts_from_its_history_and_a_request_can_opt_out(tiny_dir, tmp_path):
    from localspec.drafting.history import list_stores

    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "--ctx", "1024"], tmp_path, env={"LOCALSPEC_HISTORY": "on"})
    try:
        client = openai.OpenAI(base_url=s.url, api_key="not-needed", max_retries=0, timeout=60)

        def ask(**extra):
            r = client.completions.create(model="target", prompt=PROMPTS[0], max_tokens=40, temperature=0,
                                          extra_body={"method": "history", **extra})
            return r.choices[0].text, r.model_extra["localspec"]

        first_text, first = ask()
        again_text, again = ask()  # the first answer is in the history now
        assert again_text == first_text
        assert "history" not in first["accepted_by"] and again["accepted_by"]["history"] > 20
        records = list_stores(tmp_path / "history")[0][2].records
        private_text, private = ask(method="auto", history=False)
        assert private_text == first_text and "history" not in private["drafted_by"]
        assert list_stores(tmp_path / "history")[0][2].records == records  # not recorded either
    finally:
        s.close()
