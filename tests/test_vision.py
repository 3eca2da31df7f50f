"""Images in prompts: a tiny target with a tiny random vision projector (``tinyvision``).

What plain decoding of an image prompt gives is llama-cpp-python's own mtmd path on the same files; every drafting
method gives the same tokens; an image is encoded once however often it is read; several image requests decoded
together are each exact; bad images and a model without a projector get one clear sentence.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
from tinymodel import write_tiny_model
from tinyvision import png_bytes, write_tiny_mmproj
from tinyvision_families import PARTS_TEMPLATE

import localspec
from localspec.catalog.stores.layouts import find_projector
from localspec.errors import ConfigError, TokenIdError
from localspec.runtime.vision import ImageError

pytest.importorskip("llama_cpp.mtmd_cpp")


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("vision")
    write_tiny_model(d / "target.gguf", seed=0, chat_template=PARTS_TEMPLATE)
    write_tiny_model(d / "draft.gguf", seed=0, noise=0.35, chat_template=PARTS_TEMPLATE)
    write_tiny_mmproj(d / "mmproj-target-f16.gguf")
    return d


@pytest.fixture(scope="module")
def pair(vision_dir: Path):
    with localspec.load(vision_dir / "target.gguf", vision_dir / "draft.gguf", history=False, prompt_cache=False,
                        n_threads=2, notify=lambda _: None) as p:
        yield p


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def ask(image: bytes, question: str = "Describe this picture:", after: str = "in detail.") -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": question},
                                         {"type": "image_url", "image_url": {"url": data_url(image)}},
                                         {"type": "text", "text": after}]}]


def test_the_projector_beside_the_target_is_found(vision_dir: Path, pair) -> None:
    assert find_projector(vision_dir / "target.gguf") == vision_dir / "mmproj-target-f16.gguf"
    assert pair.target.projector is not None and pair.target.projector.path.name == "mmproj-target-f16.gguf"
    assert pair.draft.projector is None and pair.draft.stand_in is not None


def test_greedy_tokens_equal_llama_cpp_pythons_mtmd_chat_handler(vision_dir: Path, pair) -> None:
    import llama_cpp
    from llama_cpp.llama_chat_format import MTMDChatHandler

    image = png_bytes(40, 30, seed=3)
    ours = pair.chat(ask(image), max_tokens=24, method="plain", temperature=0)
    handler = MTMDChatHandler(str(vision_dir / "mmproj-target-f16.gguf"), verbose=False)
    llm = llama_cpp.Llama(str(vision_dir / "target.gguf"), chat_handler=handler, n_ctx=512, verbose=False)
    try:
        llm.create_chat_completion(messages=ask(image), max_tokens=24, temperature=0, repeat_penalty=1.0)
        # the handler's prompt positions, then what it generated (its last token is sampled, not evaluated)
        theirs = llm.input_ids[ours.stats.prompt_tokens: llm.n_tokens].tolist()
    finally:
        llm.close()
    assert len(theirs) >= 20
    assert ours.tokens[: len(theirs)] == theirs


@pytest.mark.parametrize("method", ["draft", "lookup", "auto"])
def test_every_method_gives_plain_decodings_tokens(pair, method: str) -> None:
    image = png_bytes(32, 32, seed=5)
    plain = pair.chat(ask(image), max_tokens=40, method="plain", temperature=0)
    assert pair.chat(ask(image), max_tokens=40, method=method, temperature=0).tokens == plain.tokens


def test_the_image_matters_and_a_later_turn_reads_it_from_the_cache(pair) -> None:
    a, b = png_bytes(32, 32, seed=11), png_bytes(32, 32, seed=12)
    ra = pair.chat(ask(a), max_tokens=16, method="plain", temperature=0)
    rb = pair.chat(ask(b), max_tokens=16, method="plain", temperature=0)
    assert ra.tokens != rb.tokens
    encodes = pair.target.projector.encodes
    follow = ask(a) + [{"role": "assistant", "content": ra.text}, {"role": "user", "content": "And the colours?"}]
    r = pair.chat(follow, max_tokens=8, method="plain", temperature=0)
    assert pair.target.projector.encodes == encodes  # a's cells went to b; its embeddings were kept
    again = pair.chat(follow, max_tokens=8, method="plain", temperature=0)
    assert again.tokens == r.tokens and pair.target.projector.encodes == encodes
    assert again.stats.cached_prompt_tokens >= again.stats.prompt_tokens - 1  # the image's cells were reused


def test_a_follow_up_restores_the_image_from_the_disk_prompt_cache(vision_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    image = png_bytes(36, 36, seed=21)
    first = None
    for _ in range(2):  # a second process's load: the projector is new, its embeddings are not held
        with localspec.load(vision_dir / "target.gguf", history=False, n_threads=2, cache_disk=64 << 20,
                            notify=lambda _: None) as p:
            r = p.chat(ask(image), max_tokens=12, method="plain", temperature=0)
            if first is None:
                first = r
                assert p.target.projector.encodes == 1
            else:
                assert r.tokens == first.tokens
                assert p.target.projector.encodes == 0, "the image was encoded again instead of restored"
                assert r.stats.cached_prompt_tokens > 16


def test_image_requests_decoded_together_are_each_exact(vision_dir: Path) -> None:
    prompts = [ask(png_bytes(32, 32, seed=s), q) for s, q in [(1, "What is this?"), (2, "Describe it."),
                                                             (1, "Colours?"), (3, "Count the dots.")]]
    with localspec.load(vision_dir / "target.gguf", vision_dir / "draft.gguf", history=False, prompt_cache=False,
                        n_threads=2, parallel=3, notify=lambda _: None) as p:
        alone = [p.chat(m, max_tokens=24, method="plain", temperature=0).tokens for m in prompts]
        together = p.generate_many(prompts, max_tokens=24, method="auto", temperature=0)
    assert [r.tokens for r in together] == alone


def test_image_parts_in_every_python_shape_read_the_same(pair, tmp_path: Path) -> None:
    image = png_bytes(30, 30, seed=9)
    (tmp_path / "pic.png").write_bytes(image)
    expected = pair.chat(ask(image), max_tokens=10, method="plain", temperature=0).tokens
    for value in (image, str(tmp_path / "pic.png"), tmp_path / "pic.png", data_url(image)):
        messages = ask(image)
        messages[0]["content"][1] = {"type": "image", "image": value}
        assert pair.chat(messages, max_tokens=10, method="plain", temperature=0).tokens == expected
    messages = ask(image)
    messages[0]["content"][1] = {"type": "image_url", "image_url": data_url(image)}  # the URL without its object
    assert pair.chat(messages, max_tokens=10, method="plain", temperature=0).tokens == expected


@pytest.mark.parametrize("image, words", [
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "could not be read"),
    (b"RIFF\0\0\0\0WEBPVP8 " + b"\0" * 30, "could not be read"),
    (b"", "empty"),
])
def test_a_bad_image_is_one_sentence_and_loses_nothing(pair, image: bytes, words: str) -> None:
    good = pair.chat(ask(png_bytes(32, 32, seed=4)), max_tokens=8, method="plain", temperature=0)
    messages = ask(png_bytes(32, 32, seed=4))
    messages[0]["content"][1] = {"type": "image", "image": image}
    with pytest.raises(ImageError, match=words):
        pair.chat(messages, max_tokens=8)
    again = pair.chat(ask(png_bytes(32, 32, seed=4)), max_tokens=8, method="plain", temperature=0)
    assert again.tokens == good.tokens


@pytest.mark.parametrize("part, words", [
    ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, "not fetched"),
    ({"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGVsbG8="}}, "not an image"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "base64"),
    ({"type": "image_url", "image_url": {}}, "image_url"),
    ({"type": "image", "image": "/no/such/file.png"}, "no image file"),
    ({"type": "image", "image": 7}, "bytes, a file path"),
])
def test_malformed_image_parts_are_named(pair, part: dict, words: str) -> None:
    messages = ask(png_bytes(8, 8))
    messages[0]["content"][1] = part
    with pytest.raises(ImageError, match=words):
        pair.chat(messages, max_tokens=4)


def test_too_many_images_are_refused(pair) -> None:
    image = {"type": "image", "image": png_bytes(8, 8)}
    with pytest.raises(ImageError, match="at most 16 images"):
        pair.chat([{"role": "user", "content": [image] * 17 + [{"type": "text", "text": "?"}]}], max_tokens=4)


def test_a_model_without_a_projector_refuses_an_image(tiny_pair) -> None:
    with pytest.raises(ImageError, match="without a vision projector"):
        tiny_pair.chat(ask(png_bytes(8, 8)), max_tokens=4)


def test_placeholders_are_not_token_ids_a_caller_may_send(pair) -> None:
    with pytest.raises(TokenIdError, match="outside the vocabulary"):
        pair.generate([1, 2, -5, 3], max_tokens=2)


def test_a_projector_made_for_another_width_is_refused(vision_dir: Path, tmp_path: Path) -> None:
    write_tiny_mmproj(tmp_path / "mmproj-32.gguf", n_embd_target=32)
    with pytest.raises(localspec.ModelFileError, match="could not be loaded as a vision projector"):
        localspec.load(vision_dir / "target.gguf", mmproj=tmp_path / "mmproj-32.gguf", notify=lambda _: None)


def test_mmproj_false_loads_none_and_a_missing_one_is_named(vision_dir: Path) -> None:
    with localspec.load(vision_dir / "target.gguf", mmproj=False, prompt_cache=False, notify=lambda _: None) as p:
        assert p.target.projector is None
    with pytest.raises((localspec.ModelFileError, ConfigError), match="nope.gguf"):
        localspec.load(vision_dir / "target.gguf", mmproj=vision_dir / "nope.gguf", notify=lambda _: None)


def test_placeholder_ids_follow_the_image_not_the_prompt(pair) -> None:
    projector = pair.target.projector
    image = png_bytes(32, 32, seed=31)
    one = np.array(projector.tokenize(f"a {projector.marker} b", [image]))
    two = np.array(projector.tokenize(f"other words {projector.marker}", [image]))
    assert sorted(one[one < 0]) == sorted(two[two < 0]) and (one < 0).sum() == 16
    other = np.array(projector.tokenize(f"a {projector.marker} b", [png_bytes(32, 32, seed=32)]))
    assert not set(other[other < 0]) & set(one[one < 0])


# -- families whose images decode differently: M-RoPE positions (Qwen2-VL), non-causal attention (Gemma 3) --

@pytest.fixture(scope="module", params=["qwen2vl", "gemma3v"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tinyvision_families import write_tiny_gemma3v, write_tiny_qwen2vl

    writer = {"qwen2vl": write_tiny_qwen2vl, "gemma3v": write_tiny_gemma3v}[request.param]
    return writer(tmp_path_factory.mktemp(request.param))


def test_a_familys_greedy_tokens_equal_llama_cpp_pythons_and_every_method_gives_them(family) -> None:
    import llama_cpp
    from llama_cpp.llama_chat_format import MTMDChatHandler

    target, mmproj = family
    image = png_bytes(40, 30, seed=3)
    with localspec.load(target, history=False, prompt_cache=False, n_threads=2, notify=lambda _: None) as p:
        ours = p.chat(ask(image), max_tokens=24, method="plain", temperature=0)
        for method in ("lookup", "auto"):
            assert p.chat(ask(image), max_tokens=24, method=method, temperature=0).tokens == ours.tokens, method
    llm = llama_cpp.Llama(str(target), chat_handler=MTMDChatHandler(str(mmproj), verbose=False), n_ctx=1024,
                          verbose=False)
    try:
        llm.create_chat_completion(messages=ask(image), max_tokens=24, temperature=0, repeat_penalty=1.0)
        theirs = llm.input_ids[ours.stats.prompt_tokens: llm.n_tokens].tolist()  # positions, as ours counts them
    finally:
        llm.close()
    assert len(theirs) >= 20 and ours.tokens[: len(theirs)] == theirs


def test_a_familys_follow_up_restores_its_image_and_requests_together_are_exact(family, tmp_path: Path,
                                                                                 monkeypatch) -> None:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    target, _ = family
    prompts = [ask(png_bytes(40, 30, seed=s), q) for s, q in [(1, "What?"), (2, "Describe it."), (1, "Colours?")]]
    with localspec.load(target, history=False, n_threads=2, parallel=3, cache_disk=64 << 20,
                        notify=lambda _: None) as p:
        alone = [p.chat(m, max_tokens=16, method="plain", temperature=0) for m in prompts]
        together = p.generate_many(prompts, max_tokens=16, method="auto", temperature=0)
        assert [r.tokens for r in together] == [r.tokens for r in alone]
    follow = prompts[1] + [{"role": "assistant", "content": alone[1].text}, {"role": "user", "content": "More?"}]
    with localspec.load(target, history=False, n_threads=2, cache_disk=64 << 20, notify=lambda _: None) as p:
        r = p.chat(follow, max_tokens=8, method="plain", temperature=0)
        assert p.target.projector.encodes == 0 and r.stats.cached_prompt_tokens >= alone[1].stats.prompt_tokens - 1
    with localspec.load(target, history=False, prompt_cache=False, n_threads=2, notify=lambda _: None) as p:
        assert p.chat(follow, max_tokens=8, method="plain", temperature=0).tokens == r.tokens


def test_an_ollama_models_projector_layer_is_loaded_with_it(vision_dir: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import json
    import shutil

    store = tmp_path / "ollama"
    (store / "blobs").mkdir(parents=True)
    digests = {}
    for name, kind in (("target.gguf", "model"), ("mmproj-target-f16.gguf", "projector")):
        digests[kind] = hashlib.sha256((vision_dir / name).read_bytes()).hexdigest()
        shutil.copy(vision_dir / name, store / "blobs" / f"sha256-{digests[kind]}")
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "tinyvl" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": f"application/vnd.ollama.image.{kind}", "digest": f"sha256:{d}", "size": 1}
        for kind, d in digests.items()]}))
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    with localspec.load("ollama:tinyvl:latest", draft="none", history=False, prompt_cache=False,
                        notify=lambda _: None) as p:
        assert p.target.projector is not None
        assert p.target.projector.path.name == f"sha256-{digests['projector']}"
        assert p.chat(ask(png_bytes(16, 16)), max_tokens=4, method="plain").tokens


def test_another_models_projector_beside_a_model_leaves_images_off_with_a_notice(tmp_path: Path) -> None:
    write_tiny_model(tmp_path / "narrow.gguf", seed=0, n_embd=32, n_head=2, n_head_kv=1)
    write_tiny_mmproj(tmp_path / "mmproj-target.gguf")  # made for the 64-wide target
    notices: list[str] = []
    with localspec.load(tmp_path / "narrow.gguf", history=False, prompt_cache=False, notify=notices.append) as p:
        assert p.target.projector is None
        assert p.generate("hi", max_tokens=2, method="plain").tokens
    assert any("is not its vision projector; images are off" in n for n in notices)


def test_generate_reads_images_for_its_message(vision_dir: Path, pair, tmp_path: Path) -> None:
    import json

    from clirun import run_cli

    image = png_bytes(24, 24, seed=8)
    (tmp_path / "a.png").write_bytes(image)
    expected = pair.chat([{"role": "user", "content": [{"type": "image", "image": image},
                                                       {"type": "text", "text": "Describe:"}]}],
                         max_tokens=6, method="plain", temperature=0)
    r = run_cli(["generate", "-t", str(vision_dir / "target.gguf"), "-d", "none", "--message", "Describe:",
                 "--image", str(tmp_path / "a.png"), "-n", "6", "--method", "plain", "--json", "--threads", "2"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tokens"] == expected.tokens
    r = run_cli(["generate", "-t", str(vision_dir / "target.gguf"), "--prompt", "x",
                 "--image", str(tmp_path / "a.png")])
    assert r.exit_code != 0 and "--image goes with --message" in r.output
    r = run_cli(["generate", "-t", str(vision_dir / "target.gguf"), "-d", "none", "--mmproj", "none", "--message",
                 "x", "--image", str(tmp_path / "a.png"), "-n", "2"])
    assert r.exit_code != 0 and "without a vision projector" in r.output and "Traceback" not in r.output


def test_webp_reads_as_the_same_pixels_in_png_and_a_pixel_bomb_is_refused(pair) -> None:
    import io

    from PIL import Image

    png = png_bytes(32, 32, seed=14)
    webp = io.BytesIO()
    Image.open(io.BytesIO(png)).save(webp, format="WEBP", lossless=True)
    expected = pair.chat(ask(png), max_tokens=8, method="plain", temperature=0).tokens
    assert pair.chat(ask(webp.getvalue()), max_tokens=8, method="plain", temperature=0).tokens == expected
    bomb = io.BytesIO()
    Image.new("1", (9000, 9000)).save(bomb, format="PNG")  # a few KB that would decode to 243 MB of pixels
    assert len(bomb.getvalue()) < 100_000
    with pytest.raises(ImageError, match="9000 x 9000 pixels, more than"):
        pair.chat(ask(bomb.getvalue()), max_tokens=4)


def test_a_prompts_images_outlive_the_projectors_small_memory_of_recent_ones(pair, monkeypatch) -> None:
    from localspec.runtime import vision

    monkeypatch.setattr(vision, "HELD_CHUNKS", 2)
    images = [{"type": "image", "image": png_bytes(16, 16, seed=40 + i)} for i in range(5)]
    r = pair.chat([{"role": "user", "content": [*images, {"type": "text", "text": "Compare them."}]}],
                  max_tokens=4, method="plain", temperature=0)
    assert r.stats.prompt_tokens > 5 * 16


def test_a_state_saved_with_an_unknown_image_still_serves_its_text_prefix(vision_dir: Path, tmp_path: Path,
                                                                          monkeypatch) -> None:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    system = {"role": "system", "content": "You describe pictures for a catalogue. " * 30}
    for seed in (50, 51):  # a second process: the first image is unknown to its projector
        with localspec.load(vision_dir / "target.gguf", history=False, n_threads=2, cache_disk=64 << 20,
                            notify=lambda _: None) as p:
            r = p.chat([system, *ask(png_bytes(16, 16, seed=seed))], max_tokens=4, method="plain", temperature=0)
    assert r.stats.cached_prompt_tokens > 150  # the system prompt, restored


def test_an_image_prompts_ids_generate_again_under_every_method(pair) -> None:
    first = pair.chat(ask(png_bytes(20, 20, seed=60)), max_tokens=8, method="plain", temperature=0)
    ids = list(first.prompt_tokens)
    for method in ("plain", "lookup", "auto"):
        assert pair.generate(ids, max_tokens=8, method=method, temperature=0).tokens == first.tokens, method


def test_sampled_speculation_beside_an_image_keeps_plain_decodings_distribution(pair) -> None:
    from helpers import same_distribution

    messages = ask(png_bytes(32, 32, seed=70), "Describe this picture:", "the picture, the picture, the")
    ids = pair.chat(messages, max_tokens=1, method="plain").prompt_tokens  # the image's ids, read once

    def counts(position: int, **options) -> dict[int, int]:
        out: dict[int, int] = {}
        for seed in range(800):
            r = pair.generate(ids, max_tokens=position + 1, temperature=1.0, seed=seed, **options)
            if len(r.tokens) > position:
                out[r.tokens[position]] = out.get(r.tokens[position], 0) + 1
        return out

    for position in (1, 3):  # tokens a speculative round decides
        plain = counts(position, method="plain")
        for method in ("draft", "lookup"):
            p = same_distribution(plain, counts(position, method=method, k=3))
            assert p > 1e-3, f"{method} position {position}: chi-square p = {p:.2e}"


def test_a_registered_pair_names_its_projector(vision_dir: Path, tmp_path: Path, monkeypatch) -> None:
    from clirun import run_cli

    from localspec.catalog import registry

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    models, elsewhere = tmp_path / "models", tmp_path / "projectors" / "vision.gguf"  # only the pair says where
    for folder, name in ((models, "target.gguf"), (models, "draft.gguf"), (elsewhere.parent, None)):
        folder.mkdir(exist_ok=True)
        if name:
            (folder / name).write_bytes((vision_dir / name).read_bytes())
    elsewhere.write_bytes((vision_dir / "mmproj-target-f16.gguf").read_bytes())
    r = run_cli(["add", "seeing", "-t", str(models / "target.gguf"), "-d", str(models / "draft.gguf"),
                 "--mmproj", str(elsewhere)])
    assert r.exit_code == 0, r.output
    assert registry.get_pair("seeing").mmproj.path == str(elsewhere)
    with localspec.load("seeing", history=False, prompt_cache=False, notify=lambda _: None) as p:
        assert p.target.projector is not None and p.target.projector.path == elsewhere
    with localspec.load("seeing", history=False, prompt_cache=False, mmproj=False, notify=lambda _: None) as p:
        assert p.target.projector is None
    elsewhere.unlink()  # gone: the pair still reads text, and says why it sees no images
    notices: list[str] = []
    with localspec.load("seeing", history=False, prompt_cache=False, notify=notices.append) as p:
        assert p.target.projector is None and p.generate("hi", max_tokens=2, method="plain").tokens
    assert any("vision projector of pair 'seeing'" in n and "images are off" in n for n in notices), notices


def test_an_image_is_encoded_off_the_step_loop_while_the_others_step(vision_dir: Path, monkeypatch) -> None:
    import threading

    from localspec.runtime.vision import Projector

    threads: list[str] = []
    original = Projector._encode

    def recorded(self, chunk):
        if chunk.embd is None:
            threads.append(threading.current_thread().name)
        return original(self, chunk)

    monkeypatch.setattr(Projector, "_encode", recorded)
    prompts = [[{"role": "user", "content": "Write a long story about a lighthouse."}],
               ask(png_bytes(32, 32, seed=80)), ask(png_bytes(32, 32, seed=81))]
    with localspec.load(vision_dir / "target.gguf", vision_dir / "draft.gguf", history=False, prompt_cache=False,
                        n_threads=2, parallel=3, notify=lambda _: None) as p:
        together = p.generate_many(prompts, max_tokens=24, method="auto", temperature=0)
        assert len(threads) == 2 and all(name.startswith("localspec-image") for name in threads), threads
        alone = [p.chat(m, max_tokens=24, method="plain", temperature=0).tokens for m in prompts]
    assert [r.tokens for r in together] == alone


def test_m_rope_images_are_counted_by_their_cells_and_wait_for_room(tmp_path: Path) -> None:
    from tinyvision_families import write_tiny_qwen2vl

    target, _ = write_tiny_qwen2vl(tmp_path)
    prompts = [ask(png_bytes(128, 128, seed=s), q) for s, q in [(1, "What?"), (2, "Describe it."), (3, "Colours?")]]
    with localspec.load(target, history=False, prompt_cache=False, n_threads=2, parallel=3, n_ctx=200,
                        notify=lambda _: None) as p:
        ids = np.asarray(p.chat(prompts[0], max_tokens=24, method="plain", temperature=0).prompt_tokens)
        assert p.target.prompt_cells(ids) == len(ids) + 64 - 8  # the image: 64 embeddings in 8 positions
        alone = [p.chat(m, max_tokens=24, method="plain", temperature=0).tokens for m in prompts]
        # three such requests need more cells than the context has: they wait for room, none fails
        together = p.generate_many(prompts, max_tokens=24, method="auto", temperature=0)
    assert [r.tokens for r in together] == alone
