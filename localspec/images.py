"""Images in chat messages: the parts that carry them, read into bytes, and the text a template renders.

A message's ``content`` may be a list of parts. Besides ``{"type": "text", "text": ...}``, a part may be an image:

- ``{"type": "image", "image": DATA}``, DATA being the image's bytes, a path to a file, or a ``data:`` URL;
- ``{"type": "image_url", "image_url": {"url": URL}}`` (OpenAI's shape; ``image_url`` may be the URL itself),
  URL a ``data:image/...;base64,`` URL, or an ``http(s)`` one where the caller allows fetching.

Each API's server shape (Anthropic's ``image`` blocks, Ollama's ``images``, Responses' ``input_image``) is read
into these parts where it is parsed. ``with_markers`` turns such messages into text messages for the chat
template, each image replaced by its projector's marker, text parts joined by newlines (none around an image,
as llama.cpp's server joins them), and gives the images in order.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import socket
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from .runtime.model import Model
from .runtime.vision import MAX_IMAGE_BYTES, ImageError

__all__ = ["MAX_IMAGE_BYTES", "ImageError", "fetch_url", "image_bytes", "image_messages", "prompt_tokens",
           "with_markers"]

#: The part types that carry an image.
IMAGE_PARTS = frozenset({"image", "image_url"})
#: Seconds an ``http(s)`` image may take to fetch, in all.
FETCH_TIMEOUT = 20.0
#: Seconds a fetch may wait for the next bytes.
FETCH_STALL = 5.0

Fetch = Callable[[str], bytes]


def has_images(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any message holds an image part."""
    return any(isinstance(m, Mapping) and isinstance(m.get("content"), list)
               and any(isinstance(p, Mapping) and p.get("type") in IMAGE_PARTS for p in m["content"])
               for m in messages)


def image_messages(target: Model, messages: Sequence[Mapping[str, Any]], fetch: Optional[Fetch] = None
                   ) -> tuple[Sequence[Mapping[str, Any]], list[bytes]]:
    """``messages`` ready for ``target``'s chat template and the images they hold (``with_markers``; unchanged and
    none where they hold no image).

    Raises:
        ImageError: as ``with_markers``, or the messages hold an image and ``target`` has no projector.
    """
    if not has_images(messages):
        return messages, []
    if target.projector is None:
        raise ImageError(f"{target.path.name} was loaded without a vision projector, so it cannot read images; "
                         "load its mmproj GGUF with it (mmproj=..., --mmproj).")
    return with_markers(messages, target.projector.marker, fetch)


def prompt_tokens(target: Model, text: str, images: Sequence[bytes]) -> list[int]:
    """A rendered chat prompt's ids: its text tokens, and the images' placeholders where their markers are."""
    if not images:
        return target.tokenize(text, add_special=False)
    assert target.projector is not None  # ``image_messages`` gave the images
    return target.projector.tokenize(text, images)


def with_markers(messages: Sequence[Mapping[str, Any]], marker: str,
                 fetch: Optional[Fetch] = None) -> tuple[list[dict[str, Any]], list[bytes]]:
    """``messages`` with each content list that holds an image as text, ``marker`` where each image goes, and
    the images' bytes in order.

    Args:
        fetch: reads an ``http(s)`` URL (None: such URLs are refused).

    Raises:
        ImageError: a part is malformed, a file or URL cannot be read, or a data URL is not base64.
    """
    out: list[dict[str, Any]] = []
    images: list[bytes] = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not (isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") in IMAGE_PARTS
                                                  for p in content)):
            out.append(dict(m))
            continue
        text, after_image = "", False
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind in IMAGE_PARTS:
                images.append(image_bytes(part, where, fetch))
                text += marker
                after_image = True
            elif kind == "text" and isinstance(part.get("text"), str):  # type: ignore[union-attr]
                if text and not after_image:
                    text += "\n"
                text += part["text"]  # type: ignore[index]
                after_image = False
            else:
                raise ImageError(f"{where} is neither a text part nor an image part.")
        out.append({**m, "content": text})
    return out, images


