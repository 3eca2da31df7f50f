"""Stop strings in streamed text: what is safe to show, and where the text ends."""

from __future__ import annotations

from typing import Optional, Sequence


class StopText:
    """Finds stop strings in streamed text, holding back what could be the start of one.

    ``feed`` returns the text that is safe to show: everything before a
    complete stop string (then ``stopped`` is True), or everything except a
    tail that a stop string could still begin with.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [x for x in stops if x]
        self.stopped = False
        self.matched: Optional[str] = None  # the stop string that came, once one has
        self._held = ""

    def feed(self, text: str) -> str:
        """The part of ``text`` (after what was held back) that is safe to show now."""
        if not self.stops or self.stopped:
            return "" if self.stopped else text
        buf = self._held + text
        hits = [i for i in (buf.find(x) for x in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            at = min(hits)
            self.matched = next(x for x in self.stops if buf.find(x) == at)
            return buf[:at]
        # keep back the longest tail of buf that is a proper prefix of some stop string
        keep = max((n for x in self.stops for n in range(1, min(len(x) - 1, len(buf)) + 1)
                    if buf.endswith(x[:n])), default=0)
        self._held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """What is held back, once no more text will come."""
        held, self._held = self._held, ""
        return held
