"""A Kubernetes API server on 127.0.0.1 answering in the shapes of the Kubernetes API
(v1 nodes, pods, services, events, `Status` errors; see recorded/README.md).

The real `kubernetes` client talks to it through a kubeconfig the fixture writes (server
URL, bearer token), so the adapter is exercised through the client's configuration loading,
serialization, deserialization into models and ApiException; nothing of ours is mocked.

It keeps just enough state to be honest: a created pod is scheduled at once onto a ready,
schedulable node that satisfies its node affinity and has the GPUs free (phase Running),
or stays Pending with `PodScheduled=False, reason Unschedulable`; names are unique per
namespace (409 AlreadyExists); label and field selectors are applied; a request without the
token is 401; a namespace other than the served one is 404. Helpers play the cluster's part:
evictions, DisruptionTarget conditions, pods that finish.

Every request is recorded with its RBAC (resource, verb, namespaced) in `calls`, and in the
session-wide `ALL_CALLS` the rbac.yaml test reads.
"""

from __future__ import annotations

import copy
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
NOW = "2024-05-01T17:00:00Z"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    resource: str  # "pods", "nodes", ...
    verb: str  # RBAC verb: get, list, create, delete
    namespaced: bool


ALL_CALLS: list[Call] = []


def recorded(file: str, **values: object) -> Any:
    text = (RECORDED / file).read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    return json.loads(text)


_NS = r"^/api/v1/namespaces/(?P<ns>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str, str, bool]] = [
    (m, re.compile(p), r, v, n)
    for m, p, r, v, n in [
        ("GET", r"^/api/v1/nodes$", "nodes", "list", False),
        ("GET", _NS + r"/pods$", "pods", "list", True),
        ("POST", _NS + r"/pods$", "pods", "create", True),
        ("GET", _NS + r"/pods/(?P<name>[^/]+)$", "pods", "get", True),
        ("DELETE", _NS + r"/pods/(?P<name>[^/]+)$", "pods", "delete", True),
        ("POST", _NS + r"/services$", "services", "create", True),
        ("GET", _NS + r"/services/(?P<name>[^/]+)$", "services", "get", True),
        ("DELETE", _NS + r"/services/(?P<name>[^/]+)$", "services", "delete", True),
        ("GET", _NS + r"/events$", "events", "list", True),
        (
            "POST",
            r"^/apis/authorization\.k8s\.io/v1/selfsubjectaccessreviews$",
            "selfsubjectaccessreviews",
            "create",
            False,
        ),
    ]
]


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selectors: `k`, `!k`, `k=v`, `k==v`, `k!=v`, comma-separated."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _expression_matches(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"the fake does not know operator {op}")


