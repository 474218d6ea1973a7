"""A Compute Engine (and Cloud Billing Catalog) endpoint on 127.0.0.1 that answers from the
recorded responses in `recorded/`.

The real client library talks to it over HTTP (`client_options={"api_endpoint": url}`,
anonymous credentials), so the adapter is exercised through google-cloud-compute's REST
transport, request serialization and error parsing; nothing of ours is mocked. The fake
keeps just enough state to be honest: inserted instances can be got, listed and deleted,
a repeated insert `requestId` returns the first operation, list filters are applied (or
ignored, `honour_filters=False`, to show the adapter checks ownership itself).

Every request is recorded (`calls`, and the session-wide `ALL_CALLS` the role test reads)
with the API method it invokes, e.g. "compute.instances.insert".
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.providers.fake_http import JsonServer, ServedFake

RECORDED = Path(__file__).parent / "recorded"
API_ROOT = "https://www.googleapis.com/compute/v1"
CREATED_AT = "2024-05-01T10:00:00.000-07:00"  # creationTimestamp of inserted instances


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    api: str  # the API method, "compute.instances.insert"


ALL_CALLS: list[Call] = []  # every call of every fake in this test session


def recorded(name: str, **values: object) -> Any:
    """A recorded response with its `{{placeholders}}` filled in."""
    text = (RECORDED / name).read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    return json.loads(text)


def serial_body(project: str, zone: str, name: str, text: str | None = None) -> dict[str, Any]:
    """A `SerialPortOutput` response: the recorded boot, or `text` as its contents."""
    body: dict[str, Any] = recorded(
        "serial_port_output.json", project=project, zone=zone, instance=name, next=0
    )
    if text is not None:
        body["contents"] = text
    body["next"] = str(len(body["contents"].encode()))
    return body


_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(p), api)
    for m, p, api in [
        (
            "POST",
            r"^/compute/v1/projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/instances$",
            "compute.instances.insert",
        ),
        (
            "GET",
            r"^/compute/v1/projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/instances$",
            "compute.instances.list",
        ),
        (
            "GET",
            r"^/compute/v1/projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/instances/(?P<n>[^/]+)$",
            "compute.instances.get",
        ),
        (
            "DELETE",
            r"^/compute/v1/projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/instances/(?P<n>[^/]+)$",
            "compute.instances.delete",
        ),
        (
            "GET",
            r"^/compute/v1/projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/instances/(?P<n>[^/]+)"
            r"/serialPort$",
            "compute.instances.getSerialPortOutput",
        ),
        (
            "GET",
            r"^/compute/v1/projects/(?P<p>[^/]+)/aggregated/instances$",
            "compute.instances.aggregatedList",
        ),
        (
            "POST",
            r"^/compute/v1/projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/operations/(?P<o>[^/]+)/wait$",
            "compute.zoneOperations.wait",
        ),
        (
            "GET",
            r"^/compute/v1/projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/operations/(?P<o>[^/]+)$",
            "compute.zoneOperations.get",
        ),
        (
            "GET",
            r"^/compute/v1/projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/operations$",
            "compute.zoneOperations.list",
        ),
        (
            "GET",
            r"^/compute/v1/projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/machineTypes$",
            "compute.machineTypes.list",
        ),
        ("GET", r"^/v1/services/(?P<s>[^/]+)/skus$", "cloudbilling.services.skus.list"),
    ]
]


def _route(method: str, path: str) -> tuple[re.Match[str], str] | None:
    for route_method, pattern, api in _ROUTES:
        m = pattern.match(path)
        if m and route_method == method:
            return m, api
    return None


_LABEL_FILTER = re.compile(r'^labels\.([\w-]+) = "([^"]*)"$')
_NAME_EQ_FILTER = re.compile(r'^name eq "(.+)"$')
_OPERATION_TYPE_FILTER = re.compile(r'^operationType = "([^"]+)"$')


@dataclass
class FakeCompute(ServedFake):
    project: str
    cluster_label: str = ""
    honour_filters: bool = True
    billing_key: str = "test-billing-key"
    billing_forbidden: bool = False
    record_globally: bool = True  # add calls to ALL_CALLS (what role.yaml must grant)
    calls: list[Call] = field(default_factory=list)
    # serial port 1 of an instance (`heliotrope logs`): the text a test set, else recorded
    serial: dict[tuple[str, str], str] = field(default_factory=dict)
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Replies served before the default behaviour, per API method: (status, body) pairs.
    scripted: dict[str, deque[tuple[int, Any]]] = field(default_factory=dict)
    # How the next inserts finish: a recorded operation file (an error; no instance is made)
    # or None (success).
    failing_inserts: deque[str | None] = field(default_factory=deque)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(5_000_000_000_000_000))
    _by_request_id: dict[str, dict[str, Any]] = field(default_factory=dict)
    _system_ops: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _http: JsonServer | None = None

    # -- life ----------------------------------------------------------------------------
    def start(self) -> FakeCompute:
        self.serve(lambda *request: (*self.handle(*request), {}), "application/json; charset=UTF-8")
        return self

    # -- set-up helpers --------------------------------------------------------------------
    def script(self, api: str, *replies: tuple[int, Any]) -> None:
        self.scripted.setdefault(api, deque()).extend(replies)

    def add_instance(self, zone: str, fixture: str, name: str, **values: object) -> dict[str, Any]:
        body = recorded(
            fixture,
            project=self.project,
            zone=zone,
            instance=name,
            target_id=next(self._ids),
            cluster_label=self.cluster_label,
            **values,
        )
        self.instances[(zone, name)] = body
        return body

    def preempt(
        self,
        zone: str,
        name: str,
        *,
        time: str = "2024-05-01T11:30:00.000-07:00",
        delete: bool = True,
    ) -> None:
        """Compute Engine preempts a spot VM: a system operation, then (DELETE action) the
        instance is gone."""
        op_id = next(self._ids)
        self._system_ops.append(
            recorded(
                "operation_preempted.json",
                project=self.project,
                zone=zone,
                instance=name,
                operation=f"systemevent-1714584600000-{op_id:x}",
                operation_id=op_id,
                target_id=next(self._ids),
                time=time,
            )
        )
        if delete:
            self.instances.pop((zone, name), None)
        else:
            self.instances[(zone, name)]["status"] = "STOPPING"

    def requests_for(self, api: str) -> list[Call]:
        return [c for c in self.calls if c.api == api]

    # -- serving ---------------------------------------------------------------------------
    def handle(
        self, method: str, raw_path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        body = json.loads(raw) if raw else None
        routed = _route(method, parts.path)
        if routed is None:
            return 404, {"error": {"code": 404, "message": f"no route {method} {parts.path}"}}
        m, api = routed
        call = Call(method, parts.path, query, headers, body, api)
        with self._lock:
            self.calls.append(call)
            if self.record_globally:
                ALL_CALLS.append(call)
            queue = self.scripted.get(api)
            if queue:
                return queue.popleft()
            handler = {
                "compute.instances.insert": self._insert,
                "compute.instances.list": self._list_instances,
                "compute.instances.get": self._get_instance,
                "compute.instances.getSerialPortOutput": self._serial_port,
                "compute.instances.delete": self._delete,
                "compute.instances.aggregatedList": self._aggregated,
                "compute.zoneOperations.wait": self._get_operation,
                "compute.zoneOperations.get": self._get_operation,
                "compute.zoneOperations.list": self._list_operations,
                "compute.machineTypes.list": self._list_machine_types,
                "cloudbilling.services.skus.list": self._skus,
            }[api]
            return handler(m.groupdict(), query, body, headers)

    def _filter(
        self, query: dict[str, list[str]], pattern: re.Pattern[str]
    ) -> re.Match[str] | None:
        text = query.get("filter", [""])[0]
        if not self.honour_filters or not text:
            return None
        m = pattern.match(text)
        assert m is not None, f"the fake does not understand the filter {text!r}"
        return m

    def _not_found(self, zone: str, name: str) -> tuple[int, Any]:
        return 404, recorded(
            "error_404_not_found.json", project=self.project, zone=zone, instance=name
        )

    def _operation(self, fixture: str, zone: str, name: str, **values: object) -> dict[str, Any]:
        op_id = next(self._ids)
        op = recorded(
            fixture,
            project=self.project,
            zone=zone,
            instance=name,
            operation=f"operation-{op_id}",
            operation_id=op_id,
            target_id=next(self._ids),
            time=CREATED_AT,
            **values,
        )
        return op

    def _insert(
        self, args: dict[str, str], query: dict[str, list[str]], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        zone, name = args["z"], body["name"]
        request_id = query.get("requestId", [""])[0]
        if request_id in self._by_request_id:  # Compute Engine: same requestId, same operation
            return 200, self._by_request_id[request_id]["running"]
        if (zone, name) in self.instances:
            return 409, recorded(
                "error_409_already_exists.json", project=self.project, zone=zone, instance=name
            )
        running = self._operation("operation_insert_running.json", zone, name)
        final_fixture = self.failing_inserts.popleft() if self.failing_inserts else None
        if final_fixture is None:
            final = dict(running, status="DONE", progress=100, endTime=CREATED_AT)
            self.instances[(zone, name)] = self._instance_from(zone, body, running["targetId"])
        else:
            final = recorded(
                final_fixture,
                project=self.project,
                zone=zone,
                instance=name,
                operation=running["name"],
                operation_id=running["id"],
                target_id=running["targetId"],
                time=CREATED_AT,
            )
        self.operations[(zone, running["name"])] = final
        if request_id:
            self._by_request_id[request_id] = {"running": running}
        return 200, running

    def _instance_from(self, zone: str, body: dict[str, Any], target_id: str) -> dict[str, Any]:
        instance = json.loads(json.dumps(body))
        base = f"{API_ROOT}/projects/{self.project}"
        instance.update(
            kind="compute#instance",
            id=target_id,
            creationTimestamp=CREATED_AT,
            status="RUNNING",
            zone=f"{base}/zones/{zone}",
            machineType=f"{base}/{body['machineType']}",
            selfLink=f"{base}/zones/{zone}/instances/{body['name']}",
            labelFingerprint="2Qvt3o8ksGk=",
        )
        instance["metadata"]["fingerprint"] = "sl9K6ZrYyC0="
        instance["metadata"]["kind"] = "compute#metadata"
        return instance

    def _get_instance(
        self, args: dict[str, str], query: dict[str, list[str]], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        instance = self.instances.get((args["z"], args["n"]))
        return (200, instance) if instance else self._not_found(args["z"], args["n"])

    def _serial_port(
        self, args: dict[str, str], query: dict[str, list[str]], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        zone, name = args["z"], args["n"]
        if (zone, name) not in self.instances:
            return self._not_found(zone, name)
        return 200, serial_body(self.project, zone, name, self.serial.get((zone, name)))

    def _get_operation(
        self, args: dict[str, str], query: dict[str, list[str]], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        op = self.operations.get((args["z"], args["o"]))
        return (200, op) if op else self._not_found(args["z"], args["o"])

    def _delete(
        self, args: dict[str, str], query: dict[str, list[str]], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        zone, name = args["z"], args["n"]
        if self.instances.pop((zone, name), None) is None:
            return self._not_found(zone, name)
        op = self._operation("operation_delete_done.json", zone, name)
        self.operations[(zone, op["name"])] = op
        return 200, op

    def _matches_labels(self, instance: dict[str, Any], query: dict[str, list[str]]) -> bool:
        m = self._filter(query, _LABEL_FILTER)
        return m is None or instance.get("labels", {}).get(m.group(1)) == m.group(2)

    def _aggregated(
        self, args: dict[str, str], query: dict[str, list[str]], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        items: dict[str, Any] = {}
        for (zone, _), instance in sorted(self.instances.items()):
            if self._matches_labels(instance, query):
                items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(instance)
        items.setdefault(
            "zones/asia-east1-a",
            {
                "warning": {
                    "code": "NO_RESULTS_ON_PAGE",
                    "message": "There are no results for scope 'zones/asia-east1-a' on this page.",
                    "data": [{"key": "scope", "value": "zones/asia-east1-a"}],
                }
            },
        )
        return 200, {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{self.project}/aggregated/instances",
            "items": items,
            "selfLink": f"{API_ROOT}/projects/{self.project}/aggregated/instances",
        }

    def _list_machine_types(
        self, args: dict[str, str], query: dict[str, list[str]], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        listing = recorded(f"machine_types_{args['z']}.json", project=self.project)
        m = self._filter(query, _NAME_EQ_FILTER)
        if m is not None:
            listing["items"] = [i for i in listing["items"] if re.fullmatch(m.group(1), i["name"])]
        return 200, listing

    def _list_operations(
        self, args: dict[str, str], query: dict[str, list[str]], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        zone = args["z"]
        m = self._filter(query, _OPERATION_TYPE_FILTER)
        ops = [op for op in self._system_ops if op["zone"].endswith(f"/zones/{zone}")]
        ops += [op for (z, _), op in self.operations.items() if z == zone]
        if m is not None:
            ops = [op for op in ops if op["operationType"] == m.group(1)]
        base = f"{API_ROOT}/projects/{self.project}/zones/{zone}"
        return 200, {
            "kind": "compute#operationList",
            "id": f"projects/{self.project}/zones/{zone}/operations",
            "items": ops,
            "selfLink": f"{base}/operations",
        }

    def _list_instances(
        self, args: dict[str, str], query: dict[str, list[str]], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        zone = args["z"]
        instances = [
            i
            for (z, _), i in sorted(self.instances.items())
            if z == zone and self._matches_labels(i, query)
        ]
        return 200, {
            "kind": "compute#instanceList",
            "items": instances,
            "selfLink": f"{API_ROOT}/projects/{self.project}/zones/{zone}/instances",
        }

    def _skus(
        self, args: dict[str, str], query: dict[str, list[str]], body: Any, headers: dict[str, str]
    ) -> tuple[int, Any]:
        key = {k.lower(): v for k, v in headers.items()}.get("x-goog-api-key")
        if self.billing_forbidden or key != self.billing_key:
            return 403, recorded("billing_403.json")
        token = query.get("pageToken", [""])[0]
        return 200, recorded(
            "billing_skus_page2.json" if token == "page-2" else "billing_skus_page1.json"
        )
