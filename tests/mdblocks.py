"""Markdown as the docs tests read it: fenced code blocks and the prose lines outside them."""

from __future__ import annotations

import re
from typing import Iterator, NamedTuple, Optional

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def _closes(m: Optional[re.Match[str]], fence: str) -> bool:
    return bool(m) and m.group(2)[0] == fence[0] and len(m.group(2)) >= len(fence) and not m.group(3).strip()


def prose_lines(text: str, blank_code: bool = True) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` outside fenced code blocks, with inline code spans blanked unless told."""
    fence = None
    for no, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(2)
            continue
        if fence is not None:
            if _closes(m, fence):
                fence = None
            continue
        yield no, re.sub(r"(`+)(.+?)\1", lambda c: " " * len(c.group(0)), line) if blank_code else line


class Block(NamedTuple):
    """A fenced code block."""

    line: int  #: of the opening fence (1-based)
    info: str  #: the info string's first word, lower-cased ("" when none)
    code: str  #: the content, dedented by the opening fence's indentation


def fenced_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, in order."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).strip()
        body = []
        j = i + 1
        while j < len(lines) and not _closes(FENCE.match(lines[j]), fence):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j].lstrip())
            j += 1
        out.append(Block(i + 1, info.split()[0].strip("{}.").lower() if info else "", "\n".join(body) + "\n"))
        i = j + 1
    return out