def _affinity_matches(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    required = (
        pod["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if not required:
        return True
    return any(  # terms are ORed, expressions ANDed
        all(_expression_matches(e, labels) for e in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    )


def _pod_gpus(pod: dict[str, Any]) -> int:
    return sum(
        int(c.get("resources", {}).get("limits", {}).get(GPU, 0)) for c in pod["spec"]["containers"]
    )


@dataclass
class FakeKube(ServedFake):
    nodes_file: str
    namespace: str = "heliotrope"
    token: str = "fake-kube-token"
    record_globally: bool = True
    calls: list[Call] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    scripted: dict[tuple[str, str], deque[tuple[int, Any]]] = field(default_factory=dict)
    denied: set[tuple[str, str]] = field(default_factory=set)  # (resource, verb) RBAC refuses
    # Per pod create, in order: None lets it through, a recorded file name refuses it
    # (403 quota, ...) with the pod's name filled in.
    failing_creates: deque[str | None] = field(default_factory=deque)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1000))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _http: JsonServer | None = None

    def start(self) -> FakeKube:
        self.nodes = recorded(self.nodes_file)["items"]
        self.serve(lambda *request: (*self.handle(*request), {}), "application/json")
        return self

    # -- the cluster's part ----------------------------------------------------------------
    def script(self, method: str, resource: str, verb: str, *replies: tuple[int, Any]) -> None:
        self.scripted.setdefault((method, f"{resource}/{verb}"), deque()).extend(replies)

    def requests_for(self, resource: str, verb: str) -> list[Call]:
        return [c for c in self.calls if c.resource == resource and c.verb == verb]

    def add_pod(
        self,
        name: str,
        labels: dict[str, str],
        annotations: dict[str, str],
        phase: str = "Running",
        *,
        node: str = "dgx-a100-01",
        gpus: int = 0,
    ) -> None:
        self.pods[name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": annotations,
                "uid": f"uid-{next(self._ids)}",
                "creationTimestamp": NOW,
                "resourceVersion": str(next(self._ids)),
            },
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {"limits": {GPU: str(gpus)}} if gpus else {},
                    }
                ],
                "nodeName": node,
            },
            "status": {"phase": phase},
        }

    def disrupt(
        self,
        name: str,
        reason: str = "EvictionByEvictionAPI",
        message: str = "Eviction API: evicting",
    ) -> None:
        """What the eviction API, the scheduler's preemption or the taint manager does first:
        a DisruptionTarget condition and a deletion timestamp (the kubelet sends SIGTERM)."""
        pod = self.pods[name]
        pod["status"].setdefault("conditions", []).append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": NOW,
            }
        )
        pod["metadata"]["deletionTimestamp"] = NOW
        pod["metadata"]["deletionGracePeriodSeconds"] = pod["spec"].get(
            "terminationGracePeriodSeconds", 30
        )
        self.event(name, "Killing", "Stopping container job", "Normal")

    def kubelet_evict(self, name: str) -> None:
        """Node-pressure eviction: the pod fails with reason Evicted (it stays, Failed)."""
        pod = self.pods[name]
        pod["status"].update(
            phase="Failed", reason="Evicted", message="The node was low on resource: memory."
        )
        self.event(name, "Evicted", "The node was low on resource: memory.", "Warning")

    def remove(self, name: str) -> None:
        self.pods.pop(name)

    def finish(self, name: str, exit_code: int) -> None:
        pod = self.pods[name]
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        pod["status"]["containerStatuses"] = [
            {
                "name": "job",
                "ready": False,
                "restartCount": 0,
                "image": "i",
                "imageID": "i",
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Completed" if exit_code == 0 else "Error",
                        "startedAt": NOW,
                        "finishedAt": NOW,
                    }
                },
            }
        ]

    def event(self, pod: str, reason: str, message: str, kind: str = "Warning") -> None:
        n = next(self._ids)
        self.events.append(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{pod}.17c{n:013x}",
                    "namespace": self.namespace,
                    "uid": f"ev-{n}",
                    "resourceVersion": str(n),
                    "creationTimestamp": NOW,
                },
                "involvedObject": {
                    "kind": "Pod",
                    "namespace": self.namespace,
                    "name": pod,
                    "apiVersion": "v1",
                    "uid": f"uid-{pod}",
                },
                "reason": reason,
                "message": message,
                "type": kind,
                "count": 1,
                "firstTimestamp": NOW,
                "lastTimestamp": NOW,
                "source": {"component": "kubelet"},
                "reportingComponent": "kubelet",
            }
        )

    # -- serving ---------------------------------------------------------------------------
    def handle(
        self, method: str, raw_path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        body = json.loads(raw) if raw else None
        for route in _ROUTES:
            m = route[1].match(parts.path)
            if m and route[0] == method:
                break
        else:
            return 404, recorded("status_404_not_found.json", kind="path", name=parts.path)
        _, _, resource, verb, namespaced = route
        call = Call(method, parts.path, query, body, resource, verb, namespaced)
        args = m.groupdict()
        with self._lock:
            self.calls.append(call)
            if self.record_globally:
                ALL_CALLS.append(call)
            auth = {k.lower(): v for k, v in headers.items()}.get("authorization")
            if auth != f"Bearer {self.token}":
                return 401, recorded("status_401.json")
            if namespaced and args["ns"] != self.namespace:
                return 404, recorded(
                    "status_404_not_found.json", kind="namespaces", name=args["ns"]
                )
            queue = self.scripted.get((method, f"{resource}/{verb}"))
            if queue:
                return queue.popleft()
            store = {"pods": self.pods, "services": self.services}.get(resource)
            if resource == "nodes":
                return 200, self._list("NodeList", self.nodes, query)
            if resource == "events":
                return 200, self._list("EventList", self.events, query)
            if resource == "selfsubjectaccessreviews":
                attrs = body["spec"]["resourceAttributes"]
                allowed = (attrs["resource"], attrs["verb"]) not in self.denied and (
                    attrs.get("namespace") in (None, self.namespace)
                )
                review = copy.deepcopy(body)
                review["metadata"] = {"creationTimestamp": None}
                review["status"] = {"allowed": allowed}
                if allowed:
                    review["status"]["reason"] = (
                        'RBAC: allowed by RoleBinding "heliotrope/heliotrope" of Role '
                        '"heliotrope" to ServiceAccount "heliotrope/heliotrope"'
                    )
                return 201, review
            assert store is not None
            if verb == "list":
                return 200, self._list("PodList", list(store.values()), query)
            if verb == "create":
                return self._create(resource, store, body)
            name = args["name"]
            if name not in store:
                return 404, recorded("status_404_not_found.json", kind=resource, name=name)
            if verb == "get":
                return 200, store[name]
            gone = store.pop(name)
            if resource == "pods":
                grace = query.get("gracePeriodSeconds", [None])[0]
                gone["metadata"]["deletionTimestamp"] = NOW
                gone["metadata"]["deletionGracePeriodSeconds"] = int(grace) if grace else 30
            return 200, gone

    def _list(self, kind: str, items: list[dict[str, Any]], query: dict[str, list[str]]) -> Any:
        selector = query.get("labelSelector", [""])[0]
        fields = query.get("fieldSelector", [""])[0]
        chosen = [
            i for i in items if _selector_matches(selector, i["metadata"].get("labels") or {})
        ]
        if fields:
            key, _, value = fields.partition("=")
            assert key == "involvedObject.kind", f"the fake does not know field {key}"
            chosen = [i for i in chosen if i["involvedObject"]["kind"] == value]
        return {
            "kind": kind,
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(next(self._ids))},
            "items": chosen,
        }

    def _create(self, resource: str, store: dict[str, Any], body: Any) -> tuple[int, Any]:
        name = body["metadata"]["name"]
        refusal = (
            self.failing_creates.popleft() if resource == "pods" and self.failing_creates else None
        )
        if refusal is not None:
            reply = recorded(refusal, name=name)
            return int(reply["code"]), reply
        if name in store:
            return 409, recorded("status_409_already_exists.json", name=name)
        obj = copy.deepcopy(body)
        n = next(self._ids)
        obj["metadata"].update(
            namespace=self.namespace, uid=f"uid-{n}", resourceVersion=str(n), creationTimestamp=NOW
        )
        if resource == "pods":
            self._schedule(obj)
        else:
            obj["spec"]["clusterIP"] = "None"
        store[name] = obj
        return 201, obj

    def _schedule(self, pod: dict[str, Any]) -> None:
        want = _pod_gpus(pod)
        used: dict[str, int] = {}
        for other in self.pods.values():
            node = other["spec"].get("nodeName")
            if node and other["status"].get("phase") in ("Pending", "Running"):
                used[node] = used.get(node, 0) + _pod_gpus(other)
        for node in self.nodes:
            labels = node["metadata"]["labels"]
            name = node["metadata"]["name"]
            ready = any(
                c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]
            )
            free = int(node["status"]["allocatable"].get(GPU, 0)) - used.get(name, 0)
            if (
                ready
                and not node["spec"].get("unschedulable")
                and free >= want
                and _affinity_matches(pod, labels)
            ):
                pod["spec"]["nodeName"] = name
                pod["status"] = {
                    "phase": "Running",
                    "startTime": NOW,
                    "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": NOW}
                    ],
                }
                return
        message = f"0/{len(self.nodes)} nodes are available: {want} Insufficient nvidia.com/gpu."
        pod["status"] = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": NOW,
                }
            ],
        }
        self.event(pod["metadata"]["name"], "FailedScheduling", message)
