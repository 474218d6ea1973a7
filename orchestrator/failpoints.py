"""Failpoints: named places where a test makes this process die as a crash would.

In the spirit of etcd's gofail and TiKV's fail-rs, but with one action only: a failpoint
that fires sends SIGKILL to its own process. No exception, no `finally`, no atexit, no
flush: exactly what an OOM kill, a power loss or `kill -9` leaves behind. Tests use it to
prove that a controller killed at a precise step (right after a migration transition was
committed, say) is resumed correctly by the next one.

Failpoints are configured once per process, from the environment, when the first one is
reached:

    HELIOTROPE_FAILPOINTS="migration.after=copying"
    HELIOTROPE_FAILPOINTS="migration.after=copying,restoring; other.point=*"

Terms are separated by ";", each `NAME=VALUE[,VALUE...]`; the value `*` matches any.
`hit(name, value)` kills the process when the term `name` lists `value`. Unset (the
normal case) `hit` is one dictionary lookup on an empty dictionary.

Failpoints in the code:

- ``migration.after=<phase>`` (orchestrator/live/controller.py): a migration record in
  `<phase>` (a `MigrationPhase` value: planned, checkpointing, copying, provisioning,
  restoring, running, done, rolling_back, failed) was just committed to the state store,
  together with the tick's events and rows. Whichever process commits it dies: `heliotrope
  controller run`, or `heliotrope migrate` for `planned`.

- ``launch.after=<job id>`` (orchestrator/executor.py): a plain launch of the job was just
  made at the provider, and nothing of it committed yet.

Before dying the process writes one line to stderr (``failpoint NAME=VALUE: SIGKILL``),
so that a test can tell a failpoint's kill from any other.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

ENV: str = "HELIOTROPE_FAILPOINTS"
ANY: str = "*"


class _Armed:
    points: dict[str, frozenset[str]] | None = None  # None: not read from the environment yet


_armed = _Armed()


def parse(spec: str) -> dict[str, frozenset[str]]:
    """`NAME=VALUE[,VALUE...]` terms separated by ";" -> {name: values}. Raises ValueError
    on a term without "=" or an empty name or value: a mistyped failpoint must not
    silently never fire."""
    points: dict[str, frozenset[str]] = {}
    for raw in spec.split(";"):
        term = raw.strip()
        if not term:
            continue
        name, sep, listed = term.partition("=")
        name = name.strip()
        values = frozenset(v.strip() for v in listed.split(","))
        if not sep or not name or "" in values:
            raise ValueError(f"{ENV}: {term!r} is not NAME=VALUE[,VALUE...]")
        points[name] = points.get(name, frozenset()) | values
    return points


def configure(spec: str | None = None, environ: Mapping[str, str] | None = None) -> None:
    """(Re)read the failpoints: from `spec`, else from `environ` (default `os.environ`)."""
    if spec is None:
        spec = (os.environ if environ is None else environ).get(ENV, "")
    _armed.points = parse(spec)


def armed(name: str, value: str) -> bool:
    """Whether `hit(name, value)` would kill this process."""
    if _armed.points is None:
        configure()
    assert _armed.points is not None
    values = _armed.points.get(name)
    return values is not None and (value in values or ANY in values)


def hit(name: str, value: str) -> None:
    """Die here, by SIGKILL, if the failpoint `name` is armed for `value`."""
    if _armed.points is not None and not _armed.points:
        return  # the common case: none configured
    if armed(name, value):
        os.write(2, f"failpoint {name}={value}: SIGKILL\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
