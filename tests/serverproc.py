"""Start `localspec serve` as a real process on a free loopback port, for the server tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path
from typing import Any, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """`localspec serve ARGS` on 127.0.0.1:PORT; ``url`` is its /v1 base."""

    def __init__(self, args: list[str], home: Path, timeout: float = 120, env: Optional[dict[str, str]] = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/v1"
        env = dict(os.environ, LOCALSPEC_HOME=str(home), **(env or {}))
        self.log = open(home / f"serve-{self.port}.log", "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "localspec", "serve", *args, "--port", str(self.port)],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"localspec serve exited with {self.proc.returncode}: {self.output()}")
            try:
                self.get("/health")
                return
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError(f"localspec serve did not answer within {timeout} s: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=10) as r:
            return json.loads(r.read())

    def post(self, path: str, body: bytes, headers: Optional[dict[str, str]] = None) -> tuple[int, Any, Message]:
        """POST raw bytes; returns (status, the JSON body parsed or a stream's events as text, headers:
        case-insensitive) even for error statuses."""
        req = urllib.request.Request(self.base + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                data = r.read()
                return r.status, data.decode() if r.headers.get_content_type() == "text/event-stream" else \
                    json.loads(data), r.headers
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}"), e.headers

    def raw(self, request: bytes, timeout: float = 30, body_chunks: int = 0, chunk: bytes = b"") -> tuple[int, bytes]:
        """Send raw bytes (then ``body_chunks`` copies of ``chunk``, while the server lets us) over one socket;
        returns (status, response body). The response is read as soon as the server sends it."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(request)
            try:
                for _ in range(body_chunks):
                    s.sendall(chunk)
            except OSError:
                pass  # the server answered and closed without reading the rest
            data = b""
            try:
                while True:
                    got = s.recv(65536)
                    if not got:
                        break
                    data += got
                    head, sep, rest = data.partition(b"\r\n\r\n")
                    length = [ln for ln in head.lower().split(b"\r\n") if ln.startswith(b"content-length:")]
                    if sep and length and len(rest) >= int(length[0].split(b":")[1]):
                        break
            except OSError:
                pass  # reset after the answer
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
        return status, body

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


LLAMA_SERVER_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "localspec" / "llama-server"


def built_binary() -> Optional[Path]:
    """The llama-server to run: ``LOCALSPEC_LLAMA_SERVER``, else the one build_llama_server.sh cached."""
    named = os.environ.get("LOCALSPEC_LLAMA_SERVER")
    if named:
        return Path(named)
    found = sorted(LLAMA_SERVER_CACHE.glob("*/llama-server"))
    return found[0] if found else None
