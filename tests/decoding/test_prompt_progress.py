"""A stream says how far the model has read its prompt while it reads it (a long prompt's progress), and
nothing before or after."""

from __future__ import annotations

import localspec


def test_prompt_read_counts_up_while_the_prompt_is_read(tiny_dir, monkeypatch):
    with localspec.load(tiny_dir / "target.gguf", n_ctx=2048, prompt_cache=False, history=False) as pair:
        batch = pair.target.n_batch
        prompt = " ".join(f"word{i}" for i in range(200))  # about 1,300 tokens
        stream = pair.stream(prompt, max_tokens=2, method="plain")
        seen: list = []
        decode = pair.target._decode

        def watched(*args, **kwargs):
            seen.append(stream.prompt_read)
            return decode(*args, **kwargs)

        monkeypatch.setattr(pair.target, "_decode", watched)
        assert stream.prompt_read is None  # nothing read yet
        next(iter(stream))
        assert stream.prompt_read is None  # the prompt is read
        total = stream.prompt_tokens
        reading = seen[: -(-total // batch)]  # the prompt's decode calls, then the first rounds'
        assert total > batch * 2
        assert len(reading) == -(-total // batch)  # the watch saw every decode call of the prompt
        assert reading == [i * batch for i in range(len(reading))]
