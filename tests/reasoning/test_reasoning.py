"""The reasoning reader: a reply split into reasoning and answer, whole or streamed in any chunks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from localspec.reasoning.formats import (
    ANSWER,
    BRACKETS,
    HARMONY,
    REASONING,
    THINK,
    ReasoningReader,
    joined,
    opened_in,
    split,
)

# text built from pieces that are, or look like, markers: the splits must not depend on the chunking
PARTS = st.sampled_from(["<think>", "</think>", "<", "</", "think>", "<th", " ", "\n", "a", "b c", "<|end|>",
                         "<|channel|>analysis<|message|>", "<|channel|>final<|message|>", "<|start|>assistant",
                         "<|", "final", "é", "[THINK]", "[/THINK]", "[TH"])
TEXTS = st.lists(PARTS, max_size=30).map("".join)


def streamed(text: str, cuts: list[int], fmt=THINK, inside: bool = False):
    reader = ReasoningReader(fmt, inside)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [p for a, b in zip(bounds[:-1], bounds[1:], strict=True) for p in reader.feed(text[a:b])] + reader.flush()
    return joined(reader, pieces)


@given(TEXTS, st.lists(st.integers(0, 400)), st.sampled_from([THINK, HARMONY, BRACKETS]), st.booleans())
def test_any_chunking_splits_as_the_whole_text(text, cuts, fmt, inside):
    assert streamed(text, cuts, fmt, inside) == split(text, fmt, inside)


@given(st.lists(st.integers(0, 400)), st.text(alphabet="ab <>/\n", max_size=40),
       st.text(alphabet="ab <>/\n{}", max_size=40))
def test_think_block_then_answer(cuts, reasoning, answer):
    reasoning = reasoning.replace("<think>", "").replace("</think>", "")
    text = f"<think>\n{reasoning}\n</think>\n\n{answer}"
    whole = split(text, THINK)
    assert whole == (reasoning.strip(), answer.lstrip())
    assert streamed(text, cuts) == whole


def test_reply_without_reasoning_is_unchanged():
    for text in ("  hello <think> there", "\n\nplain", "", "a</think>b", "<thinking"):
        assert split(text, THINK) == (None, text)


def test_reply_that_starts_inside_the_reasoning():
    assert split("step one\nstep two</think>\n\n42", THINK, inside=True) == ("step one\nstep two", "42")
    assert split("still thinking", THINK, inside=True) == ("still thinking", "")
    assert opened_in("<|im_start|>assistant\n<think>\n", THINK)
    assert not opened_in("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)


def test_harmony_channels():
    text = ("<|channel|>analysis<|message|>User wants 2+2.<|end|><|start|>assistant"
            "<|channel|>final<|message|>4")
    assert split(text, HARMONY) == ("User wants 2+2.", "4")
    assert split("<|channel|>final<|message|>just this", HARMONY) == (None, "just this")


def test_magistral_brackets():
    assert split("[THINK]Two and two.[/THINK]4", BRACKETS) == ("Two and two.", "4")


def test_a_marker_split_across_chunks_is_read_once_whole():
    reader = ReasoningReader(THINK)
    pieces = [p for chunk in ("<th", "ink>", "hm", "m</", "thi", "nk>", "ok") for p in reader.feed(chunk)]
    pieces += reader.flush()
    assert [p.kind for p in pieces if p.text] == [REASONING, REASONING, ANSWER]
    assert joined(reader, pieces) == ("hmm", "ok")
