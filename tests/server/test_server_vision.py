"""Images through every API of `localspec serve` (a tiny target with a tiny vision projector), with the official
`openai`, `anthropic` and `ollama` clients: each API's image shape gives the Python API's greedy tokens for the
same image and text; a bad image, a model without a projector and a URL the server may not fetch are 400s in
each API's error shape; `--allow-fetch` reads an http URL (and refuses one too large)."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Union

import anthropic
import ollama
import openai
import pytest
from inprocess import local_server, serving
from serverproc import ServeProcess
from tinymodel import write_tiny_model
from tinyvision import png_bytes, write_tiny_mmproj

import localspec
from localspec.runtime.vision import MAX_IMAGE_BYTES, ImageError

pytest.importorskip("llama_cpp.mtmd_cpp")

QUESTION, AFTER = "What is in this picture?", "Say it briefly."
IMAGE = png_bytes(40, 30, seed=3)
OTHER = png_bytes(24, 36, seed=11)
CORRUPT = b"\x89PNG\r\n\x1a\n" + b"not the rest of a png" * 8
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 \x18\x00\x00\x00" + bytes(24)
N = 16  # tokens each answer generates


def data_url(image: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(image).decode()


def library(image: bytes, before: str = QUESTION, after: str = AFTER) -> list[dict[str, Any]]:
    """A user turn of text, an image and text, as the Python API takes it."""
    return [{"role": "user", "content": [{"type": "text", "text": before}, {"type": "image", "image": image},
                                         {"type": "text", "text": after}]}]


def openai_turn(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                         {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
                                         {"type": "text", "text": AFTER}]}]


def anthropic_source(image: Union[bytes, str]) -> dict[str, Any]:
    """An image block's source: base64 for bytes or a data URL, a url source for an http URL."""
    if isinstance(image, bytes):
        return {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
    if image.startswith("data:"):
        head, _, data = image.partition(",")
        return {"type": "base64", "media_type": head[5:].split(";")[0], "data": data}
    return {"type": "url", "url": image}


def anthropic_turn(image: Union[bytes, str]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                         {"type": "image", "source": anthropic_source(image)},
                                         {"type": "text", "text": AFTER}]}]


def responses_input(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_text", "text": QUESTION},
                                         {"type": "input_image", "image_url": url, "detail": "auto"}]}]


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("vision-serve")
    write_tiny_model(d / "target.gguf", seed=0)
    write_tiny_model(d / "draft.gguf", seed=0, noise=0.35)
    write_tiny_mmproj(d / "mmproj-target.gguf")  # found beside the target
    return d


@pytest.fixture(scope="module")
def pair(vision_dir: Path) -> Iterator[localspec.Pair]:
    """The Python API on the served files: what every answer must equal."""
    with localspec.load(vision_dir / "target.gguf", vision_dir / "draft.gguf", n_ctx=1024, history=False,
                        notify=lambda _: None) as p:
        assert p.target.projector is not None
        yield p


def want(pair: localspec.Pair, messages: list[dict[str, Any]]) -> localspec.Result:
    return pair.chat(messages, max_tokens=N, method="plain", temperature=0)


