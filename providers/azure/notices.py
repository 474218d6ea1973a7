"""Spot eviction notices inside an Azure VM: Scheduled Events from the instance metadata
service (IMDS).

`GET http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01` with header
`Metadata: true` answers

    {"DocumentIncarnation": 3,
     "Events": [{"EventId": "...", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                 "Resources": ["hel-0123abcd"], "EventStatus": "Scheduled",
                 "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "EventSource": "Platform",
                 "DurationInSeconds": -1, "Description": "..."}]}

A Spot eviction is `EventType: Preempt` with at least 30 seconds' notice; `Terminate`
(the VM is being deleted) is a notice too. Events name the VMs they affect (`Resources`),
and a VM sees the events of its availability set or scale set, so only events naming this
VM count: its name comes from `GET /metadata/instance/compute/name?format=text`. The first
request to Scheduled Events turns the feature on for the VM and may take a few seconds.

`AzureScheduledEvents` has the training SDK's `NoticeSource` shape (`name`, `poll()`),
reusing its `PreemptionNotice`; it needs only the standard library, so it can live in the
SDK as it is. Requests never go through an HTTP proxy.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Final

from orchestrator.errors import TransientError
from orchestrator.training.notices import PreemptionNotice

IMDS_URL: Final = "http://169.254.169.254"
SCHEDULED_EVENTS_API: Final = "2020-07-01"
INSTANCE_API: Final = "2021-02-01"
NOTICE_SOURCE: Final = "azure"  # HELIOTROPE_NOTICE_SOURCE the adapter sets on spot VMs
NOTICE_EVENT_TYPES: Final = frozenset({"Preempt", "Terminate"})

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def preemption_notice(document: Mapping[str, Any], vm_name: str) -> PreemptionNotice | None:
    """The notice in a Scheduled Events document for the VM `vm_name`, or None.

    >>> doc = {"Events": [{"EventType": "Preempt", "Resources": ["vm-1"],
    ...                    "EventStatus": "Scheduled", "NotBefore": "soon"}]}
    >>> preemption_notice(doc, "vm-1").detail, preemption_notice(doc, "vm-2")
    ('Preempt (Scheduled) not before soon', None)
    """
    for event in document.get("Events") or []:
        if not isinstance(event, Mapping):
            continue
        kind = str(event.get("EventType", ""))
        resources = [str(r).lower() for r in event.get("Resources") or []]
        if kind not in NOTICE_EVENT_TYPES or vm_name.lower() not in resources:
            continue
        status = event.get("EventStatus", "?")
        detail = f"{kind} ({status}) not before {event.get('NotBefore') or 'now'}"
        return PreemptionNotice(NOTICE_SOURCE, detail)
    return None


class AzureScheduledEvents:
    """Polls Scheduled Events for this VM (the VM's name is read once and kept)."""

    name = NOTICE_SOURCE

    def __init__(
        self, base_url: str = IMDS_URL, *, timeout_s: float = 2.0, vm_name: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._vm_name = vm_name

    def _get(self, path: str) -> tuple[int, bytes]:
        req = urllib.request.Request(
            f"{self.base_url}{path}", method="GET", headers={"Metadata": "true"}
        )
        try:
            with _NO_PROXY.open(req, timeout=self.timeout_s) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            raise TransientError(
                f"Azure IMDS {self.base_url} unreachable: {exc}", retry_after_s=1.0
            ) from exc

    def vm_name(self) -> str:
        if self._vm_name is None:
            status, body = self._get(
                f"/metadata/instance/compute/name?api-version={INSTANCE_API}&format=text"
            )
            if status != 200 or not body.strip():
                raise TransientError(
                    f"Azure IMDS compute/name answered HTTP {status}", retry_after_s=1.0
                )
            self._vm_name = body.decode(errors="replace").strip()
        return self._vm_name

    def poll(self) -> PreemptionNotice | None:
        name = self.vm_name()
        status, body = self._get(f"/metadata/scheduledevents?api-version={SCHEDULED_EVENTS_API}")
        if status != 200:
            raise TransientError(
                f"Azure IMDS scheduledevents answered HTTP {status}", retry_after_s=1.0
            )
        try:
            document = json.loads(body)
        except ValueError as exc:
            raise TransientError("Azure IMDS scheduledevents: not JSON", retry_after_s=1.0) from exc
        if not isinstance(document, Mapping):
            raise TransientError("Azure IMDS scheduledevents: not an object", retry_after_s=1.0)
        return preemption_notice(document, name)
