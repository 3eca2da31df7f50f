"""A reasoning model served: reasoning_content apart from the content, whole and streamed, through the
``openai`` client; reasoning_effort and chat_template_kwargs switch the thinking."""

from __future__ import annotations

import openai
import pytest
from chatdefs import OPENS, THINK_TOKENS
from serverproc import ServeProcess
from tinymodel import write_tiny_model

import localspec

MESSAGES = [{"role": "user", "content": "in the end, in the end, in the"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve-think")
    return write_tiny_model(d / "opens.gguf", seed=0, user_tokens=THINK_TOKENS, chat_template=OPENS)


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    s = ServeProcess(["-t", str(model), "-d", "none", "--ctx", "1024", "--think-budget", "5"],
                     tmp_path_factory.mktemp("serve"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="not-needed", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def pair(model):
    with localspec.load(model, None, n_ctx=1024, history=False) as p:
        yield p


def test_the_reasoning_comes_apart_from_the_content(client, pair):
    want = pair.chat(MESSAGES, max_tokens=20, method="plain", think_budget=5)
    assert want.reasoning
    r = client.chat.completions.create(model="opens", messages=MESSAGES, max_tokens=20, temperature=0,
                                       extra_body={"method": "plain"})
    message = r.choices[0].message
    assert message.content == want.text and message.model_extra["reasoning_content"] == want.reasoning
    # the tokens before the answer's first text: the reasoning's, markers included
    assert 0 < want.reasoning_tokens < len(want.tokens)
    before = pair.target.detokenize(want.tokens[:want.reasoning_tokens])
    assert want.reasoning in before and want.text.strip() not in before
    assert want.text.strip() in pair.target.detokenize(want.tokens[want.reasoning_tokens:])
    assert r.usage.completion_tokens_details.reasoning_tokens == want.reasoning_tokens


def test_streamed_reasoning_comes_in_its_own_deltas(client, pair):
    want = pair.chat(MESSAGES, max_tokens=20, method="draft" if pair.draft else "lookup", think_budget=5)
    chunks = list(client.chat.completions.create(model="opens", messages=MESSAGES, max_tokens=20, temperature=0,
                                                 stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == want.reasoning
    assert "".join(d.content or "" for d in deltas) == want.text
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert not any((d.model_extra or {}).get("reasoning_content") for d in deltas[first_answer:])


def test_reasoning_effort_none_and_chat_template_kwargs_turn_thinking_off(client, pair):
    off = pair.chat(MESSAGES, max_tokens=8, method="plain", think=False)
    for extra in ({"reasoning_effort": "none"}, {"chat_template_kwargs": {"enable_thinking": False}}):
        r = client.chat.completions.create(model="opens", messages=MESSAGES, max_tokens=8, temperature=0,
                                           extra_body={"method": "plain", **extra})
        assert r.choices[0].message.content == off.text
        assert r.choices[0].message.model_extra.get("reasoning_content") in (None, "")
        assert r.usage.prompt_tokens == len(off.prompt_tokens)  # the template closed the reasoning


@pytest.mark.parametrize("extra,needle", [
    ({"reasoning_effort": "extreme"}, "'reasoning_effort' must be one of"),
    ({"chat_template_kwargs": {"enable_thinking": "no"}}, "enable_thinking must be true or false"),
    ({"chat_template_kwargs": {"messages": []}}, "'messages' is set by localspec"),
])
def test_bad_reasoning_fields_are_a_400_with_one_sentence(client, extra, needle):
    with pytest.raises(openai.BadRequestError, match=needle):
        client.chat.completions.create(model="opens", messages=MESSAGES, max_tokens=4, extra_body=extra)


def test_a_completion_carries_its_reasoning_next_to_its_text(client, pair):
    prompt = pair.format_chat(MESSAGES)
    want = pair.generate(prompt, max_tokens=20, method="plain", think_budget=5)
    r = client.completions.create(model="opens", prompt=prompt, max_tokens=20, temperature=0,
                                  extra_body={"method": "plain"})
    assert r.choices[0].text == want.text and r.choices[0].model_extra["reasoning_content"] == want.reasoning
    streamed = list(client.completions.create(model="opens", prompt=prompt, max_tokens=20, temperature=0,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want.text
    assert "".join((c.choices[0].model_extra or {}).get("reasoning_content") or "" for c in streamed
                   if c.choices) == want.reasoning


def test_a_request_sets_its_own_budget_and_a_bad_one_is_a_400(client, pair):
    want = pair.chat(MESSAGES, max_tokens=20, method="plain", think_budget=2)
    r = client.chat.completions.create(model="opens", messages=MESSAGES, max_tokens=20, temperature=0,
                                       extra_body={"method": "plain", "think_budget": 2})
    assert r.choices[0].message.model_extra["reasoning_content"] == want.reasoning
    assert r.choices[0].message.content == want.text
    with pytest.raises(openai.BadRequestError, match="think_budget must be a whole number") as caught:
        client.chat.completions.create(model="opens", messages=MESSAGES, max_tokens=4,
                                       extra_body={"think_budget": -3})
    assert caught.value.body["param"] == "think_budget"


def test_anthropic_thinking_comes_back_as_thinking_blocks_whole_and_streamed(server, pair):
    import anthropic

    # a budget other than the server's --think-budget (5): the request's own is the one applied
    want = pair.chat(MESSAGES, max_tokens=20, method="plain", think_budget=2)
    assert want.reasoning != pair.chat(MESSAGES, max_tokens=20, method="plain", think_budget=5).reasoning
    client = anthropic.Anthropic(base_url=server.base, api_key="x", max_retries=0, timeout=60)
    ask = dict(model="opens", max_tokens=20, messages=MESSAGES, thinking={"type": "enabled", "budget_tokens": 2},
               extra_body={"method": "plain"})
    r = client.messages.create(**ask)
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == want.reasoning and r.content[1].text == want.text
    events = list(client.messages.create(**ask, stream=True))
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == want.reasoning
    assert "".join(d.text for d in deltas if d.type == "text_delta") == want.text
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    off = client.messages.create(model="opens", max_tokens=8, messages=MESSAGES, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]


def test_responses_reasoning_comes_back_as_a_reasoning_item(client, pair):
    want = pair.chat(MESSAGES, max_tokens=20, method="plain", think_budget=5)
    r = client.responses.create(model="opens", input=MESSAGES[0]["content"], max_output_tokens=20,
                                reasoning={"effort": "low"}, extra_body={"method": "plain"})
    assert [item.type for item in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == want.reasoning and r.output_text == want.text
    assert r.usage.output_tokens_details.reasoning_tokens == want.reasoning_tokens > 0
    events = list(client.responses.create(model="opens", input=MESSAGES[0]["content"], max_output_tokens=20,
                                          stream=True, extra_body={"method": "plain"}))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == want.reasoning
    assert events[-1].type == "response.completed" and events[-1].response.output_text == want.text
    # effort "none" turns thinking off: the template closes the reasoning, and no reasoning item comes back
    off = pair.chat(MESSAGES, max_tokens=8, method="plain", think=False)
    assert off.reasoning in (None, "") and len(off.prompt_tokens) > len(want.prompt_tokens)
    r = client.responses.create(model="opens", input=MESSAGES[0]["content"], max_output_tokens=8,
                                reasoning={"effort": "none"}, extra_body={"method": "plain"})
    assert [item.type for item in r.output] == ["message"] and r.output_text == off.text
    assert r.usage.input_tokens == len(off.prompt_tokens) and r.usage.output_tokens_details.reasoning_tokens == 0