@pytest.fixture(scope="module")
def server(vision_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    s = ServeProcess(["-t", str(vision_dir / "target.gguf"), "-d", str(vision_dir / "draft.gguf"), "--ctx", "1024",
                      "--no-history", "--allow-fetch", "--fetch-private"], tmp_path_factory.mktemp("serve"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def in_process(vision_dir: Path) -> Iterator[Any]:
    """In-process servers on their own pairs, by kind: "blind" loaded without the projector, "nofetch" with it
    (and no --allow-fetch); each yields its port."""
    made: dict[str, int] = {}
    with localspec.load(vision_dir / "target.gguf", n_ctx=512, history=False, mmproj=False,
                        notify=lambda _: None) as blind, \
            localspec.load(vision_dir / "target.gguf", n_ctx=512, history=False, notify=lambda _: None) as seeing:
        servers = {"blind": local_server(blind), "nofetch": local_server(seeing)}
        try:
            with serving(servers["blind"]) as made["blind"], serving(servers["nofetch"]) as made["nofetch"]:
                yield made
        finally:
            for s in servers.values():
                s.close()


def clients(port_or_base: Union[int, str]) -> tuple[openai.OpenAI, anthropic.Anthropic, ollama.Client]:
    base = port_or_base if isinstance(port_or_base, str) else f"http://127.0.0.1:{port_or_base}"
    return (openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=60),
            anthropic.Anthropic(base_url=base, api_key="x", max_retries=0, timeout=60), ollama.Client(host=base))


# -- each API's shape gives the Python API's tokens ---------------------------------------------------------------


def test_openai_image_url_parts_give_the_python_apis_tokens_whole_and_streamed(server, pair):
    o, _, _ = clients(server.base)
    expected = want(pair, library(IMAGE))
    r = o.chat.completions.create(model="target", messages=openai_turn(data_url(IMAGE)), max_tokens=N,
                                  temperature=0)
    assert r.choices[0].message.content == expected.text
    assert r.usage.prompt_tokens == len(expected.prompt_tokens) and r.usage.completion_tokens == len(expected.tokens)
    chunks = o.chat.completions.create(model="target", messages=openai_turn(data_url(IMAGE)), max_tokens=N,
                                       temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    other = o.chat.completions.create(model="target", messages=openai_turn(data_url(OTHER)), max_tokens=N,
                                      temperature=0)
    assert other.choices[0].message.content == want(pair, library(OTHER)).text


def test_anthropic_image_blocks_give_the_python_apis_tokens_and_count(server, pair):
    _, a, _ = clients(server.base)
    expected = want(pair, library(IMAGE))
    r = a.messages.create(model="target", max_tokens=N, messages=anthropic_turn(IMAGE))
    assert r.content[0].text == expected.text
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == len(expected.prompt_tokens)
    counted = a.messages.count_tokens(model="target", messages=anthropic_turn(IMAGE))
    assert counted.input_tokens == len(expected.prompt_tokens)
    with a.messages.stream(model="target", max_tokens=N, messages=anthropic_turn(IMAGE)) as s:
        assert "".join(s.text_stream) == expected.text


def test_an_image_in_an_anthropic_tool_result_reads_as_the_tool_messages_image(server, pair):
    """Claude Code sends a tool's screenshot as an image block in the tool_result's content."""
    _, a, _ = clients(server.base)
    call = {"id": "toolu_1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
    expected = want(pair, [{"role": "user", "content": "Take a screenshot."},
                           {"role": "assistant", "content": "", "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": "toolu_1", "content": [
                               {"type": "text", "text": "Here it is:"}, {"type": "image", "image": IMAGE}]}])
    r = a.messages.create(model="target", max_tokens=N, messages=[
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "text", "text": "Here it is:"}, {"type": "image", "source": anthropic_source(IMAGE)}]}]}])
    assert r.content[0].text == expected.text


def test_ollama_images_give_the_python_apis_tokens_on_chat_and_generate(server, pair):
    _, _, c = clients(server.base)
    expected = want(pair, [{"role": "user", "content": [{"type": "image", "image": IMAGE},
                                                        {"type": "text", "text": QUESTION}]}])
    options = {"temperature": 0, "num_predict": N}
    r = c.chat(model="target", messages=[{"role": "user", "content": QUESTION, "images": [IMAGE]}], options=options,
               stream=False)
    assert r.message.content == expected.text and r.prompt_eval_count == len(expected.prompt_tokens)
    streamed = c.chat(model="target", messages=[{"role": "user", "content": QUESTION, "images": [IMAGE]}],
                      options=options, stream=True)
    assert "".join(part.message.content or "" for part in streamed) == expected.text
    g = c.generate(model="target", prompt=QUESTION, images=[IMAGE], options=options, stream=False)
    assert g.response == expected.text
    assert "vision" in c.show("target").capabilities


