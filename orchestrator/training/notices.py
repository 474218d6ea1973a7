"""Preemption notices: the few seconds to minutes a cloud gives before it takes a machine.

Sources (each `poll()` returns a `PreemptionNotice` or None, and raises `TransientError`
when the metadata service cannot be read):

- `AwsSpotNotices`: EC2 instance metadata, IMDSv2 — PUT /latest/api/token, then
  GET /latest/meta-data/spot/instance-action (404 means no notice; about 2 minutes' warning).
- `GceNotices`: GCE metadata server — GET /computeMetadata/v1/instance/preempted with
  header `Metadata-Flavor: Google`; "TRUE" once preempted (about 30 seconds' warning).
- `AzureScheduledEvents`: Azure IMDS Scheduled Events — GET /metadata/scheduledevents with
  header `Metadata: true`; a `Preempt` or `Terminate` event naming this VM (at least 30
  seconds' warning for a Spot eviction).
- `FileNotices`: a local file whose existence is the notice (the local provider's way).

A `NoticeWatcher` polls one source on a daemon thread and calls back once. Signals
(SIGTERM, SIGUSR1) are handled by `ResumableRun` itself. Both base URLs are injectable
so tests run against a tiny http.server on 127.0.0.1. Metadata requests never go through
an HTTP proxy.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from orchestrator.errors import InputError, TransientError

logger = logging.getLogger(__name__)

AWS_METADATA_URL: Final = "http://169.254.169.254"
GCE_METADATA_URL: Final = "http://metadata.google.internal"
AZURE_METADATA_URL: Final = "http://169.254.169.254"
# The names of HELIOTROPE_NOTICE_SOURCE; each cloud's registry spec (providers/registry.py)
# names the one its VMs use (a test keeps the two in step).
NOTICE_SOURCES: Final = ("aws", "gcp", "azure", "local")
AZURE_SCHEDULED_EVENTS_API: Final = "2020-07-01"
AZURE_INSTANCE_API: Final = "2021-02-01"
AZURE_NOTICE_EVENT_TYPES: Final = frozenset({"Preempt", "Terminate"})
DEFAULT_POLL_S: Final = 2.0

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class PreemptionNotice:
    """`source` is where it came from ("aws", "gcp", "file", "SIGTERM", ...); `detail` what
    it said (e.g. the AWS action and time)."""

    source: str
    detail: str = ""


class NoticeSource(Protocol):
    name: str

    def poll(self) -> PreemptionNotice | None: ...


def _request(
    method: str, url: str, headers: Mapping[str, str], timeout_s: float
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, headers=dict(headers))
    try:
        with _NO_PROXY.open(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise TransientError(
            f"metadata service {url} unreachable: {exc}", retry_after_s=1.0
        ) from exc


class AwsSpotNotices:
    """EC2 spot interruption notices over IMDSv2 (the session token is cached and renewed)."""

    name = "aws"

    def __init__(
        self,
        base_url: str = AWS_METADATA_URL,
        *,
        timeout_s: float = 1.0,
        token_ttl_s: int = 21600,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.token_ttl_s = token_ttl_s
        self._monotonic = monotonic
        self._token: str | None = None
        self._token_expires = 0.0

    def _get_token(self) -> str:
        now = self._monotonic()
        if self._token is None or now >= self._token_expires:
            status, body = _request(
                "PUT",
                f"{self.base_url}/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)},
                self.timeout_s,
            )
            if status != 200:
                raise TransientError(
                    f"IMDSv2 token request answered HTTP {status}", retry_after_s=1.0
                )
            self._token = body.decode().strip()
            self._token_expires = now + self.token_ttl_s * 0.5
        return self._token

    def poll(self) -> PreemptionNotice | None:
        for _attempt in range(2):
            status, body = _request(
                "GET",
                f"{self.base_url}/latest/meta-data/spot/instance-action",
                {"X-aws-ec2-metadata-token": self._get_token()},
                self.timeout_s,
            )
            if status == 401:  # token expired or revoked: get a new one, once
                self._token = None
                continue
            if status == 404:
                return None
            if status != 200:
                raise TransientError(
                    f"IMDS spot/instance-action answered HTTP {status}", retry_after_s=1.0
                )
            try:
                action = json.loads(body)
                detail = f"{action.get('action', '?')} at {action.get('time', '?')}"
            except (ValueError, AttributeError):
                detail = body.decode(errors="replace")[:200]
            return PreemptionNotice("aws", detail)
        raise TransientError("IMDSv2 refused two fresh tokens", retry_after_s=1.0)


class GceNotices:
    """GCE spot/preemptible VM preemption, from the metadata server."""

    name = "gcp"

    def __init__(self, base_url: str = GCE_METADATA_URL, *, timeout_s: float = 1.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def poll(self) -> PreemptionNotice | None:
        status, body = _request(
            "GET",
            f"{self.base_url}/computeMetadata/v1/instance/preempted",
            {"Metadata-Flavor": "Google"},
            self.timeout_s,
        )
        if status != 200:
            raise TransientError(
                f"GCE metadata instance/preempted answered HTTP {status}", retry_after_s=1.0
            )
        if body.decode(errors="replace").strip().upper() == "TRUE":
            return PreemptionNotice("gcp", "instance/preempted is TRUE")
        return None


def azure_preemption_notice(
    document: Mapping[str, object], vm_name: str
) -> PreemptionNotice | None:
    """The notice in a Scheduled Events document for the VM `vm_name`, or None: only events
    naming this VM count (a VM sees those of its availability or scale set too).

    >>> doc = {"Events": [{"EventType": "Preempt", "Resources": ["vm-1"],
    ...                    "EventStatus": "Scheduled", "NotBefore": "soon"}]}
    >>> azure_preemption_notice(doc, "vm-1").detail, azure_preemption_notice(doc, "vm-2")
    ('Preempt (Scheduled) not before soon', None)
    """
    events = document.get("Events")
    for event in events if isinstance(events, list) else []:
        if not isinstance(event, Mapping):
            continue
        kind = str(event.get("EventType", ""))
        resources = [str(r).lower() for r in event.get("Resources") or []]
        if kind not in AZURE_NOTICE_EVENT_TYPES or vm_name.lower() not in resources:
            continue
        status = event.get("EventStatus", "?")
        detail = f"{kind} ({status}) not before {event.get('NotBefore') or 'now'}"
        return PreemptionNotice("azure", detail)
    return None


class AzureScheduledEvents:
    """Azure Spot evictions from Scheduled Events for this VM (its name is read once from
    `/metadata/instance/compute/name` and kept). The first request turns Scheduled Events
    on for the VM and may take a few seconds."""

    name = "azure"

    def __init__(
        self,
        base_url: str = AZURE_METADATA_URL,
        *,
        timeout_s: float = 2.0,
        vm_name: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._vm_name = vm_name

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            return _request("GET", f"{self.base_url}{path}", {"Metadata": "true"}, self.timeout_s)
        except TransientError as exc:
            raise TransientError(
                f"Azure IMDS {self.base_url} unreachable: {exc}", retry_after_s=1.0
            ) from exc

    def vm_name(self) -> str:
        if self._vm_name is None:
            status, body = self._get(
                f"/metadata/instance/compute/name?api-version={AZURE_INSTANCE_API}&format=text"
            )
            if status != 200 or not body.strip():
                raise TransientError(
                    f"Azure IMDS compute/name answered HTTP {status}", retry_after_s=1.0
                )
            self._vm_name = body.decode(errors="replace").strip()
        return self._vm_name

    def poll(self) -> PreemptionNotice | None:
        name = self.vm_name()
        status, body = self._get(
            f"/metadata/scheduledevents?api-version={AZURE_SCHEDULED_EVENTS_API}"
        )
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
        return azure_preemption_notice(document, name)


class FileNotices:
    """The notice is the existence of `path` (its first line, if any, is the detail)."""

    name = "file"

    def __init__(self, path: str) -> None:
        self.path = path

    def poll(self) -> PreemptionNotice | None:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                detail = f.readline().strip()
        except FileNotFoundError:
            return None
        except OSError as exc:  # exists but unreadable: still a notice
            detail = str(exc)
        return PreemptionNotice("file", detail or self.path)


class NoticeWatcher:
    """Polls `source` every `interval_s` on a daemon thread; calls `on_notice` once, then
    stops. Poll failures are logged (the first at WARNING, the rest at DEBUG) and retried."""

    def __init__(
        self,
        source: NoticeSource,
        on_notice: Callable[[PreemptionNotice], None],
        *,
        interval_s: float = DEFAULT_POLL_S,
    ) -> None:
        self.source = source
        self.interval_s = interval_s
        self._on_notice = on_notice
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"notices-{source.name}", daemon=True
        )

    def start(self) -> NoticeWatcher:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                notice = self.source.poll()
            except TransientError as exc:
                failures += 1
                log = logger.warning if failures == 1 else logger.debug
                log(
                    "cannot poll %s preemption notices (attempt %d): %s",
                    self.source.name,
                    failures,
                    exc,
                )
            except Exception:
                logger.exception("%s notice source failed; polling goes on", self.source.name)
            else:
                failures = 0
                if notice is not None:
                    logger.warning("preemption notice from %s: %s", notice.source, notice.detail)
                    self._on_notice(notice)
                    return
            self._stop.wait(self.interval_s)


def notice_source_from_env(environ: Mapping[str, str] | None = None) -> NoticeSource | None:
    """The source named by HELIOTROPE_NOTICE_SOURCE (aws | gcp | azure | local), or None.

    HELIOTROPE_METADATA_URL overrides the metadata base URL (tests, proxies). `local` (or
    no source at all with HELIOTROPE_PREEMPT_FILE set) watches that file; SIGUSR1 and
    SIGTERM work with any source or none."""
    env = os.environ if environ is None else environ
    kind = env.get("HELIOTROPE_NOTICE_SOURCE", "").strip().lower()
    base = env.get("HELIOTROPE_METADATA_URL", "").strip()
    path = env.get("HELIOTROPE_PREEMPT_FILE", "").strip()
    if kind == "aws":
        return AwsSpotNotices(base or AWS_METADATA_URL)
    if kind == "gcp":
        return GceNotices(base or GCE_METADATA_URL)
    if kind == "azure":
        return AzureScheduledEvents(base or AZURE_METADATA_URL)
    if kind in ("local", ""):
        return FileNotices(path) if path else None
    raise InputError(
        "environment",
        "HELIOTROPE_NOTICE_SOURCE",
        "one of " + ", ".join(NOTICE_SOURCES),
        got=repr(kind),
        fix="or leave it unset",
    )


def poll_interval_from_env(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    raw = env.get("HELIOTROPE_NOTICE_POLL_S", "").strip()
    if not raw:
        return DEFAULT_POLL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise InputError(
            "environment", "HELIOTROPE_NOTICE_POLL_S", "seconds in (0, 3600]", got=repr(raw)
        )
    return value
