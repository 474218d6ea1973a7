"""A tiny HTTP server on 127.0.0.1 that answers with recorded bodies.

Routes match the request path by regular expression (first match wins). A route answers
with its replies in turn (the last one repeats), or through a function of the request.
Every request is kept in `requests` for assertions (path, query, headers).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

RECORDED = Path(__file__).resolve().parent / "recorded"


def recorded(name: str) -> bytes:
    return (RECORDED / name).read_bytes()


@dataclass
class Reply:
    status: int = 200
    body: bytes | str = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0

    @staticmethod
    def file(name: str, status: int = 200, **headers: str) -> Reply:
        ctype = (
            "application/xml"
            if name.endswith(".xml")
            else ("text/csv" if name.endswith(".csv") else "application/json")
        )
        return Reply(status, recorded(name), {"Content-Type": ctype, **headers})


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]

    def q(self, name: str) -> str:
        return self.query.get(name, [""])[0]


Handler = Callable[[Request], Reply]


@dataclass
class _Route:
    pattern: re.Pattern[str]
    replies: list[Reply] | None
    handler: Handler | None


class FixtureServer:
    def __init__(self) -> None:
        self.routes: list[_Route] = []
        self.requests: list[Request] = []
        server = self

        class _H(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                del format, args

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                req = Request(
                    "GET",
                    parts.path,
                    parse_qs(parts.query, keep_blank_values=True),
                    {k: v for k, v in self.headers.items()},
                )
                server.requests.append(req)
                reply = server._answer(req)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                body = reply.body.encode() if isinstance(reply.body, str) else reply.body
                try:
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _H)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, pattern: str, *replies: Reply, handler: Handler | None = None) -> None:
        self.routes.append(_Route(re.compile(pattern), list(replies) or None, handler))

    def reset(self) -> None:
        self.routes.clear()
        self.requests.clear()

    def hits(self, pattern: str) -> list[Request]:
        rx = re.compile(pattern)
        return [r for r in self.requests if rx.search(r.path)]

    def _answer(self, req: Request) -> Reply:
        for route in self.routes:
            if route.pattern.search(req.path):
                if route.handler is not None:
                    return route.handler(req)
                assert route.replies
                return route.replies.pop(0) if len(route.replies) > 1 else route.replies[0]
        return Reply(
            404,
            b'{"error": "no route in the fixture server"}',
            {"Content-Type": "application/json"},
        )

    def __enter__(self) -> FixtureServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def serve() -> Iterator[FixtureServer]:
    with FixtureServer() as server:
        yield server


def em_zone_handler(name: str) -> Handler:
    """An Electricity Maps route answering the recorded DE body for whichever zone is asked
    (the recording's zone fields rewritten)."""

    def answer(req: Request) -> Reply:
        zone = req.q("zone") or "DE"
        reply = Reply.file(name)
        body = reply.body if isinstance(reply.body, bytes) else reply.body.encode()
        reply.body = body.replace(b'"zone": "DE"', f'"zone": "{zone}"'.encode())
        return reply

    return answer
