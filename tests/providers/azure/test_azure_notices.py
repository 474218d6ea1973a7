"""Scheduled Events inside the VM: a tiny IMDS on 127.0.0.1 answering in its shapes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from orchestrator.errors import TransientError
from providers.azure import AzureScheduledEvents, preemption_notice

VM = "hel-0123456789abcdef0123"


class Imds:
    def __init__(self) -> None:
        self.document: dict[str, Any] = {"DocumentIncarnation": 0, "Events": []}
        self.status = 200
        self.paths: list[str] = []
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                imds.paths.append(self.path)
                if self.headers.get("Metadata") != "true":
                    self._send(400, b'{"error": "Bad request. Required metadata header missing"}')
                elif self.path.startswith("/metadata/instance/compute/name?"):
                    self._send(200, VM.encode())
                elif self.path == "/metadata/scheduledevents?api-version=2020-07-01":
                    self._send(imds.status, json.dumps(imds.document).encode())
                else:
                    self._send(404, b"{}")

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def imds() -> Iterator[Imds]:
    fake = Imds()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def event(kind: str, *resources: str) -> dict[str, Any]:
    return {
        "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": list(resources),
        "EventStatus": "Scheduled",
        "NotBefore": "Wed, 01 May 2024 17:00:30 GMT",
        "Description": "Virtual machine is being evicted",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def test_a_preempt_event_for_this_vm_is_a_notice(imds: Imds) -> None:
    source = AzureScheduledEvents(imds.url)
    assert source.poll() is None
    imds.document["Events"] = [event("Freeze", VM), event("Preempt", "other-vm")]
    assert source.poll() is None  # a freeze, and another VM's eviction, are not ours
    imds.document["Events"].append(event("Preempt", VM.upper()))
    notice = source.poll()
    assert notice is not None and notice.source == "azure"
    assert notice.detail == "Preempt (Scheduled) not before Wed, 01 May 2024 17:00:30 GMT"
    # the VM's name is read once
    assert sum(p.startswith("/metadata/instance/compute/name") for p in imds.paths) == 1


def test_terminate_is_a_notice_too() -> None:
    doc = {"Events": [event("Terminate", VM)]}
    notice = preemption_notice(doc, VM)
    assert notice is not None and notice.detail.startswith("Terminate")


def test_imds_trouble_is_transient(imds: Imds) -> None:
    imds.status = 500
    with pytest.raises(TransientError, match="HTTP 500"):
        AzureScheduledEvents(imds.url).poll()
    with pytest.raises(TransientError, match="unreachable"):
        AzureScheduledEvents("http://127.0.0.1:9", timeout_s=0.5, vm_name=VM).poll()


def test_the_training_sdks_watcher_takes_it_as_a_source(imds: Imds) -> None:
    """What the SDK would run on a Spot VM: NoticeWatcher polling Scheduled Events."""
    import threading as _threading

    from orchestrator.training.notices import NoticeWatcher, PreemptionNotice

    heard: list[PreemptionNotice] = []
    done = _threading.Event()

    def on_notice(notice: PreemptionNotice) -> None:
        heard.append(notice)
        done.set()

    watcher = NoticeWatcher(AzureScheduledEvents(imds.url), on_notice, interval_s=0.01).start()
    try:
        imds.document["Events"] = [event("Preempt", VM)]
        assert done.wait(5.0)
    finally:
        watcher.stop()
    assert [n.source for n in heard] == ["azure"]