def test_responses_input_image_gives_the_python_apis_tokens(server, pair):
    o, _, _ = clients(server.base)
    expected = want(pair, [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                                        {"type": "image", "image": IMAGE}]}])
    r = o.responses.create(model="target", input=responses_input(data_url(IMAGE)), max_output_tokens=N,
                           temperature=0)
    assert r.output_text == expected.text


def test_two_image_requests_at_once_each_get_their_own_answer(server, pair):
    o, _, _ = clients(server.base)
    images = [IMAGE, OTHER, png_bytes(32, 32, seed=5)]
    wants = [want(pair, library(image)).text for image in images]
    assert len(set(wants)) > 1  # the image matters

    def ask(image: bytes) -> str:
        r = o.chat.completions.create(model="target", messages=openai_turn(data_url(image)), max_tokens=N,
                                      temperature=0)
        return str(r.choices[0].message.content)

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(ask, images * 2)) == wants * 2


# -- refusals, in each API's error shape --------------------------------------------------------------------------


def refusal(api: str, base: str, image: Union[bytes, str]) -> str:
    """The message of the 400 ``api`` answers a request holding ``image`` (bytes, or a URL) with, its error shape
    checked on the way."""
    o, a, c = clients(base)
    url = data_url(image) if isinstance(image, bytes) else image
    try:
        if api == "openai":
            o.chat.completions.create(model="target", messages=openai_turn(url), max_tokens=4)
        elif api == "responses":
            o.responses.create(model="target", input=responses_input(url), max_output_tokens=4)
        elif api == "anthropic":
            a.messages.create(model="target", max_tokens=4, messages=anthropic_turn(image))
        else:
            c.chat(model="target", messages=[{"role": "user", "content": QUESTION, "images": [image]}],
                   options={"num_predict": 4}, stream=False)
    except openai.BadRequestError as exc:
        assert api in ("openai", "responses") and exc.body["type"] == "invalid_request_error", exc.body
        return str(exc.body["message"])
    except anthropic.BadRequestError as exc:
        assert api == "anthropic" and exc.body["type"] == "error", exc.body
        assert exc.body["error"]["type"] == "invalid_request_error", exc.body
        return str(exc.body["error"]["message"])
    except ollama.ResponseError as exc:
        assert api == "ollama" and exc.status_code == 400, exc
        return str(exc.error)
    raise AssertionError(f"{api} answered an image it cannot read")


APIS = ("openai", "anthropic", "ollama", "responses")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("image,words", [
    (CORRUPT, "could not be read as an image"),
    (WEBP, "could not be read as an image"),
])
def test_a_bad_image_is_a_400_naming_the_problem(server, api, image, words):
    assert words in refusal(api, server.base, image)


@pytest.mark.parametrize("api,words", [
    ("openai", "messages[0].content[1]: a data URL of text/plain is not an image"),
    ("responses", "input[0].content[1].image_url: a data URL of text/plain is not an image"),
    ("anthropic", "messages[0].content[1].source.media_type must be an image's type"),
    ("ollama", "could not be read as an image"),  # Ollama's images carry no type
])
def test_a_non_image_is_a_400_naming_the_problem(server, api, words):
    image = data_url(b"just some text", "text/plain") if api != "ollama" else b"just some text"
    assert words in refusal(api, server.base, image)
    assert server.get("/health")["generations"]["failed"] == 0  # refused, never a failure


