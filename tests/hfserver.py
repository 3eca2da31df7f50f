"""A tiny stand-in for the Hugging Face Hub on 127.0.0.1, for download tests.

Serves ``/{repo}/resolve/{revision}/{file}`` with the headers huggingface_hub
reads (X-Repo-Commit, ETag, Content-Length), honours Range requests
(``bytes=a-b`` and ``bytes=a-``, answered with Content-Range), lists models
(``/api/models?search=&author=``) and a repository's files
(``/api/models/{repo}/tree/{revision}``), and can answer with the Hub's error
codes. It records every request it sees, and the body bytes it sent.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import parse_qs, urlparse

COMMIT = "a" * 40


class FakeHub:
    def __init__(self) -> None:
        self.files: dict[tuple[str, str], bytes] = {}
        self.errors: dict[str, tuple[int, str]] = {}  # repo -> (status, X-Error-Code)
        self.requests: list[tuple[str, str, Optional[str]]] = []  # (method, path, Range header)
        #: Close the connection after this many body bytes on the first full GET (a dropped download).
        self.drop_after: Optional[int] = None
        #: Body bytes sent for file contents, per (repo, file).
        self.sent: dict[tuple[str, str], int] = {}
        #: A misbehaving server: answer a range from its start to the end of the file ("tail"), or
        #: from one byte further on ("shift"), whatever was asked.
        self.bad_ranges: Optional[str] = None
        #: Answer file GETs with a redirect to another host name ("localhost"), as the Hub's CDN does.
        self.redirect = False
        self.redirect_auth: list[Optional[str]] = []  # the Authorization header each redirected request had
        self.cdn_auth: list[Optional[str]] = []  # and each request the CDN got
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

            def _api(self) -> bool:
                """Answer the listing endpoints; False for any other path."""
                url = urlparse(self.path)
                if url.path == "/api/models":
                    hub.requests.append((self.command, self.path, None))
                    q = {k: v[0] for k, v in parse_qs(url.query).items()}
                    repos = sorted({r for r, _ in hub.files})
                    found = [{"id": r, "modelId": r} for r in repos
                             if q.get("search", "").lower() in r.lower()
                             and (not q.get("author") or r.split("/")[0] == q["author"])]
                    self._json(found)
                    return True
                if url.path.startswith("/api/models/") and "/tree/" in url.path:
                    hub.requests.append((self.command, self.path, None))
                    repo = url.path[len("/api/models/"):].split("/tree/")[0]
                    self._json([{"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                                for (r, f), d in sorted(hub.files.items()) if r == repo])
                    return True
                return False

            def _json(self, value: object) -> None:
                body = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                if self._api():
                    return
                if hub.redirect and self.path.startswith("/cdn/"):
                    hub.cdn_auth.append(self.headers.get("Authorization"))
                    self.path = "/" + self.path[len("/cdn/"):]  # what the redirect pointed at
                elif hub.redirect and "/resolve/" in self.path:
                    hub.requests.append((self.command, self.path, self.headers.get("Range")))
                    hub.redirect_auth.append(self.headers.get("Authorization"))
                    self.send_response(302)  # as the Hub sends LFS files to its CDN
                    self.send_header("Location", f"http://localhost:{self.server.server_port}/cdn{self.path}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = self._lookup()
                if data is None:
                    return
                rng = self.headers.get("Range")
                start, end = 0, len(data) - 1
                if rng:
                    first, _, last = rng.split("=")[1].partition("-")
                    start, end = int(first), min(int(last), len(data) - 1) if last else len(data) - 1
                    if hub.bad_ranges == "tail":
                        end = len(data) - 1
                    elif hub.bad_ranges == "shift":
                        start += 1
                key = tuple(self.path.split("?")[0].lstrip("/").split("/resolve/", 1))
                repo_file = (key[0], key[1].partition("/")[2])
                hub.sent[repo_file] = hub.sent.get(repo_file, 0) + end + 1 - start
                if rng:
                    self.send_response(206)
                    self.send_header("X-Repo-Commit", COMMIT)
                    self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                    self.send_header("Content-Length", str(end + 1 - start))
                    self.end_headers()
                    self.wfile.write(data[start : end + 1])
                    return
                self._headers(data, 200, len(data))
                if hub.drop_after is not None and not rng:
                    cut, hub.drop_after = hub.drop_after, None
                    self.wfile.write(data[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the client sees a truncated body
                    return
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client that stops reading early (a header check) is expected, not news

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
