"""Azure Resource Manager (Compute) and the Retail Prices API on 127.0.0.1, answering in the
shapes of the Azure REST reference (see recorded/README.md).

The real SDK talks to it: `ComputeManagementClient` keeps its default base URL
(https://management.azure.com, so azure-core's bearer-token policy and ARM polling run as in
production) and the `transport` the fixture passes, a real azure-core `RequestsTransport`,
sends each request to this server instead of to Azure. Nothing of ours is mocked.

The fake keeps just enough state to be honest: a PUT creates a VM (`Creating`) and a Compute
async operation whose status finishes it (`Succeeded`, or `Failed` with a recorded error and
the VM left in `Failed`, as ARM does); `If-None-Match: *` on an existing VM is 412; a DELETE
is an operation that removes the VM; a DELETE of a missing VM is 204. Every request needs
`Authorization: Bearer <token>`. Every request is recorded with the RBAC action it needs
(`calls`, and the session-wide `ALL_CALLS` the role test reads).
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
from urllib.parse import parse_qs, quote, urlsplit

from azure.core.pipeline.transport import RequestsTransport

from tests.providers.fake_http import JsonServer, ServedFake

RECORDED = Path(__file__).parent / "recorded"
ARM = "https://management.azure.com"
TOKEN = "fake-arm-token"
CREATED_AT = "2024-05-01T17:00:00.0000000+00:00"
PAGE_SIZE = 2  # VMs per list page and prices per Retail Prices page, to exercise paging


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    action: str  # the RBAC action ARM checks, "Microsoft.Compute/virtualMachines/write"


ALL_CALLS: list[Call] = []


def recorded(file: str, **values: object) -> Any:
    text = (RECORDED / file).read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    return json.loads(text)


_VM = (
    r"^/subscriptions/(?P<s>[^/]+)/resourceGroups/(?P<rg>[^/]+)"
    r"/providers/Microsoft\.Compute/virtualMachines"
)
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(p, re.IGNORECASE), a)
    for m, p, a in [
        ("PUT", _VM + r"/(?P<n>[^/]+)$", "Microsoft.Compute/virtualMachines/write"),
        ("GET", _VM + r"/(?P<n>[^/]+)$", "Microsoft.Compute/virtualMachines/read"),
        ("DELETE", _VM + r"/(?P<n>[^/]+)$", "Microsoft.Compute/virtualMachines/delete"),
        ("GET", _VM + r"$", "Microsoft.Compute/virtualMachines/read"),
        (
            "GET",
            r"^/subscriptions/(?P<s>[^/]+)/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)"
            r"/operations/(?P<op>[^/]+)$",
            "Microsoft.Compute/locations/operations/read",
        ),
        (
            "GET",
            r"^/subscriptions/(?P<s>[^/]+)/providers/Microsoft\.Compute/skus$",
            "Microsoft.Compute/skus/read",
        ),
        (
            "GET",
            r"^/subscriptions/(?P<s>[^/]+)(?:/resourceGroups/(?P<rg>[^/]+))?"
            r"/providers/Microsoft\.Authorization/permissions$",
            "self-permissions",  # the caller's own permissions: no RBAC action
        ),
        ("GET", r"^/api/retail/prices$", "retail-prices"),  # public, no RBAC
    ]
]


class RedirectingTransport(RequestsTransport):
    """azure-core's requests transport, sending what was addressed to ARM to the fake."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._target = target

    def send(self, request: Any, **kwargs: Any) -> Any:
        if not request.url.startswith(ARM):
            return super().send(request, **kwargs)
        redirected = copy.copy(request)
        redirected.url = self._target + request.url[len(ARM) :]
        response = super().send(redirected, **kwargs)
        response.request = request  # the SDK sees the ARM URL it asked for (polling uses it)
        return response


