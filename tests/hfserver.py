"""A tiny stand-in for the Hugging Face Hub on 127.0.0.1, for download tests.

Serves ``/{repo}/resolve/{revision}/{file}`` with the headers huggingface_hub
reads (X-Repo-Commit, ETag, Content-Length), honours Range requests, and can
answer with the Hub's error codes. It records every request it sees.
"""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

COMMIT = "a" * 40


class FakeHub:
    def __init__(self) -> None:
        self.files: dict[tuple[str, str], bytes] = {}
        self.errors: dict[str, tuple[int, str]] = {}  # repo -> (status, X-Error-Code)
        self.requests: list[tuple[str, str, Optional[str]]] = []  # (method, path, Range header)
        #: Close the connection after this many body bytes on the first full GET (a dropped download).
        self.drop_after: Optional[int] = None
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _lookup(self) -> Optional[bytes]:
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                path = self.path.split("?")[0].lstrip("/")
                if "/resolve/" not in path:
                    self._fail(404, "RepoNotFound")
                    return None
                repo, rest = path.split("/resolve/", 1)
                _, _, filename = rest.partition("/")
                if repo in hub.errors:
                    self._fail(*hub.errors[repo])
                    return None
                if not any(r == repo for r, _ in hub.files):
                    self._fail(404, "RepoNotFound")
                    return None
                data = hub.files.get((repo, filename))
                if data is None:
                    self._fail(404, "EntryNotFound")
                return data

            def _fail(self, status: int, code: str) -> None:
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _headers(self, data: bytes, status: int = 200, length: Optional[int] = None) -> None:
                self.send_response(status)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data) if length is None else length))
                self.end_headers()

            def do_HEAD(self) -> None:  # noqa: N802
                data = self._lookup()
                if data is not None:
                    self._headers(data)

            def do_GET(self) -> None:  # noqa: N802
                data = self._lookup()
                if data is None:
                    return
                rng = self.headers.get("Range")
                start = int(rng.split("=")[1].split("-")[0]) if rng else 0
                self._headers(data, 206 if rng else 200, len(data) - start)
                if hub.drop_after is not None and not rng:
                    cut, hub.drop_after = hub.drop_after, None
                    self.wfile.write(data[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the client sees a truncated body
                    return
                self.wfile.write(data[start:])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