def test_malformed_base64_and_a_foreign_file_id_are_named(server):
    status, body, _ = server.post("/api/chat", json.dumps({"model": "target", "stream": False, "messages": [
        {"role": "user", "content": "hi", "images": ["not base64!"]}]}).encode())
    assert status == 400 and "messages[0].images[0]: the image's base64 is malformed" in body["error"], body
    status, body, _ = server.post("/v1/responses", json.dumps({"model": "target", "input": [
        {"role": "user", "content": [{"type": "input_image", "file_id": "file-123"}]}]}).encode())
    assert status == 400 and "file_id" in body["error"]["message"] and body["error"]["param"] == "input", body
    status, body, _ = server.post("/v1/messages", json.dumps({"model": "target", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}).encode())
    assert status == 400 and "Files API" in body["error"]["message"], body


@pytest.mark.parametrize("api", ("openai", "anthropic", "responses"))
def test_an_http_url_without_allow_fetch_is_a_400_saying_how(in_process, api):
    words = refusal(api, f"http://127.0.0.1:{in_process['nofetch']}", "http://127.0.0.1:9/cat.png")
    assert "images are not fetched from URLs here" in words and "--allow-fetch" in words


@pytest.mark.parametrize("api", APIS)
def test_a_model_without_a_projector_refuses_an_image(in_process, api):
    words = refusal(api, f"http://127.0.0.1:{in_process['blind']}", IMAGE)
    assert "was loaded without a vision projector" in words and "--mmproj" in words


def test_vision_is_a_capability_and_raises_the_body_limit_only_with_a_projector(server, in_process):
    _, _, blind = clients(in_process["blind"])
    assert "vision" not in blind.show("target").capabilities
    body = json.dumps({"model": "target", "max_tokens": 4, "messages": openai_turn(data_url(CORRUPT * 35_000))})
    assert 4 << 20 < len(body) < 64 << 20
    status, reply, _ = server.post("/v1/chat/completions", body.encode())
    assert status == 400 and "could not be read" in reply["error"]["message"], reply  # read, not refused for size
    o, _, _ = clients(in_process["blind"])
    with pytest.raises(openai.APIStatusError) as caught:
        o.chat.completions.create(model="target", messages=openai_turn(data_url(CORRUPT * 35_000)), max_tokens=4)
    assert caught.value.status_code == 413


# -- --allow-fetch ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An http server on loopback serving an image, and a file larger than an image may be; yields its URL."""
    d = tmp_path_factory.mktemp("images")
    (d / "cat.png").write_bytes(OTHER)
    (d / "huge.png").write_bytes(OTHER + bytes(MAX_IMAGE_BYTES))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(d)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_allow_fetch_reads_an_http_image_and_refuses_one_too_large(server, pair, files):
    o, a, _ = clients(server.base)
    expected = want(pair, library(OTHER))
    r = o.chat.completions.create(model="target", messages=openai_turn(files + "/cat.png"), max_tokens=N,
                                  temperature=0)
    assert r.choices[0].message.content == expected.text
    m = a.messages.create(model="target", max_tokens=N, messages=anthropic_turn(files + "/cat.png"))
    assert m.content[0].text == expected.text
    too_large = refusal("openai", server.base, files + "/huge.png")
    assert too_large.startswith("messages[0].content[1]: the image at ") and "larger than the 20 MiB" in too_large
    missing = refusal("openai", server.base, files + "/missing.png")
    assert "could not be fetched" in missing and "404" in missing


def test_a_plain_allow_fetch_reads_public_addresses_only(files):
    from localspec.images import fetch_url

    with pytest.raises(ImageError, match="loopback, private or link-local address, which is not fetched"):
        fetch_url(files + "/cat.png")
    assert fetch_url(files + "/cat.png", private=True) == OTHER


def test_no_more_images_are_fetched_than_a_prompt_may_hold(server, files):
    o, _, _ = clients(server.base)
    parts = [{"type": "image_url", "image_url": {"url": f"{files}/cat.png"}}] * 17
    with pytest.raises(openai.BadRequestError) as caught:
        o.chat.completions.create(model="target", max_tokens=4,
                                  messages=[{"role": "user", "content": [*parts, {"type": "text", "text": "?"}]}])
    assert "messages[0].content[16]: a request may hold at most 16 images" in caught.value.body["message"]
