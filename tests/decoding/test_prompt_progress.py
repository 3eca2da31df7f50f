"""A stream says how far the model has read its prompt while it reads it (a long prompt's progress), and
nothing before or after; its target says how many steps it still expects (what a step of several sequences
weighs a prompt's reading against)."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("method", ["plain", "lookup"])
def test_a_generation_says_how_many_steps_it_still_expects(tiny_dir, monkeypatch, method):
    with localspec.load(tiny_dir / "target.gguf", n_ctx=2048, prompt_cache=False, history=False) as pair:
        target, seen = pair.target, []
        stream = pair.stream("in the end, in the end, in the end, in the end, in the", max_tokens=40, method=method)
        decode = target._decode

        def watched(*args, **kwargs):
            seen.append((target.steps_left, stream.stats.generated_tokens, stream.stats.rounds, target.reading_end))
            return decode(*args, **kwargs)

        monkeypatch.setattr(target, "_decode", watched)
        tokens = [ev.token for ev in stream]
        assert target.steps_left is None and target.reading_end is None  # nothing expected once it ended
    # reading the prompt: where it ends, and the whole reply to come; then no prompt being read
    assert seen[0] == (40, 0, 0, stream.prompt_tokens)
    assert all(end is None for *_, end in seen[1:])
    left = [steps for steps, *_ in seen[1:]]
    assert len(tokens) > 20 and len(left) > 3
    if method == "plain":  # a token a round: before each round, the tokens still to come
        assert left == [40 - made for _, made, *_ in seen[1:]]
    else:  # rounds that copied several tokens: fewer rounds expected than tokens
        assert all(steps <= 40 - made for steps, made, *_ in seen[1:])
        assert any(steps < 40 - made for steps, made, *_ in seen[1:]), seen
