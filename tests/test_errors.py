"""Bad input gets one clear sentence naming the file or value, and loses nothing."""

from __future__ import annotations

import pytest

import localspec
from localspec.errors import (
    ConfigError,
    ContextOverflowError,
    ModelFileError,
    SamplingError,
    VocabMismatchError,
)


def test_missing_model_file_names_the_path(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist") as err:
        localspec.load(tmp_path / "nope.gguf")
    assert str(tmp_path / "nope.gguf") in str(err.value)


def test_a_file_that_is_not_gguf_is_refused_before_llama_cpp_sees_it(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("<html>404 Not Found</html>")
    with pytest.raises(ModelFileError, match="is not a GGUF file") as err:
        localspec.load(bad)
    assert str(bad) in str(err.value)


def test_a_truncated_gguf_is_refused(tmp_path, tiny_dir):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes((tiny_dir / "target.gguf").read_bytes()[:5000])
    with pytest.raises(ModelFileError, match="could not load") as err:
        localspec.load(cut)
    assert "cut.gguf" in str(err.value)


def test_a_directory_is_not_a_model(tmp_path):
    with pytest.raises(ModelFileError, match="not a file"):
        localspec.load(tmp_path)


def test_different_vocabularies_name_the_first_differing_token(tiny_dir):
    with pytest.raises(VocabMismatchError, match="token id 100") as err:
        localspec.load(tiny_dir / "target.gguf", tiny_dir / "renamed.gguf")
    assert "XYZ" in str(err.value)


def test_padded_vocabulary_is_allowed_with_a_warning(tmp_path):
    from tinymodel import vocabulary, write_tiny_model

    n = len(vocabulary()[0])
    write_tiny_model(tmp_path / "t.gguf", seed=0)
    write_tiny_model(tmp_path / "d.gguf", seed=0, noise=0.2, pad_to=n + 16)
    with pytest.warns(UserWarning, match="padding"):
        pair = localspec.load(tmp_path / "t.gguf", tmp_path / "d.gguf")
    with pair:
        plain = pair.generate("The cat sat", max_tokens=30, method="plain")
        assert pair.generate("The cat sat", max_tokens=30, method="draft", k=3).tokens == plain.tokens


def test_prompt_longer_than_the_context_fails_before_any_work(tiny_dir):
    with localspec.load(tiny_dir / "target.gguf", n_ctx=256) as pair:
        long = "word " * 100
        with pytest.raises(ContextOverflowError, match="256") as err:
            pair.generate(long)
        assert "tokens" in str(err.value)
        assert pair.target.n_past == 0  # nothing was evaluated
        assert pair.generate("hi", max_tokens=3).finish_reason == "length"


@pytest.mark.parametrize("options,cls,word", [
    (dict(temperature=-1), SamplingError, "temperature"),
    (dict(temperature=0.5, top_p=0), SamplingError, "top_p"),
    (dict(temperature=0.5, top_p=2), SamplingError, "top_p"),
    (dict(temperature=0.5, top_k=-3), SamplingError, "top_k"),
    (dict(temperature=0.5, min_p=3), SamplingError, "min_p"),
    (dict(method="beam"), ConfigError, "method"),
    (dict(method="draft", k=-1), ConfigError, "k"),
    (dict(max_tokens=0), ConfigError, "max_tokens"),
])
def test_invalid_generation_options_are_refused(tiny_pair, options, cls, word):
    with pytest.raises(cls, match=word):
        tiny_pair.generate("hello", **options)


def test_draft_method_without_a_draft_model_says_what_to_do(tiny_dir):
    with localspec.load(tiny_dir / "target.gguf") as pair:
        with pytest.raises(ConfigError, match="needs a draft model"):
            pair.generate("hello", method="draft")


def test_model_without_chat_template_refuses_chat(tmp_path):
    from tinymodel import write_tiny_model

    write_tiny_model(tmp_path / "nt.gguf", chat_template=None)
    with localspec.load(tmp_path / "nt.gguf") as pair:
        with pytest.raises(ConfigError, match="no chat template"):
            pair.chat([{"role": "user", "content": "hi"}])


def test_each_model_keeps_its_own_log_setting(tiny_dir, capfd, monkeypatch):
    import numpy as np

    from localspec.errors import BackendError
    from localspec.runtime.model import Model

    target = Model(tiny_dir / "target.gguf", n_ctx=256, verbose=True)
    assert "llama" in capfd.readouterr().err  # the verbose target shows llama.cpp's log
    draft = Model(tiny_dir / "draft.gguf", n_ctx=256, verbose=False)
    assert capfd.readouterr().err == ""  # the quiet draft does not
    try:
        for model, shown in ((draft, False), (target, True)):  # a quiet draft must not silence the target
            # let an id out of range through localspec's own check, to reach llama.cpp's
            monkeypatch.setattr(model, "check_tokens", lambda t: np.asarray(t, dtype=np.int32))
            with pytest.raises(BackendError, match="decode failed"):
                model.eval([model.n_vocab + 5])  # an id out of range: llama.cpp logs why it refuses
            err = capfd.readouterr().err
            assert ("invalid token" in err) == shown, err
    finally:
        target.close()
        draft.close()


def test_the_command_line_starts_without_loading_llama_cpp():
    import subprocess
    import sys

    code = "import sys, localspec.cli; print('llama_cpp' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
