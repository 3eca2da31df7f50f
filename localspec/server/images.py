"""Images in requests: each API's image shapes read into the library's image parts, on the request's thread.

Every API's parser hands the images it finds here (OpenAI's ``image_url`` parts, Anthropic's ``image``
blocks, Ollama's ``images``, Responses' ``input_image`` parts). A ``data:`` URL or base64 text is decoded
into the image's bytes as sent (nothing is re-encoded); an ``http(s)`` URL is fetched now, before the
request is queued, and only where the server was started with ``--allow-fetch`` (``Limits.fetch``). Each
becomes the library's part ``{"type": "image", "image": BYTES}`` (``localspec.images``): a JSON body
cannot hold bytes, so no client can send that part itself (a path in it would read the server's files).
Whether the bytes are an image the projector reads (their format, their size) the library finds when the
generation starts, and the request gets a 400 saying so.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
from typing import Any, Mapping, Optional

from ..images import image_bytes
from ..runtime.vision import MAX_IMAGE_BYTES, MAX_IMAGES, ImageError
from .generation import Limits
from .http import ApiError

#: Images fetched for the request being parsed: no more than a prompt may hold are fetched.
_FETCHED: contextvars.ContextVar[int] = contextvars.ContextVar("fetched", default=0)
#: The part type the library reads an image's bytes from.
IMAGE = "image"
#: The code OpenAI's error object gives a refused image.
CODE = "invalid_value"


def image_part(data: bytes) -> dict[str, Any]:
    """The library's part for an image's bytes."""
    return {"type": IMAGE, IMAGE: data}


def is_image_part(part: Any) -> bool:
    """Whether ``part`` is the library's image part holding bytes (made here, never read from JSON)."""
    return isinstance(part, Mapping) and part.get("type") == IMAGE and isinstance(part.get(IMAGE), bytes)


def check_vision(where: str, limits: Limits, param: Optional[str] = None) -> None:
    """Refuse an image at ``where`` when the served model cannot read images.

    Raises:
        ApiError: 400 saying how to serve a model that can.
    """
    if not limits.vision:
        raise ApiError(400, f"{where} is an image, but this server's model was loaded without a vision "
                       "projector, so it cannot read images; start localspec serve with --mmproj FILE (the "
                       "model's mmproj GGUF) or send text only.", param=param, code="unsupported_parameter")


def from_url(url: Any, where: str, limits: Limits, param: Optional[str] = None) -> dict[str, Any]:
    """The image part for an image URL: a ``data:image/...;base64,`` URL decoded, or an ``http(s)`` URL fetched
    (where ``limits.fetch`` allows).

    Raises:
        ApiError: 400 when the model cannot read images, or the URL is malformed, not an image's, refused or
            cannot be fetched.
    """
    check_vision(where, limits, param)
    if not isinstance(url, str) or not url:
        raise ApiError(400, f"{where}: an image's URL must be a string, data:image/png;base64,DATA or an http(s) "
                       f"URL, got {type(url).__name__}.", param=param, code=CODE)
    if url.startswith(("http://", "https://")) and limits.fetch is not None:
        fetched = _FETCHED.get()  # this request's (each parse runs in a context of its own)
        if fetched >= MAX_IMAGES:
            raise ApiError(400, f"{where}: a request may hold at most {MAX_IMAGES} images; send fewer.",
                           param=param, code=CODE)
        _FETCHED.set(fetched + 1)
    try:
        return image_part(image_bytes({"type": "image_url", "image_url": url}, where, limits.fetch))
    except ImageError as exc:
        message = str(exc)
        if not message.startswith(where):  # the fetch's own sentence
            message = f"{where}: {message[:1].lower()}{message[1:]}"
        raise ApiError(400, message, param=param, code=CODE) from None


def from_base64(data: Any, where: str, limits: Limits, param: Optional[str] = None) -> dict[str, Any]:
    """The image part for an image's bytes sent as base64 text (Anthropic's and Ollama's way); a ``data:`` URL
    is read as one.

    Raises:
        ApiError: 400 when the model cannot read images, or the text is not base64 or too long.
    """
    check_vision(where, limits, param)
    if not isinstance(data, str) or not data:
        raise ApiError(400, f"{where}: an image must be its bytes as base64 text, got "
                       f"{'an empty string' if data == '' else type(data).__name__}.", param=param, code=CODE)
    if data.startswith("data:"):
        return from_url(data, where, limits, param)
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4 + len(data) // 64:  # room for line breaks
        raise ApiError(400, f"{where}: the image is larger than the {MAX_IMAGE_BYTES >> 20} MiB an image may be.",
                       param=param, code=CODE)
    try:
        return image_part(base64.b64decode("".join(data.split()), validate=True))
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{where}: the image's base64 is malformed; send the image file's bytes as standard "
                       "base64 (no data: prefix needed).", param=param, code=CODE) from None
