"""Linux process facts read from /proc: identity (pid + start time), process groups, environ.

A pid alone does not name a process: the kernel recycles pids. A process is ours when its
pid *and* its start time (field 22 of /proc/<pid>/stat, clock ticks since boot) match what
we recorded when we started it. A process group cannot be recycled while any member is
alive (Linux keeps a pid number in use while it is some process's pgid), so the members of
a group whose leader we identified are ours until the last one exits.

Zombies (state Z or X) count as gone: they run nothing. Our own children are reaped here so
they do not linger as zombies in their process group.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_DEAD_STATES = frozenset({"Z", "X", "x"})

# Children started by any LocalProvider in this process, by pid, so that they are reaped
# (waited for) even when the provider object that started them is gone.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    state: str
    pgrp: int
    start_ticks: int

    @property
    def running(self) -> bool:
        return self.state not in _DEAD_STATES


def proc_stat(pid: int) -> ProcStat | None:
    """The process's state, group and start time; None when there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ".
    rest = text[text.rfind(")") + 2 :].split()
    try:
        # rest[0] is field 3 (state), rest[2] field 5 (pgrp), rest[19] field 22 (starttime)
        return ProcStat(pid=pid, state=rest[0], pgrp=int(rest[2]), start_ticks=int(rest[19]))
    except (IndexError, ValueError):
        return None


def _all_pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir(PROC) if name.isdigit()]
    except OSError:
        return []


def group_members(pgid: int) -> list[ProcStat]:
    """The live (non-zombie) processes whose process group is `pgid`."""
    members = []
    for pid in _all_pids():
        st = proc_stat(pid)
        if st is not None and st.pgrp == pgid and st.running:
            members.append(st)
    return members


def environ_has(pid: int, entries: Sequence[str]) -> bool:
    """Whether the process started with all `entries` ("NAME=value") in its environment."""
    try:
        data = set((PROC / str(pid) / "environ").read_bytes().split(b"\0"))
    except OSError:
        return False
    return all(entry.encode() in data for entry in entries)


def find_by_environ(entries: Sequence[str]) -> ProcStat | None:
    """A live process started with all `entries` in its environment, preferring a group
    leader.

    Used only to recover from a controller that died between starting a process and
    recording its pid; it reads every process's environ, so it is not for the hot path.
    """
    found: list[ProcStat] = []
    for pid in _all_pids():
        st = proc_stat(pid)
        if st is not None and st.running and environ_has(pid, entries):
            found.append(st)
    if not found:
        return None
    leaders = [st for st in found if st.pid == st.pgrp]
    return min(leaders or found, key=lambda st: st.start_ticks)


def register_child(proc: subprocess.Popen[bytes]) -> None:
    _CHILDREN[proc.pid] = proc


def reap() -> None:
    """Wait for (without blocking) every child this process started that has exited.

    Threads may reap at once (the live controller preempts its victims in a pool): a child
    another thread has already reaped is simply gone."""
    for pid, proc in list(_CHILDREN.items()):
        with contextlib.suppress(OSError):
            if proc.poll() is None:
                continue
        _CHILDREN.pop(pid, None)


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to a process group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
