"""The HTTP part of the fake cloud APIs (Compute Engine, Resource Manager, Kubernetes): a
JSON server on 127.0.0.1, on a free port, in a daemon thread, that hands every request to
the fake's `answer(method, path, headers, body) -> (status, body, headers)`."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, Any, Mapping[str, str]]


class JsonServer:
    def __init__(
        self,
        answer: Callable[[str, str, dict[str, str], bytes], Answer],
        *,
        content_type: str = "application/json",
    ) -> None:
        self._answer = answer
        self._content_type = content_type
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> JsonServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, body, headers = server._answer(
                    self.command, self.path, dict(self.headers), raw
                )
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", server._content_type)
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_port}"


class ServedFake:
    """`stop` and `url` of a fake cloud API served by a `JsonServer` it keeps in `_http`
    (set by its own `start`, through `serve`)."""

    _http: JsonServer | None

    def serve(
        self, answer: Callable[[str, str, dict[str, str], bytes], Answer], content_type: str
    ) -> None:
        self._http = JsonServer(answer, content_type=content_type).start()

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()

    @property
    def url(self) -> str:
        assert self._http is not None
        return self._http.url
