"""The server's real application in this process, on a pair whose prompts take as long as a test says: a
``SlowPair``'s generations process their prompt until its ``gate`` opens (or they are cancelled)."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import uvicorn
from serverproc import free_port

from localspec.options import GenerationOptions
from localspec.server.app import create_app
from localspec.server.worker import Server


class SlowStream:
    """A generation whose prompt is processed until ``gate`` opens; cancelling it stops that at once."""

    def __init__(self, stream: Any, gate: threading.Event, read: Optional[int] = None):
        self._stream, self._gate, self._read = stream, gate, read
        self._cancelled = threading.Event()
        self._processing = False

    @property
    def prompt_tokens(self) -> int:
        return self._stream.prompt_tokens

    @property
    def cached_prompt_tokens(self) -> Optional[int]:
        return 0 if self._processing else None  # known once the prompt's processing has begun

    @property
    def prompt_read(self) -> Optional[int]:
        """The prompt tokens it says it holds while the gate is shut (the pair's ``read``)."""
        return self._read if self._processing and not self._gate.is_set() else None

    @property
    def result(self) -> Any:
        return self._stream.result

    @property
    def stats(self) -> Any:
        return self._stream.stats

    def cancel(self) -> None:
        self._cancelled.set()
        self._stream.cancel()

    def __iter__(self) -> Iterator[Any]:
        self._processing = True
        while not self._gate.wait(0.01) and not self._cancelled.is_set():
            pass
        yield from self._stream  # a cancelled generation ends at once


class SlowPair:
    """``pair``, its generations' prompts held until ``gate`` opens (open to begin with)."""

    def __init__(self, pair: Any):
        self._pair = pair
        self.gate = threading.Event()
        self.gate.set()
        self.read: Optional[int] = None  # what a held prompt's stream says it has read

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pair, name)

    def stream(self, *args: Any, **kwargs: Any) -> SlowStream:
        return SlowStream(self._pair.stream(*args, **kwargs), self.gate, self.read)

    def stream_chat(self, *args: Any, **kwargs: Any) -> SlowStream:
        return SlowStream(self._pair.stream_chat(*args, **kwargs), self.gate, self.read)

    def stream_infill(self, *args: Any, **kwargs: Any) -> SlowStream:
        return SlowStream(self._pair.stream_infill(*args, **kwargs), self.gate, self.read)


def local_server(pair: Any, name: str = "target") -> Server:
    """A server for ``pair`` that records nothing in the history store."""
    return Server(pair, name, GenerationOptions(method="plain", history=False, max_tokens=64), history=False)


@contextmanager
def serving(server: Server, **app: Any) -> Iterator[int]:
    """``server``'s application (``create_app``'s keywords: ``app``) under uvicorn on a free loopback port
    (yielded), until the block ends."""
    port = free_port()
    runner = uvicorn.Server(uvicorn.Config(create_app(server, **app), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not runner.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        runner.should_exit = True
        thread.join(30)


def post(path: str, body: dict[str, Any], port: int) -> bytes:
    """The bytes of a JSON POST that asks the server to close the connection after its answer."""
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data