class FakeCredential:
    """A TokenCredential (azure-core's protocol) that hands out a fixed test token."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        self.scopes.append(scopes)
        return AccessToken(TOKEN, 4_102_444_800)  # 2100-01-01


@dataclass
class FakeArm(ServedFake):
    subscription: str
    resource_group: str
    record_globally: bool = True
    calls: list[Call] = field(default_factory=list)
    vms: dict[str, dict[str, Any]] = field(default_factory=dict)  # lower-case name -> VM
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Replies served before the default behaviour, per (method, action): (status, body).
    scripted: dict[tuple[str, str], deque[tuple[int, Any]]] = field(default_factory=dict)
    # How the next creates end: a recorded error file (the operation fails) or None.
    failing_creates: deque[str | None] = field(default_factory=deque)
    next_page_host: str | None = None  # Retail Prices NextPageLink on another host
    # The caller's effective permissions ("Permissions - List"), per scope: like a custom
    # role with wildcards in the resource group, and the built-in Reader at the subscription.
    group_permissions: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {
                "actions": [
                    "Microsoft.Compute/virtualMachines/*",
                    "Microsoft.Compute/disks/*",
                    "Microsoft.Network/networkInterfaces/*",
                    "Microsoft.Network/virtualNetworks/subnets/join/action",
                ],
                "notActions": [],
                "dataActions": [],
                "notDataActions": [],
            }
        ]
    )
    subscription_permissions: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {"actions": ["*/read"], "notActions": [], "dataActions": [], "notDataActions": []}
        ]
    )
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _http: JsonServer | None = None

    # -- life ----------------------------------------------------------------------------
    def start(self) -> FakeArm:
        self.serve(self._answer, "application/json; charset=utf-8")
        return self

    def _answer(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        status, body, extra = self.handle(method, path, headers, raw)
        return status, body, {"x-ms-request-id": f"req-{next(self._ids)}", **extra}

    def transport(self) -> RedirectingTransport:
        return RedirectingTransport(self.url)

    # -- set-up helpers --------------------------------------------------------------------
    def script(self, method: str, action: str, *replies: tuple[int, Any]) -> None:
        self.scripted.setdefault((method, action), deque()).extend(replies)

    def add_vm(
        self,
        name: str,
        *,
        location: str = "eastus",
        tags: dict[str, str] | None = None,
        priority: str = "Spot",
    ) -> dict[str, Any]:
        vm = recorded(
            "vm_foreign.json",
            name=name,
            subscription=self.subscription,
            resource_group=self.resource_group,
            location=location,
            tags=json.dumps(tags or {}),
            priority=priority,
        )
        self.vms[name.lower()] = vm
        return vm

    def evict(self, name: str) -> None:
        """Azure evicts a Spot VM with eviction policy Delete: the VM is gone."""
        self.vms.pop(name.lower())

    def set_state(self, name: str, state: str) -> None:
        self.vms[name.lower()]["properties"]["provisioningState"] = state

    def requests_for(self, method: str, action: str) -> list[Call]:
        return [c for c in self.calls if c.method == method and c.action == action]

    # -- serving ---------------------------------------------------------------------------
    def handle(
        self, method: str, raw_path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        body = json.loads(raw) if raw else None
        found = None
        for route_method, pattern, action in _ROUTES:
            m = pattern.match(parts.path)
            if m and route_method == method:
                found = (m, action)
                break
        if found is None:
            return (
                404,
                {
                    "error": {
                        "code": "NoRegisteredProviderFound",
                        "message": f"no route {method} {parts.path}",
                    }
                },
                {},
            )
        m, action = found
        lowered = {k.lower(): v for k, v in headers.items()}
        call = Call(method, parts.path, query, headers, body, action)
        with self._lock:
            self.calls.append(call)
            if self.record_globally:
                ALL_CALLS.append(call)
            if action != "retail-prices":
                if lowered.get("authorization") != f"Bearer {TOKEN}":
                    return (
                        401,
                        {
                            "error": {
                                "code": "AuthenticationFailed",
                                "message": "Authentication failed.",
                            }
                        },
                        {},
                    )
                if "api-version" not in query:
                    message = "The api-version query parameter is required."
                    return (
                        400,
                        {"error": {"code": "MissingApiVersionParameter", "message": message}},
                        {},
                    )
            queue = self.scripted.get((method, action))
            if queue:
                status, reply = queue.popleft()
                extra = {"Retry-After": "7"} if status == 429 else {}
                return status, reply, extra
            args = m.groupdict()
            if action == "Microsoft.Compute/virtualMachines/write":
                return self._put_vm(args["n"], body, lowered)
            if action == "Microsoft.Compute/virtualMachines/delete":
                return self._delete_vm(args["n"])
            if action == "Microsoft.Compute/virtualMachines/read":
                return self._get_vm(args["n"]) if args.get("n") else self._list_vms(query)
            if action == "Microsoft.Compute/locations/operations/read":
                return self._operation(args["op"])
            if action == "Microsoft.Compute/skus/read":
                return self._skus(query)
            if action == "self-permissions":
                entries = (
                    self.group_permissions if args.get("rg") else self.subscription_permissions
                )
                return 200, {"value": entries}, {}
            return self._prices(query)

    def _vm_id(self, name: str) -> str:
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}"
            f"/providers/Microsoft.Compute/virtualMachines/{name}"
        )

    def _start_operation(
        self, location: str, kind: str, name: str, error: Any = None
    ) -> dict[str, str]:
        op_id = f"{next(self._ids):08d}-1b2c-4d5e-8f90-a1b2c3d4e5f6"
        self.operations[op_id] = {
            "kind": kind,
            "vm": name.lower(),
            "error": error,
            "location": location,
        }
        url = (
            f"{ARM}/subscriptions/{self.subscription}/providers/Microsoft.Compute/locations/"
            f"{location}/operations/{op_id}?p=571046f6-b640-41c1-86f7-f9f044b5adf9"
            f"&api-version=2026-04-01"
        )
        return {"Azure-AsyncOperation": url, "Retry-After": "0"}

    def _put_vm(
        self, name: str, body: Any, headers: dict[str, str]
    ) -> tuple[int, Any, dict[str, str]]:
        key = name.lower()
        if headers.get("if-none-match") == "*" and key in self.vms:
            return 412, recorded("error_precondition_failed.json"), {}
        if key in self.vms:
            return (
                409,
                {
                    "error": {
                        "code": "OperationNotAllowed",
                        "message": "the fake supports creates only",
                    }
                },
                {},
            )
        vm = json.loads(json.dumps(body))
        vm.update(name=name, id=self._vm_id(name), type="Microsoft.Compute/virtualMachines")
        props = vm.setdefault("properties", {})
        props.update(
            provisioningState="Creating",
            timeCreated=CREATED_AT,
            vmId=f"6b1d2b4e-{next(self._ids):04d}-4c2a-9c1e-3f5a7b9d0e12",
        )
        props.get("osProfile", {}).pop("customData", None)  # write-only: never returned
        self.vms[key] = vm
        error_file = self.failing_creates.popleft() if self.failing_creates else None
        error = recorded(error_file) if error_file else None
        return 201, vm, self._start_operation(vm["location"], "create", name, error)

    def _delete_vm(self, name: str) -> tuple[int, Any, dict[str, str]]:
        vm = self.vms.get(name.lower())
        if vm is None:
            return 204, None, {}
        vm["properties"]["provisioningState"] = "Deleting"
        return 202, None, self._start_operation(vm["location"], "delete", name)

    def _operation(self, op_id: str) -> tuple[int, Any, dict[str, str]]:
        op = self.operations.get(op_id)
        if op is None:
            return 404, {"error": {"code": "NotFound", "message": "operation not found"}}, {}
        status = "Failed" if op["error"] else "Succeeded"
        vm = self.vms.get(op["vm"])
        if op["kind"] == "delete":
            self.vms.pop(op["vm"], None)
        elif vm is not None:
            vm["properties"]["provisioningState"] = status
        reply: dict[str, Any] = {
            "name": op_id,
            "status": status,
            "startTime": CREATED_AT,
            "endTime": CREATED_AT,
        }
        if op["error"]:
            reply["error"] = op["error"]
        return 200, reply, {}

    def _get_vm(self, name: str) -> tuple[int, Any, dict[str, str]]:
        vm = self.vms.get(name.lower())
        if vm is None:
            return (
                404,
                recorded("error_not_found.json", name=name, resource_group=self.resource_group),
                {},
            )
        return 200, vm, {}

    def _list_vms(self, query: dict[str, list[str]]) -> tuple[int, Any, dict[str, str]]:
        vms = [vm for _, vm in sorted(self.vms.items())]
        skip = int(query.get("$skiptoken", ["0"])[0])
        page: dict[str, Any] = {"value": vms[skip : skip + PAGE_SIZE]}
        if skip + PAGE_SIZE < len(vms):
            page["nextLink"] = (
                f"{ARM}/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}"
                f"/providers/Microsoft.Compute/virtualMachines?api-version=2026-04-01"
                f"&$skiptoken={skip + PAGE_SIZE}"
            )
        return 200, page, {}

    def _skus(self, query: dict[str, list[str]]) -> tuple[int, Any, dict[str, str]]:
        text = query.get("$filter", [""])[0]
        m = re.fullmatch(r"location eq '([a-z0-9]+)'", text)
        assert m is not None, f"the fake does not understand the filter {text!r}"
        path = RECORDED / f"skus_{m.group(1)}.json"
        return 200, (json.loads(path.read_text()) if path.exists() else {"value": []}), {}

    def _prices(self, query: dict[str, list[str]]) -> tuple[int, Any, dict[str, str]]:
        text = query.get("$filter", [""])[0]
        region = re.search(r"armRegionName eq '([a-z0-9]+)'", text)
        sizes = set(re.findall(r"armSkuName eq '([A-Za-z0-9_]+)'", text))
        assert region is not None and sizes, f"unexpected Retail Prices filter {text!r}"
        assert "serviceName eq 'Virtual Machines'" in text and "priceType eq 'Consumption'" in text
        items = [
            i
            for i in recorded("retail_prices.json")
            if i["armRegionName"] == region.group(1) and i["armSkuName"] in sizes
        ]
        skip = int(query.get("$skip", ["0"])[0])
        page: dict[str, Any] = {
            "BillingCurrency": "USD",
            "CustomerEntityId": "Default",
            "CustomerEntityType": "Retail",
            "Items": items[skip : skip + PAGE_SIZE],
            "NextPageLink": None,
            "Count": len(items[skip : skip + PAGE_SIZE]),
        }
        if skip + PAGE_SIZE < len(items):
            host = self.next_page_host or self.url
            page["NextPageLink"] = (
                f"{host}/api/retail/prices?api-version=2023-01-01-preview"
                f"&$filter={quote(text)}&$skip={skip + PAGE_SIZE}"
            )
        return 200, page, {}
