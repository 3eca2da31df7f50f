"""`localspec serve --parallel`: requests that arrive together run together, each exactly what it gives alone,
through the official clients; one that leaves or fails ends alone."""

from __future__ import annotations

import threading
import time

import anthropic
import openai
import pytest
from serverproc import ServeProcess
from tinymodel import HERMES_TEMPLATE as TEMPLATE
from tinymodel import write_tiny_model

import localspec

QUESTIONS = ["in the end, in the end, what is the weather in the end", "The cat sat on the mat and the dog sat",
             "def add(a, b):\n    return a + b\n\ndef sub(a, b):", "Count: one, two, three, four,"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("parallel")
    for name, noise in (("t.gguf", 0.0), ("d.gguf", 0.35)):
        write_tiny_model(d / name, seed=0, noise=noise, chat_template=TEMPLATE)
    with localspec.load(d / "t.gguf", d / "d.gguf", n_ctx=2048, history=False, prompt_cache=False) as p:
        yield p


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    s = ServeProcess(["-t", str(pair.target.path), "-d", str(pair.draft.path), "--ctx", "2048", "--no-history",
                      "--parallel", "3", "--max-queue", "4"], tmp_path_factory.mktemp("serve"))
    yield s
    s.close()


def _together(calls):
    """Run the calls at once, each in its own thread; their results (or exceptions) in order."""
    out: list[object] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i):
        start.wait()
        try:
            out[i] = calls[i]()
        except Exception as exc:  # the test reads it
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def _streamed(client, question, method):
    chunks = list(client.chat.completions.create(
        model="t", messages=[{"role": "user", "content": question}], max_tokens=40, temperature=0, stream=True,
        extra_body={"method": method}))
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), final.model_extra["localspec"]


def test_the_server_says_how_many_requests_run_at_once(server):
    assert "3 requests at once" in server.output()


@pytest.mark.parametrize("method", ["plain", "lookup", "draft", "auto"])
def test_requests_sent_together_run_together_and_each_answers_as_alone(server, pair, method):
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    alone = [pair.chat([{"role": "user", "content": q}], max_tokens=40, method=method).text for q in QUESTIONS]
    got = _together([lambda q=q: _streamed(client, q, method) for q in QUESTIONS])  # 4 requests, 3 at once
    assert [text for text, _ in got] == alone
    assert max(ours["batch_width"] for _, ours in got) > 1  # their tokens shared decodes
    assert server.get("/health")["running"] == 0


def test_one_client_leaving_and_one_bad_request_end_alone(server, pair):
    oa = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    an = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0, timeout=120)
    question = [{"role": "user", "content": QUESTIONS[0]}]
    alone = pair.chat(question, max_tokens=40, method="plain").text

    def leaves():
        with oa.chat.completions.create(model="t", messages=question, max_tokens=400, temperature=0,
                                        stream=True) as stream:
            next(iter(stream))  # it has begun; leaving closes the connection
        return "left"

    def too_long():
        return oa.chat.completions.create(model="t", messages=[{"role": "user", "content": "word " * 3000}],
                                          max_tokens=4)

    def stays():
        reply = an.messages.create(model="t", max_tokens=40, messages=question,
                                   extra_body={"method": "plain", "temperature": 0})
        return reply.content[0].text

    left, failed, stayed = _together([leaves, too_long, stays])
    assert left == "left"
    assert isinstance(failed, openai.BadRequestError) and "context" in str(failed)
    assert stayed == alone


def test_a_follow_up_after_another_conversation_reads_nothing_again(server, pair):
    client = openai.OpenAI(base_url=server.url, api_key="none")
    system = {"role": "system", "content": "You are a careful assistant who answers briefly. " * 8}
    a1 = [system, {"role": "user", "content": QUESTIONS[0]}]
    first = client.chat.completions.create(model="t", messages=a1, max_tokens=8, temperature=0)
    client.chat.completions.create(model="t", messages=[{"role": "user", "content": QUESTIONS[1]}], max_tokens=8,
                                   temperature=0)  # another conversation between the two turns
    a2 = a1 + [{"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "and then?"}]
    follow = client.chat.completions.create(model="t", messages=a2, max_tokens=8, temperature=0)
    # A1's cells left the shared cache when the other conversation began (the prompt cache held them, and an
    # idle conversation's cells slow every step of the others): the follow-up starts from a restore of them
    assert follow.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    assert follow.model_extra["localspec"]["restored_prompt_tokens"] >= first.usage.prompt_tokens - 1
    assert follow.choices[0].message.content == pair.chat(a2, max_tokens=8).text


def test_sub_agents_sent_together_read_their_common_system_prompt_once(server, pair):
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    system = {"role": "system", "content": "You are a sub-agent: read the task, answer it in one line. " * 6}
    tasks = [[system, {"role": "user", "content": q}] for q in QUESTIONS[:3]]  # at once: no lane holds it yet

    def ask(messages):
        return client.chat.completions.create(model="t", messages=messages, max_tokens=8, temperature=0,
                                              extra_body={"method": "plain"})

    replies = _together([lambda m=m: ask(m) for m in tasks])
    assert [r.choices[0].message.content for r in replies] == [pair.chat(m, max_tokens=8, method="plain").text
                                                                for m in tasks]
    # one reads the system prompt; the others wait for it and share its cells
    cached = sorted(r.usage.prompt_tokens_details.cached_tokens for r in replies)
    prefix = len(pair.target.tokenize(system["content"]))
    assert cached[0] < prefix / 4 and cached[1] >= prefix - 8 and cached[2] >= prefix - 8, cached


def test_a_queued_request_starts_as_soon_as_a_lane_is_free(server, pair):
    # three lanes: one long reply and two short ones run, a fourth short one waits in the queue; it starts when
    # a short one ends, not when the long one does
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    ends: dict[str, float] = {}
    ban = {str(t): -100 for t in range(pair.target.n_vocab) if pair.target.is_eog(t)}
    started = time.monotonic()

    def ask(name, question, tokens):
        client.chat.completions.create(model="t", messages=[{"role": "user", "content": question}],
                                       max_tokens=tokens, temperature=0, logit_bias=ban,
                                       extra_body={"method": "plain"})
        ends[name] = time.monotonic() - started

    long = threading.Thread(target=ask, args=("long", QUESTIONS[0], 1800))
    long.start()
    while server.get("/health")["running"] == 0:  # it runs: the others arrive while it decodes
        time.sleep(0.01)
    got = _together([lambda: ask("a", QUESTIONS[1], 4), lambda: ask("b", QUESTIONS[2], 4),
                     lambda: ask("queued", QUESTIONS[3], 4)])
    long.join(120)
    assert got == [None] * 3
    assert ends["queued"] < ends["long"], ends
