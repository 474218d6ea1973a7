"""A tiny fake of the AWS (IMDSv2) and GCE metadata services on 127.0.0.1, for tests.

It answers only what the notice sources ask, the way the real services do: IMDSv2 wants a
PUT for a token and that token on every GET (401 otherwise); spot/instance-action is 404
until a notice is armed. GCE wants `Metadata-Flavor: Google` (403 otherwise) and answers
FALSE / TRUE on instance/preempted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class MetadataState:
    def __init__(self) -> None:
        self.preempted = False
        self.token = "tok-1"
        self.requests: list[tuple[str, str]] = []


class _Handler(BaseHTTPRequestHandler):
    state: MetadataState

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:
        self.state.requests.append(("PUT", self.path))
        if self.path == "/latest/api/token" and self.headers.get(
            "X-aws-ec2-metadata-token-ttl-seconds"
        ):
            self._send(200, self.state.token.encode())
        else:
            self._send(400)

    def do_GET(self) -> None:
        self.state.requests.append(("GET", self.path))
        if self.path.startswith("/latest/"):
            if self.headers.get("X-aws-ec2-metadata-token") != self.state.token:
                self._send(401)
            elif self.path == "/latest/meta-data/spot/instance-action" and self.state.preempted:
                action = json.dumps({"action": "terminate", "time": "2024-05-01T12:00:00Z"})
                self._send(200, action.encode(), {"Content-Type": "text/plain"})
            else:
                self._send(404)
        elif self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                self._send(403)
            else:
                body = b"TRUE" if self.state.preempted else b"FALSE"
                self._send(200, body, {"Metadata-Flavor": "Google"})
        else:
            self._send(404)


@contextmanager
def metadata_server() -> Iterator[tuple[str, MetadataState]]:
    """Yields (base URL, state); set `state.preempted = True` to arm the notice."""
    state = MetadataState()
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
