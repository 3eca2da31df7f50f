"""OpenAI's ``logprobs`` shapes for the server: chat's ``content`` list and completions' parallel lists.

The worker turns each token event into chat's entry (``token``, ``logprob``,
``bytes``, ``top_logprobs``); a completion's ``tokens``, ``token_logprobs``,
``top_logprobs`` and ``text_offset`` are built from the same entries.
"""

from __future__ import annotations

from typing import Any, Callable

from ...events import TokenEvent


def entry(ev: TokenEvent, piece: Callable[[int], bytes]) -> dict[str, Any]:
    """Chat's logprobs entry for one token event (``piece``: a token id's bytes)."""
    def one(token: int, logprob: float) -> dict[str, Any]:
        raw = piece(token)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    assert ev.logprob is not None
    return {**one(ev.token, ev.logprob), "top_logprobs": [one(t, lp) for t, lp in ev.top_logprobs]}


def chat(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat choice's ``logprobs``."""
    return {"content": entries, "refusal": None}


def completion(entries: list[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """A completion choice's ``logprobs``, its text starting ``offset`` characters in (after the prompt, as
    llama-cpp-python counts). Two tokens that read the same share one key of ``top_logprobs`` (the likelier's)."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{**{t["token"]: t["logprob"] for t in reversed(e["top_logprobs"])},
                              e["token"]: e["logprob"]} for e in entries],  # the chosen token too, as OpenAI
            "text_offset": offsets}
