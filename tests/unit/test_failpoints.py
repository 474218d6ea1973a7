"""Failpoints: parsed from HELIOTROPE_FAILPOINTS; one that fires is a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from orchestrator import failpoints


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    failpoints.configure("")


def test_parse() -> None:
    assert failpoints.parse("") == {}
    assert failpoints.parse(" a.b = x , y ; c=*;a.b=z ") == {
        "a.b": frozenset({"x", "y", "z"}),
        "c": frozenset({"*"}),
    }


@pytest.mark.parametrize("spec", ["a", "=x", "a=", "a=x,,y"])
def test_a_mistyped_failpoint_is_an_error(spec: str) -> None:
    with pytest.raises(ValueError, match="NAME=VALUE"):
        failpoints.parse(spec)


def test_armed() -> None:
    failpoints.configure(environ={failpoints.ENV: "migration.after=copying; other=*"})
    assert failpoints.armed("migration.after", "copying")
    assert not failpoints.armed("migration.after", "restoring")
    assert failpoints.armed("other", "anything")
    failpoints.configure(environ={})
    assert not failpoints.armed("migration.after", "copying")
    failpoints.hit("migration.after", "copying")  # unarmed: a no-op


def _run(env_spec: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != failpoints.ENV}
    if env_spec is not None:
        env[failpoints.ENV] = env_spec
    code = (
        "import atexit; from orchestrator import failpoints\n"
        "atexit.register(print, 'atexit ran')\n"
        "failpoints.hit('migration.after', 'planned')\n"
        "failpoints.hit('migration.after', 'copying')\n"
        "print('survived')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_failpoint_kills_its_process_with_sigkill() -> None:
    done = _run("migration.after=copying")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == ""  # no cleanup: atexit handlers do not run
    assert "failpoint migration.after=copying: SIGKILL" in done.stderr


def test_unset_nothing_happens() -> None:
    done = _run(None)
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["survived", "atexit ran"]
