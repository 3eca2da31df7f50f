"""`localspec serve --ctx N --parallel M`: requests share N cells; those that fit alone never fail together.

A request waits for room before it reads its prompt, and one that runs out of cells anyway is set aside and
brought back: through the official clients, every request gives exactly what it gives alone, and a burst
larger than the queue gets only answers and the queue's own refusals.
"""

from __future__ import annotations

import threading
import urllib.request

import anthropic
import openai
import pytest
from serverproc import ServeProcess
from tinymodel import write_tiny_model

import localspec

#: Prompts of about 44 tokens once the chat template is applied.
QUESTIONS = [f"Question {i}: the cat sat on the mat, and then what did the dog do?" for i in range(30)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("shared-cells")
    for name, noise in (("t.gguf", 0.0), ("d.gguf", 0.35)):
        write_tiny_model(d / name, seed=0, noise=noise)
    with localspec.load(d / "t.gguf", d / "d.gguf", n_ctx=1024, history=False, prompt_cache=False) as p:
        yield p


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    s = ServeProcess(["-t", str(pair.target.path), "-d", str(pair.draft.path), "--ctx", "1024", "--no-history",
                      "--parallel", "4", "--max-queue", "8", "--metrics"], tmp_path_factory.mktemp("serve"))
    yield s
    s.close()


def _ends(pair) -> dict[str, float]:
    """OpenAI's logit_bias that bans every end-of-generation token: each reply runs to its max_tokens."""
    return {str(t): -100 for t in range(pair.target.n_vocab) if pair.target.is_eog(t)}


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
        t.join(300)
    return out


def _metric(server, name: str) -> float:
    with urllib.request.urlopen(server.base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_four_requests_that_need_twice_the_cells_all_answer_as_alone(server, pair):
    # four 44-token prompts with 300 tokens each: 1376 cells, 1024 shared. Sent one at a time each fits.
    oa = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0, timeout=300)
    ban = _ends(pair)
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS[:4]]
    alone = [pair.chat(c, max_tokens=300, method="plain", logit_bias=ban).text for c in convs]
    waits = _metric(server, "localspec_room_waits_total")

    def streamed(conv):
        chunks = oa.chat.completions.create(model="t", messages=conv, max_tokens=300, temperature=0, stream=True,
                                            logit_bias=ban, extra_body={"method": "plain"})
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def whole(conv):
        return oa.chat.completions.create(model="t", messages=conv, max_tokens=300, temperature=0, logit_bias=ban,
                                          extra_body={"method": "plain"}).choices[0].message.content

    def messages(conv):
        reply = an.messages.create(model="t", max_tokens=300, messages=conv,
                                   extra_body={"method": "plain", "temperature": 0, "logit_bias": ban})
        return reply.content[0].text

    got = _together([lambda: streamed(convs[0]), lambda: whole(convs[1]), lambda: messages(convs[2]),
                     lambda: streamed(convs[3])])
    assert got == alone
    assert _metric(server, "localspec_room_waits_total") > waits  # some waited for room before they began
    assert "waited for room" in server.output()


def test_replies_that_outrun_the_typical_one_are_set_aside_and_answer_as_alone(server, pair):
    # requests that set no max_tokens count as a typical reply: after replies that ended at once, four begin
    # together and run out of cells; the ones started last are set aside, saved, and come back exact
    oa = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=300)
    ends = {t: 100 for t in _ends(pair)}
    for question in QUESTIONS[:40]:  # the typical reply is the median of the latest 64
        oa.chat.completions.create(model="t", messages=[{"role": "user", "content": question}], logit_bias=ends)
    ban = _ends(pair)
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS[4:8]]
    alone = [pair.chat(c, max_tokens=2000, method="plain", logit_bias={int(k): v for k, v in ban.items()})
             for c in convs]
    aside = _metric(server, "localspec_set_aside_total")

    def ask(conv):
        reply = oa.chat.completions.create(model="t", messages=conv, temperature=0, logit_bias=ban,
                                           extra_body={"method": "plain"})
        return reply.choices[0].message.content, reply.choices[0].finish_reason

    got = _together([lambda c=c: ask(c) for c in convs])
    assert got == [(a.text, "length") for a in alone]  # each filled the context, as alone
    assert _metric(server, "localspec_set_aside_total") > aside


def test_a_burst_larger_than_the_queue_gets_answers_and_queue_refusals_never_a_400(server, pair):
    oa = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0, timeout=300)
    ban = _ends(pair)

    def ask(i):
        conv = [{"role": "user", "content": QUESTIONS[i]}]
        if i % 2:
            return an.messages.create(model="t", max_tokens=200, messages=conv,
                                      extra_body={"temperature": 0, "logit_bias": ban}).content[0].text
        return oa.chat.completions.create(model="t", messages=conv, max_tokens=200, temperature=0,
                                          logit_bias=ban).choices[0].message.content

    got = _together([lambda i=i: ask(i) for i in range(30)])  # 30 at once: 4 run, 8 wait, the rest are refused
    answered = [g for g in got if isinstance(g, str)]
    refused = [g for g in got if not isinstance(g, str)]
    assert len(answered) >= 12, refused
    assert all(isinstance(e, (openai.InternalServerError, anthropic.InternalServerError)) and
               e.status_code in (503, 529) for e in refused), refused
