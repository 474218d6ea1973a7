"""A stand-in for the UK Carbon Intensity API on 127.0.0.1 (the one keyless source), so the
signals DAG polls something real-shaped without the network."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _t(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%MZ")


def _parse(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%MZ").replace(tzinfo=UTC)


class _UkCarbon(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")  # intensity/FROM/TO | intensity/FROM/fw24h
        if parts[0] == "malformed":  # a base URL ending in /malformed: not JSON
            body = b"<html>not json</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if len(parts) != 3 or parts[0] != "intensity":
            self.send_error(404)
            return
        start = _parse(parts[1])
        start = start.replace(minute=30 * (start.minute // 30))
        forecast = parts[2] == "fw24h"
        end = start + timedelta(hours=24) if forecast else _parse(parts[2])
        data, t = [], start
        while t < end:
            data.append(
                {
                    "from": _t(t),
                    "to": _t(t + timedelta(minutes=30)),
                    "intensity": {
                        "forecast": 180,
                        "actual": None if forecast else 175,
                        "index": "moderate",
                    },
                }
            )
            t += timedelta(minutes=30)
        body = json.dumps({"data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@contextmanager
def uk_carbon_server() -> Iterator[str]:
    """Serve until the block ends; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _UkCarbon)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
