"""A tool call written as a ```json block or a bare object, as Qwen2.5-Coder writes one under a long agent
prompt: read as the call where it comes first and names a tool offered, and as text otherwise, whole and however the
text is cut; served as Anthropic's tool_use."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localspec.structured.call_reader import CallReader, read_calls

NAMES = frozenset({"Read", "Bash"})
READ = '{"file_path": "calc.py"}'
BLOCK = f'```json\n{{\n  "name": "Read",\n  "arguments": {READ}\n}}\n```'

CASES = [
    # the block alone, with a language or none, after blank lines
    (BLOCK, "", [("Read", READ)]),
    (BLOCK.replace("```json", "```"), "", [("Read", READ)]),
    ("\n\n" + BLOCK + "\n", "", [("Read", READ)]),
    (BLOCK.replace("```json", "```JSON "), "", [("Read", READ)]),
    # two calls, then what the model says after them
    (BLOCK + "\n" + BLOCK.replace("Read", "Bash").replace(READ, '{"command": "ls"}') + "\nDone.", "Done.",
     [("Read", READ), ("Bash", '{"command": "ls"}')]),
    # the bare object, without a block, and text after it
    (f'{{"name": "Read", "arguments": {READ}}}', "", [("Read", READ)]),
    (f' {{\n  "name": "Read",\n  "arguments": {READ}\n}}\nReading it.', "Reading it.", [("Read", READ)]),
    # nested arguments, and a fence inside a string of them
    ('```json\n{"name": "Bash", "arguments": {"command": "echo ```", "env": {"A": [1, 2]}}}\n```', "",
     [("Bash", '{"command": "echo ```", "env": {"A": [1, 2]}}')]),
    # not calls: another language, a tool not offered, other JSON, a block after text, arguments not an object
    ("```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    ('```json\n{"name": "Write", "arguments": {}}\n```', '```json\n{"name": "Write", "arguments": {}}\n```', []),
    ('```json\n{"a": 1}\n```', '```json\n{"a": 1}\n```', []),
    ("Here:\n" + BLOCK, "Here:\n" + BLOCK, []),
    ('```json\n{"name": "Read", "arguments": "calc.py"}\n```', '```json\n{"name": "Read", "arguments": "calc.py"}\n```',
     []),
    ('```json\n{"name": "Read", "file": 1}\n```', '```json\n{"name": "Read", "file": 1}\n```', []),
    ('{"name": "Write", "arguments": {}}', '{"name": "Write", "arguments": {}}', []),
    ('{"city": "Paris"}', '{"city": "Paris"}', []),
    ("``", "``", []),
    ("", "", []),
]


def _read(text: str, cuts: list[int], fenced: frozenset[str] = NAMES) -> tuple[str, list[tuple[str, str]], bool]:
    """Read ``text`` fed in pieces cut at ``cuts``, from the events alone: the content, the calls, cut."""
    reader, content, calls, start = CallReader(fenced=fenced), [], [], 0
    events = []
    for at in sorted({min(c, len(text)) for c in cuts} | {len(text)}):
        events += reader.feed(text[start:at])
        start = at
    events += reader.close()
    for e in events:
        if e.kind == "content":
            content.append(e.text)
        elif e.kind == "call":
            calls.append([e.text, ""])
        else:
            calls[-1][1] += e.text
    return "".join(content), [(n, a) for n, a in calls], reader.cut


@pytest.mark.parametrize("text,content,calls", CASES)
def test_a_call_in_a_code_block_is_read_where_it_comes_first_and_names_a_tool(text, content, calls):
    reader = read_calls(text, NAMES)
    assert "".join(reader.content) == content
    assert [(c.name, c.arguments) for c in reader.calls] == calls
    assert not reader.cut
    for c in reader.calls:
        json.loads(c.arguments)


@given(st.sampled_from(CASES), st.lists(st.integers(0, 160), max_size=12))
def test_a_code_block_reads_the_same_however_the_text_is_cut(case, cuts):
    text, content, calls = case
    assert _read(text, cuts) == (content, calls, False)


@pytest.mark.parametrize("text", [BLOCK, "```python\nx\n```"])
def test_without_tools_to_name_a_code_block_is_text(text):
    assert _read(text, [3, 9], frozenset()) == (text, [], False)


def test_a_block_cut_off_in_its_arguments_is_a_call_marked_cut():
    text = '```json\n{"name": "Read", "arguments": {"file_path": "ca'
    assert _read(text, [5, 20, 40]) == ("", [("Read", '{"file_path": "ca')], True)


def test_text_is_not_held_back_once_it_cannot_be_a_call():
    reader = CallReader(fenced=NAMES)
    assert [e.text for e in reader.feed("```py")] == []  # a fence line, not yet told
    # told: another language, sent at once (but for the whitespace, which may still come before a <tool_call>)
    assert [e.text for e in reader.feed("thon\n")] == ["```python"]
    reader = CallReader(fenced=NAMES)
    assert [e.text for e in reader.feed('```json\n{"name": "Re')] == []  # may still name Read
    assert "".join(e.text for e in reader.feed('ad2", ')) == '```json\n{"name": "Read2",'  # no such tool


@given(st.text(st.sampled_from('`{}":, \njsonRead'), max_size=40), st.lists(st.integers(0, 40), max_size=6))
def test_any_text_reads_the_same_whole_and_in_pieces_and_loses_nothing(text, cuts):
    whole = read_calls(text, NAMES)
    content, calls, cut = _read(text, cuts)
    assert (content, calls, cut) == ("".join(whole.content), [(c.name, c.arguments) for c in whole.calls], whole.cut)
    if not calls:  # what is not a call comes back as it was written
        assert content == text or (whole.cut and text.startswith(content))