def image_bytes(part: Mapping[str, Any], where: str, fetch: Optional[Fetch] = None) -> bytes:
    """The bytes of one image part (see the module's docstring for its shapes)."""
    if part.get("type") == "image_url":
        value = part.get("image_url")
        value = value.get("url") if isinstance(value, Mapping) else value
        if not isinstance(value, str):
            raise ImageError(f'{where}: "image_url" must hold {{"url": "data:image/png;base64,..."}}.')
        return _from_url(value, where, fetch)
    value = part.get("image")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str) and value.startswith(("data:", "http://", "https://")):
        return _from_url(value, where, fetch)
    if isinstance(value, (str, os.PathLike)):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ImageError(f"{where}: no image file at {path}.")
        if path.stat().st_size > MAX_IMAGE_BYTES:
            raise ImageError(f"{where}: {path} is larger than the {MAX_IMAGE_BYTES >> 20} MiB an image may be.")
        return path.read_bytes()
    raise ImageError(f'{where}: "image" must be the image\'s bytes, a file path or a data: URL.')


def _from_url(url: str, where: str, fetch: Optional[Fetch]) -> bytes:
    if url.startswith(("http://", "https://")):
        if fetch is None:
            raise ImageError(f"{where}: images are not fetched from URLs here; send the image inline as a "
                             "data:image/...;base64 URL (a server fetches them when started with --allow-fetch).")
        return fetch(url)
    head, comma, data = url.partition(",")
    if not (url.startswith("data:") and comma and head.endswith(";base64")):
        raise ImageError(f"{where}: an image URL must be data:image/...;base64,DATA (or http(s) where allowed).")
    if not head[5:].startswith("image/"):
        raise ImageError(f"{where}: a data URL of {head[5:].split(';')[0] or 'no type'} is not an image.")
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ImageError(f"{where}: the image is larger than the {MAX_IMAGE_BYTES >> 20} MiB an image may be.")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{where}: the data URL's base64 is malformed; send the image file's bytes as standard "
                         "base64.") from None


def fetch_url(url: str, limit: int = MAX_IMAGE_BYTES, private: bool = False) -> bytes:
    """An image's bytes from an ``http(s)`` URL on a public address (any address with ``private``), at most
    ``limit`` of them, within ``FETCH_TIMEOUT`` seconds in all (redirects followed only to such URLs).

    Raises:
        ImageError: the URL names a loopback, private or link-local address, cannot be read, answers with an
            error, takes too long, or sends more than ``limit`` bytes.
    """
    deadline = time.monotonic() + FETCH_TIMEOUT
    data = bytearray()
    try:
        if not private:
            _check_public(url)
        redirects = _HttpRedirects if private else _PublicRedirects
        with urllib.request.build_opener(redirects).open(url, timeout=FETCH_STALL) as reply:
            while len(data) <= limit:
                if time.monotonic() > deadline:
                    raise ImageError(f"The image at {url} took more than {FETCH_TIMEOUT:g} s to fetch.")
                chunk = reply.read1(min(1 << 16, limit + 1 - len(data)))  # what has come, at most one wait
                if not chunk:
                    break
                data += chunk
    except (OSError, ValueError) as exc:
        raise ImageError(f"The image at {url} could not be fetched: {exc}.") from None
    if len(data) > limit:
        raise ImageError(f"The image at {url} is larger than the {limit >> 20} MiB an image may be.")
    return bytes(data)


def _check_public(url: str) -> None:
    """Refuse a URL whose host resolves to a loopback, private, link-local or reserved address: a server that
    fetches images must not become a way into the machine's own services or its network's."""
    host = urllib.parse.urlsplit(url).hostname
    if not host:
        raise ImageError(f"The image URL {url} names no host.")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError as exc:
        raise ImageError(f"The image's host {host} could not be resolved: {exc}.") from None
    for address in addresses:
        ip = ipaddress.ip_address(str(address).split("%")[0])
        if not ip.is_global:
            raise ImageError(f"The image URL {url} names {host} ({address}), a loopback, private or link-local "
                             "address, which is not fetched; send the image inline as a data: URL.")


class _HttpRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects to ``http(s)`` URLs only (urllib's own would follow one to ``ftp:``)."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if not newurl.lower().startswith(("http://", "https://")):
            raise ImageError(f"The image at {req.full_url} redirects to {newurl}, which is not an http(s) URL.")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _PublicRedirects(_HttpRedirects):
    """Redirects to ``http(s)`` URLs on public addresses only."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if newurl.lower().startswith(("http://", "https://")):
            _check_public(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)
