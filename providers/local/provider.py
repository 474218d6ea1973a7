"""`LocalProvider`: instances are subprocesses on this machine, regions are directories.

Everything the provider knows lives on disk under `root`, so a controller that is killed
and started again (a new `LocalProvider` on the same root) sees the same instances, starts
nothing twice and reports nothing twice:

    root/<region>/checkpoints/                the region's checkpoint store (`checkpoint_uri`)
    root/<region>/instances/<instance_id>/
        meta.json      cluster, job, request id, offer, pid + process start time, times
        stdout.log     the job's stdout and stderr
        progress.json  written by the job: {"fraction": 0..1, "step": n,
                       "checkpoint_fraction": 0..1 (optional)}
        preempt        the preemption notice (written by `preempt`, read by the job)
        exit_code      written by the wrapper shell when the job exits by itself
        ended.json     written before the provider stops the process (terminate / preempt)
        reported.json  what `poll_events` has reported (progress seen, final event sent)
    root/.launch.lock  serializes launches (capacity checks, request ids) across processes

The instance id is a hash of (cluster, request id), so `launch` is idempotent without an
index: a repeated request finds the directory it made. A launch interrupted between making
the directory and recording the pid is finished by the next call with the same request id
(the process, if it was started, is found by its HELIOTROPE_INSTANCE_ID environment entry).

Each job runs as `sh -c '<job>; echo $? > exit_code'` in its own session and process group
(the shell is the group leader, its pid the group id). The shell traps SIGTERM so that it
outlives a graceful stop and records the job's exit status; the job itself gets the default
SIGTERM disposition. Stopping an instance signals the whole group: SIGTERM, `grace_s` of
waiting, then SIGKILL, so no child of the job is left behind (unless it made its own
session, as no training job should).

The launch contract for distributed jobs (providers/gang.py, as on every provider): a local
instance is one node, and a gang of `count` runs on it as one node of `count x gpu_count`
processes. The job gets MASTER_ADDR (127.0.0.1), MASTER_PORT (a free port, recorded),
NNODES (1), NODE_RANK (0), NPROC_PER_NODE, the same as torchrun's PET_* defaults and under
HELIOTROPE_* names, and runs under torchrun (this Python's `-m torch.distributed.run`, c10d
rendezvous on that port) when it has more than one process, unless the launch says
`Launcher.NONE` or the entrypoint is a torchrun itself (which needs no arguments). When
the machine has GPUs (the controller's CUDA_VISIBLE_DEVICES, else /proc/driver/nvidia/gpus;
or `gpus=`), each instance gets its own ones by CUDA_VISIBLE_DEVICES, recorded in
meta.json; a launch that finds too few free is refused as CAPACITY.

Start-up: a local instance is ready at once and the job's own start (imports, restore) is
all it takes, unless `emulate_startup`: then it is ready after the start-up the launch
declares (`LaunchSpec.startup_s`: the job's cold start and checkpoint transfer), as a cloud
instance boots, and the job gets HELIOTROPE_READY_AT (wall-clock epoch seconds): its first
step waits for it (`orchestrator.training.boot`), so its progress is what a model of the
launch predicts (the demo's replay is one).

Timestamps (`launched_at_s`, event times) come from the injected `Clock`; waiting for real
processes to exit (grace periods, notices) is wall time, since the processes are real.
Linux only: identity and group membership are read from /proc.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.clock import Clock, real_seconds
from orchestrator.model import InstanceId, Offer, OfferId
from providers.base import (
    Capability,
    EventType,
    FailureKind,
    InstanceInfo,
    InstanceState,
    LaunchOutcome,
    LaunchSpec,
    ProviderEvent,
    ProviderFailure,
)
from providers.gang import MASTER_PORT, Node, command, environment
from providers.local import _proc
from providers.local.offers import check_region_name

logger = logging.getLogger(__name__)

DEFAULT_ROOT = Path("~/.heliotrope/local")
NOTICE_SOURCE = "local"
# an emulated start-up's end, wall-clock epoch seconds (read by orchestrator.training.boot)
READY_AT_ENV = "HELIOTROPE_READY_AT"
LOCAL_MASTER = "127.0.0.1"  # a local gang is one node: its rendezvous is on this machine
# torchrun of the controller's own Python (the job runs where the controller does)
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the group to disappear
POLL_INTERVAL_S = 0.02
FAILED_DETAIL_LINES = 20
_TAIL_BYTES = 8192

META = "meta.json"
STDOUT = "stdout.log"
PROGRESS = "progress.json"
PREEMPT = "preempt"
EXIT_CODE = "exit_code"
ENDED = "ended.json"
REPORTED = "reported.json"
LOCK = ".launch.lock"

# $0 is the wrapper's name, "$@" the entrypoint. `trap : TERM` makes the shell wait for the
# job on SIGTERM instead of dying first (the job gets the default disposition back on exec).
_WRAPPER = (
    'trap : TERM; "$@"; code=$?; '
    'printf "%s\\n" "$code" > exit_code.tmp && mv -f exit_code.tmp exit_code; exit "$code"'
)

# Inherited variables the job does not get: cloud credentials, anything that looks like a
# secret, and the controller's own HELIOTROPE_* settings (the job gets exactly the ones the
# launch spec and the provider set).
_DROPPED_PREFIXES = ("AWS_", "GOOGLE_", "GCP_", "GCLOUD_", "CLOUDSDK_", "AZURE_", "HELIOTROPE_")
_SECRET_NAME = re.compile(
    r"SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|AUTH",
    re.IGNORECASE,
)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class _Life(enum.Enum):
    NOT_STARTED = "not_started"  # a launch was interrupted before the process started
    BOOTING = "booting"  # another controller is launching it right now
    ALIVE = "alive"
    EXITED = "exited"


class _Ended(enum.Enum):
    TERMINATED = "terminated"
    PREEMPTED = "preempted"


@dataclass(frozen=True, slots=True)
class _Meta:
    instance_id: str
    cluster: str
    job_id: str
    request_id: str
    offer_id: str
    region: str
    count: int
    entrypoint: tuple[str, ...]
    launched_at_s: float
    ready_at_s: float
    pid: int | None = None
    start_ticks: int | None = None  # /proc/<pid>/stat field 22: start time, ticks since boot
    gpus: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES of the instance (none without GPUs)
    nproc: int = 1  # processes of the node (NPROC_PER_NODE)
    master_port: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "instance_id": self.instance_id,
            "cluster": self.cluster,
            "job_id": self.job_id,
            "request_id": self.request_id,
            "offer_id": self.offer_id,
            "region": self.region,
            "count": self.count,
            "entrypoint": list(self.entrypoint),
            "launched_at_s": self.launched_at_s,
            "ready_at_s": self.ready_at_s,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "gpus": list(self.gpus),
            "nproc": self.nproc,
            "master_port": self.master_port,
        }

    @staticmethod
    def from_json(data: object) -> _Meta | None:
        """The record, or None for anything that is not one of ours (wrong shape)."""
        if not isinstance(data, dict):
            return None
        try:
            strings = {
                k: data[k]
                for k in ("instance_id", "cluster", "job_id", "request_id", "offer_id", "region")
            }
            entrypoint = data["entrypoint"]
            count, pid, ticks = data["count"], data.get("pid"), data.get("start_ticks")
            launched, ready = data["launched_at_s"], data["ready_at_s"]
        except KeyError:
            return None
        if not all(isinstance(v, str) for v in strings.values()):
            return None
        if not isinstance(entrypoint, list) or not all(isinstance(a, str) for a in entrypoint):
            return None
        if not isinstance(count, int) or not all(
            v is None or isinstance(v, int) for v in (pid, ticks)
        ):
            return None
        if not all(isinstance(v, int | float) for v in (launched, ready)):
            return None
        gpus, nproc, port = data.get("gpus", []), data.get("nproc", 1), data.get("master_port")
        if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
            return None
        if not isinstance(nproc, int) or not (port is None or isinstance(port, int)):
            return None
        return _Meta(
            instance_id=strings["instance_id"],
            cluster=strings["cluster"],
            job_id=strings["job_id"],
            request_id=strings["request_id"],
            offer_id=strings["offer_id"],
            region=strings["region"],
            count=count,
            entrypoint=tuple(entrypoint),
            launched_at_s=float(launched),
            ready_at_s=float(ready),
            pid=pid,
            start_ticks=ticks,
            gpus=tuple(gpus),
            nproc=nproc,
            master_port=port,
        )


@dataclass(frozen=True, slots=True)
class _Instance:
    dir: Path
    meta: _Meta

    @property
    def id(self) -> InstanceId:
        return self.meta.instance_id


@dataclass(frozen=True, slots=True)
class _Reported:
    final: bool = False
    progress: tuple[float, int | None, float | None] | None = None  # fraction, step, kept


class LocalProvider:
    """Subprocesses on this machine as instances, directories as regions.

    `offers` are what the provider sells (see `local_offers`); an offer's region is the
    directory its instances run in. `capacity[region]` is how many instances may run in a
    region at once, whichever cluster launched them (a gang of `count` takes `count`).
    Only instances whose meta.json names `cluster` are ever terminated or reported.
    """

    name = "local"

    def __init__(
        self,
        root: Path = DEFAULT_ROOT,
        *,
        cluster: str,
        offers: Sequence[Offer],
        capacity: Mapping[str, int],
        clock: Clock,
        grace_s: float = 10.0,
        gpus: Sequence[str] | None = None,
        emulate_startup: bool = False,
    ) -> None:
        if not cluster:
            raise ValueError("cluster must not be empty")
        if not grace_s >= 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        for region, slots in capacity.items():
            check_region_name(region)
            if slots < 0:
                raise ValueError(f"capacity of local region {region!r} must be >= 0, got {slots}")
        missing = sorted({o.region for o in offers} - set(capacity))
        if missing:
            raise ValueError(
                f"no capacity given for local regions {missing}: "
                "add them to `capacity` (instances at once per region)"
            )
        self._root = root.expanduser().resolve()
        self._cluster = cluster
        self._offers = tuple(offers)
        self._offer_by_id: dict[OfferId, Offer] = {o.id: o for o in self._offers}
        self._capacity = dict(capacity)
        self._clock = clock
        self._grace_s = grace_s
        self._gpus = tuple(gpus) if gpus is not None else machine_gpus()
        self._emulate_startup = emulate_startup
        for region in self._capacity:
            (self._root / region / "checkpoints").mkdir(parents=True, exist_ok=True)
            (self._root / region / "instances").mkdir(parents=True, exist_ok=True)

    # -- contract -------------------------------------------------------------------------
    def capabilities(self) -> frozenset[Capability]:
        return frozenset(
            {
                Capability.ON_DEMAND,
                Capability.SPOT,
                Capability.PREEMPTION_NOTICE,
                Capability.PREEMPT,
                Capability.ACKNOWLEDGE,
            }
        )

    def offers(self) -> Sequence[Offer]:
        return self._offers

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]:
        """Instances of `cluster` whose process is alive (pid and start time match) or that
        another controller is launching right now."""
        _proc.reap()
        found: dict[InstanceId, InstanceInfo] = {}
        for scanned in self._scan():
            if scanned.meta.cluster != cluster:
                continue
            life, inst = self._life(scanned)
            if life is _Life.ALIVE or life is _Life.BOOTING:
                found[inst.id] = self._info(inst, life)
        return found

    def launch(self, spec: LaunchSpec, *, request_id: str) -> LaunchOutcome:
        """Start `spec.entrypoint` in the offer's region; the same request id (for this
        cluster) always returns the same instance and starts at most one process."""
        instance_id = instance_id_for(self._cluster, request_id)
        with self._launch_lock():
            existing = self._find(instance_id)
            if existing is not None:
                life, existing = self._life(existing, locked=True)
                if life is not _Life.NOT_STARTED or self._ended(existing.dir) is not None:
                    if existing.meta.offer_id != spec.offer_id:
                        logger.warning(
                            "launch request %s repeated with offer %s; instance %s "
                            "was launched on %s",
                            request_id,
                            spec.offer_id,
                            instance_id,
                            existing.meta.offer_id,
                        )
                    return LaunchOutcome(instance_id, ready_at_s=existing.meta.ready_at_s)
                logger.info(
                    "finishing the interrupted launch of %s (request %s)", instance_id, request_id
                )
                refusal = self._check_capacity(
                    existing.meta.region, existing.meta.count, exclude=instance_id
                )
                if refusal is not None:
                    return LaunchOutcome(None, error=refusal)
                return self._start(existing, spec.env)
            invalid = self._invalid(spec)
            if invalid is not None:
                return LaunchOutcome(None, error=ProviderFailure(FailureKind.INVALID, invalid))
            offer = self._offer_by_id[spec.offer_id]
            refusal = self._check_capacity(offer.region, spec.count, exclude=instance_id)
            if refusal is not None:
                return LaunchOutcome(None, error=refusal)
            nproc = offer.gpu_count * spec.count
            gpus = self._free_gpus(nproc) if self._gpus else ()
            if gpus is None:
                return LaunchOutcome(
                    None,
                    error=ProviderFailure(
                        FailureKind.CAPACITY,
                        f"local GPUs: fewer than {nproc} of "
                        f"{len(self._gpus)} free for {spec.count} x {offer.gpu_count}",
                    ),
                )
            now_s = self._clock.now().timestamp()
            port = _free_port()
            node = Node(instance_id, 0, 1, nproc, LOCAL_MASTER, port)
            meta = _Meta(
                instance_id=instance_id,
                cluster=self._cluster,
                job_id=spec.job_id,
                request_id=request_id,
                offer_id=offer.id,
                region=offer.region,
                count=spec.count,
                # the command the node runs (under torchrun unless the launch says not)
                entrypoint=command(
                    spec.entrypoint, node, spec.launcher, request_id=request_id, torchrun=TORCHRUN
                ),
                launched_at_s=now_s,
                # the job restores itself; an emulated start-up is the one it declares
                ready_at_s=now_s + (spec.startup_s if self._emulate_startup else 0.0),
                gpus=gpus,
                nproc=nproc,
                master_port=port,
            )
            inst_dir = self._root / offer.region / "instances" / instance_id
            inst_dir.mkdir(parents=True, exist_ok=True)
            _write_json(inst_dir / META, meta.to_json())  # recorded before anything starts
            return self._start(_Instance(inst_dir, meta), spec.env)

    def terminate(self, ids: Sequence[InstanceId], *, request_id: str) -> None:
        """Stop our instances among `ids` (SIGTERM to the group, `grace_s`, SIGKILL) and
        wait until they are gone. Ids that are unknown or of another cluster are ignored."""
        for instance_id in ids:
            inst = self._find(instance_id)
            if inst is None or inst.meta.cluster != self._cluster:
                logger.warning(
                    "terminate %s (request %s): not an instance of cluster %s; ignored",
                    instance_id,
                    request_id,
                    self._cluster,
                )
                continue
            self._stop(inst, _Ended.TERMINATED, request_id, notice_s=0.0)

    def poll_events(self) -> list[ProviderEvent]:
        """What happened to this cluster's instances: PROGRESS when progress.json changed
        since the last poll (recorded in reported.json), and an ended instance's final
        event -- PREEMPTED for a `preempt`, COMPLETED for exit status 0, FAILED otherwise --
        on every poll until the controller `acknowledge`s it after committing it: a
        controller killed before its commit, or whose commit was refused, is told again
        (at least once; the controller's handlers are idempotent). A terminated instance
        ends silently."""
        _proc.reap()
        now_s = self._clock.now().timestamp()
        events: list[ProviderEvent] = []
        for scanned in self._scan():
            if scanned.meta.cluster != self._cluster:
                continue
            reported = _read_reported(scanned.dir)
            if reported.final:
                continue
            life, inst = self._life(scanned)
            if life is _Life.NOT_STARTED or life is _Life.BOOTING:
                continue
            ended = self._ended(inst.dir)
            new = reported
            if ended is not _Ended.TERMINATED:
                progress = _read_progress(inst.dir)
                if progress is not None and progress != reported.progress:
                    fraction, step, kept = progress
                    events.append(
                        ProviderEvent(
                            EventType.PROGRESS,
                            inst.id,
                            inst.meta.job_id,
                            now_s,
                            "" if step is None else f"step {step}",
                            value=fraction,
                            checkpointed=kept,
                        )
                    )
                    new = replace(new, progress=progress)
            if life is _Life.EXITED:
                final = self._final_event(inst, ended, now_s)
                if final is not None:
                    events.append(final)  # until acknowledged
                else:
                    new = replace(new, final=True)
            if new != reported:
                _write_reported(inst.dir, new)
        return events

    def acknowledge(self, events: Sequence[ProviderEvent]) -> None:
        """The controller committed these events: final ones are not reported again."""
        final = {EventType.PREEMPTED, EventType.COMPLETED, EventType.FAILED}
        for event in events:
            if event.type not in final:
                continue
            inst = self._find(event.instance_id)
            if inst is None or inst.meta.cluster != self._cluster:
                continue
            reported = _read_reported(inst.dir)
            if not reported.final:
                _write_reported(inst.dir, replace(reported, final=True))

    # -- local extras ---------------------------------------------------------------------
    def preempt(self, instance_id: InstanceId, notice_s: float = 2.0) -> bool:
        """Simulate a spot reclaim: write the instance's preempt file (the job's notice),
        wait up to `notice_s` for the job to leave, then stop it as `terminate` does. The
        next `poll_events` reports PREEMPTED. False (and nothing done) when the instance is
        not a running instance of this cluster."""
        inst = self._find(instance_id)
        if inst is None or inst.meta.cluster != self._cluster:
            logger.warning(
                "preempt %s: not an instance of cluster %s; ignored", instance_id, self._cluster
            )
            return False
        life, inst = self._life(inst)
        if life is not _Life.ALIVE:
            logger.info("preempt %s: not running (%s); nothing to do", instance_id, life.value)
            return False
        self._stop(inst, _Ended.PREEMPTED, f"preempt:{instance_id}", notice_s=notice_s)
        return True

    def checkpoint_uri(self, region: str) -> str:
        """The file:// URI of the region's checkpoint store root."""
        if region not in self._capacity:
            raise ValueError(f"unknown local region {region!r}; known: {sorted(self._capacity)}")
        path = self._root / region / "checkpoints"
        path.mkdir(parents=True, exist_ok=True)
        return path.as_uri()

    def instance_dir(self, instance_id: InstanceId) -> Path | None:
        """The directory of one of this cluster's instances (logs, progress), if any."""
        inst = self._find(instance_id)
        return None if inst is None or inst.meta.cluster != self._cluster else inst.dir

    @property
    def root(self) -> Path:
        return self._root

    # -- launching ------------------------------------------------------------------------
    def _invalid(self, spec: LaunchSpec) -> str | None:
        if spec.cluster != self._cluster:
            return (
                f"launch spec names cluster {spec.cluster!r}, this provider manages "
                f"{self._cluster!r}"
            )
        if spec.offer_id not in self._offer_by_id:
            return f"unknown offer {spec.offer_id!r}"
        if not spec.entrypoint or not spec.entrypoint[0]:
            return f"empty entrypoint for job {spec.job_id!r}"
        if spec.count < 1:
            return f"count must be >= 1, got {spec.count}"
        return None

    def _check_capacity(self, region: str, count: int, *, exclude: str) -> ProviderFailure | None:
        used = 0
        for inst in self._scan(region):
            if inst.id == exclude:
                continue
            life, _ = self._life(inst, locked=True)
            if life is _Life.ALIVE or life is _Life.BOOTING:
                used += inst.meta.count
        slots = self._capacity.get(region, 0)
        if used + count > slots:
            return ProviderFailure(
                FailureKind.CAPACITY,
                f"local region {region}: {used} of {slots} instances in use, {count} requested",
            )
        return None

    def _free_gpus(self, n: int) -> tuple[str, ...] | None:
        """`n` of the machine's GPUs that no live instance holds (any cluster), or None.
        Called with the launch lock held."""
        held: set[str] = set()
        for inst in self._scan():
            life, _ = self._life(inst, locked=True)
            if life is _Life.ALIVE or life is _Life.BOOTING:
                held.update(inst.meta.gpus)
        free = [g for g in self._gpus if g not in held]
        return tuple(free[:n]) if len(free) >= n else None

    def _start(self, inst: _Instance, spec_env: Mapping[str, str]) -> LaunchOutcome:
        """Start the recorded instance's process and record its pid and start time.
        Called with the launch lock held, after the capacity check."""
        meta = inst.meta
        env = self._environment(inst, spec_env)
        try:
            with (inst.dir / STDOUT).open("ab") as log:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", _WRAPPER, "heliotrope-job", *meta.entrypoint],
                    cwd=inst.dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            logger.warning("launch of %s failed to start: %s", meta.instance_id, exc)
            return LaunchOutcome(
                None,
                error=ProviderFailure(
                    FailureKind.TRANSIENT, f"could not start the job's process: {exc}"
                ),
            )
        _proc.register_child(proc)
        st = _proc.proc_stat(proc.pid)  # our unreaped child: /proc/<pid> exists even if it exited
        meta = replace(meta, pid=proc.pid, start_ticks=None if st is None else st.start_ticks)
        _write_json(inst.dir / META, meta.to_json())
        logger.info(
            "launched %s (job %s, offer %s, pid %s) in %s",
            meta.instance_id,
            meta.job_id,
            meta.offer_id,
            proc.pid,
            inst.dir,
        )
        return LaunchOutcome(meta.instance_id, ready_at_s=meta.ready_at_s)

    def _environment(self, inst: _Instance, spec_env: Mapping[str, str]) -> dict[str, str]:
        """The controller's environment less credentials, then the gang contract's
        (providers/gang.py) for rank 0 of a one-node gang of `nproc` processes, then the
        local notice and progress files."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(_DROPPED_PREFIXES) and not _SECRET_NAME.search(k)
        }
        env["PYTHONUNBUFFERED"] = "1"  # so stdout.log (and a FAILED event's detail) is current
        meta = inst.meta
        node = Node(inst.id, 0, 1, meta.nproc, LOCAL_MASTER, meta.master_port or MASTER_PORT)
        spec = LaunchSpec(job_id=meta.job_id, offer_id=meta.offer_id, cluster=meta.cluster)
        env.update(spec_env)
        env.update(
            environment(
                spec,
                node,
                cluster=meta.cluster,
                request_id=meta.request_id,
                region=meta.region,
                zone=meta.region,
                extra={
                    "HELIOTROPE_PROGRESS_FILE": str(inst.dir / PROGRESS),
                    "HELIOTROPE_PREEMPT_FILE": str(inst.dir / PREEMPT),
                    "HELIOTROPE_NOTICE_SOURCE": NOTICE_SOURCE,
                },
            )
        )
        booting_s = meta.ready_at_s - self._clock.now().timestamp()
        if booting_s > 0:  # an emulated start-up: the job's first step waits for it
            env[READY_AT_ENV] = repr(time.time() + real_seconds(self._clock, booting_s))
        if meta.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(meta.gpus)
        return env

    @contextlib.contextmanager
    def _launch_lock(self) -> Iterator[None]:
        self._root.mkdir(parents=True, exist_ok=True)
        with (self._root / LOCK).open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _launch_in_progress(self) -> bool:
        """Whether some controller holds the launch lock right now."""
        try:
            with (self._root / LOCK).open("a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return True
                fcntl.flock(f, fcntl.LOCK_UN)
                return False
        except OSError:
            return False

    # -- stopping -------------------------------------------------------------------------
    def _stop(self, inst: _Instance, why: _Ended, request_id: str, *, notice_s: float) -> None:
        if inst.meta.pid is None:
            # It may be mid-launch in another controller: wait for that launch to finish.
            with self._launch_lock():
                found = self._find(inst.id)
                inst = found if found is not None else inst
                life, inst = self._life(inst, locked=True)
        else:
            life, inst = self._life(inst)
        already = self._ended(inst.dir)
        if life is _Life.EXITED and already is None:
            return  # it ended by itself before we asked: poll_events reports how
        if already is None:
            _write_json(
                inst.dir / ENDED,
                {
                    "reason": why.value,
                    "request_id": request_id,
                    "time_s": self._clock.now().timestamp(),
                },
            )
        if life is not _Life.ALIVE or inst.meta.pid is None:
            return  # never started (and now never will), or already gone
        pgid = inst.meta.pid
        if why is _Ended.PREEMPTED:
            _write_json(
                inst.dir / PREEMPT,
                {
                    "reason": "preempted",
                    "notice_s": notice_s,
                    "time_s": self._clock.now().timestamp(),
                },
            )
            logger.info("preempt %s: notice given, %.1f s before SIGTERM", inst.id, notice_s)
            if self._wait_gone(pgid, notice_s):
                return
        logger.info(
            "stop %s (%s, request %s): SIGTERM to process group %s",
            inst.id,
            why.value,
            request_id,
            pgid,
        )
        _proc.signal_group(pgid, signal.SIGTERM)
        if self._wait_gone(pgid, self._grace_s):
            return
        logger.warning(
            "stop %s: still running %.1f s after SIGTERM; SIGKILL", inst.id, self._grace_s
        )
        _proc.signal_group(pgid, signal.SIGKILL)
        if not self._wait_gone(pgid, KILL_WAIT_S):
            logger.error(
                "stop %s: process group %s survived SIGKILL for %.0f s", inst.id, pgid, KILL_WAIT_S
            )

    @staticmethod
    def _wait_gone(pgid: int, timeout_s: float) -> bool:
        """Wait (wall time) until no live process is left in the group; True when gone."""
        deadline = time.monotonic() + timeout_s
        while True:
            _proc.reap()
            if not _proc.group_members(pgid):
                _proc.reap()  # the wrapper may have died since the last reap
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_INTERVAL_S)

    # -- state on disk --------------------------------------------------------------------
    def _scan(self, region: str | None = None) -> Iterator[_Instance]:
        regions = [self._root / region] if region is not None else _subdirs(self._root)
        for region_dir in regions:
            for inst_dir in _subdirs(region_dir / "instances"):
                meta = _read_meta(inst_dir)
                if meta is not None and meta.instance_id == inst_dir.name:
                    yield _Instance(inst_dir, meta)

    def _find(self, instance_id: str) -> _Instance | None:
        if not _SAFE_NAME.fullmatch(instance_id):
            return None
        for region_dir in _subdirs(self._root):
            inst_dir = region_dir / "instances" / instance_id
            meta = _read_meta(inst_dir)
            if meta is not None and meta.instance_id == instance_id:
                return _Instance(inst_dir, meta)
        return None

    def _life(self, inst: _Instance, *, locked: bool = False) -> tuple[_Life, _Instance]:
        """Whether the instance's process runs. `locked`: the caller holds the launch lock,
        so an instance without a pid is not being launched by anyone else."""
        meta = inst.meta
        if meta.pid is None:
            # Instance ids repeat across roots (they hash cluster and request id), so the
            # process must also name this instance's directory.
            st = _proc.find_by_environ(
                [
                    f"HELIOTROPE_INSTANCE_ID={meta.instance_id}",
                    f"HELIOTROPE_PROGRESS_FILE={inst.dir / PROGRESS}",
                ]
            )
            if st is None:
                booting = not locked and self._launch_in_progress()
                return (_Life.BOOTING if booting else _Life.NOT_STARTED), inst
            # Its launcher died after starting it and before recording it: adopt it.
            meta = replace(meta, pid=st.pgrp, start_ticks=_proc_start(st.pgrp))
            _write_json(inst.dir / META, meta.to_json())
            inst = _Instance(inst.dir, meta)
            logger.info("adopted %s: process group %s", meta.instance_id, st.pgrp)
        assert meta.pid is not None
        st = _proc.proc_stat(meta.pid)
        ours = st is None or st.start_ticks == meta.start_ticks  # else: the pid was recycled
        if st is not None and ours and st.running:
            return _Life.ALIVE, inst
        # The wrapper shell is gone (or a zombie). Unless it recorded the job's exit or we
        # stopped the group, the job it ran may still live: look for the group's members.
        # The group id cannot be recycled while a member lives, so they are ours.
        settled = (inst.dir / EXIT_CODE).exists() or (inst.dir / ENDED).exists()
        if ours and not settled and _proc.group_members(meta.pid):
            return _Life.ALIVE, inst
        return _Life.EXITED, inst

    @staticmethod
    def _ended(inst_dir: Path) -> _Ended | None:
        data = _read_json(inst_dir / ENDED)
        if isinstance(data, dict):
            with contextlib.suppress(ValueError):
                return _Ended(data.get("reason"))
        return None

    def _info(self, inst: _Instance, life: _Life) -> InstanceInfo:
        return InstanceInfo(
            id=inst.id,
            offer_id=inst.meta.offer_id,
            job_id=inst.meta.job_id,
            state=InstanceState.BOOTING if life is _Life.BOOTING else InstanceState.RUNNING,
            launched_at_s=inst.meta.launched_at_s,
            ready_at_s=inst.meta.ready_at_s,
        )

    def _exit_time_s(self, inst: _Instance, now_s: float) -> float:
        """When the job exited, on the provider's clock: the exit status file's age in wall
        seconds, scaled, before now (never before its launch)."""
        try:
            age = max(0.0, time.time() - (inst.dir / EXIT_CODE).stat().st_mtime)
        except OSError:
            return now_s
        return max(inst.meta.launched_at_s, now_s - age / real_seconds(self._clock, 1.0))

    def _final_event(
        self, inst: _Instance, ended: _Ended | None, now_s: float
    ) -> ProviderEvent | None:
        job = inst.meta.job_id
        if ended is _Ended.TERMINATED:
            return None
        if ended is _Ended.PREEMPTED:
            # At the reclaim, as a cloud reports it (and a replay counts it): the notice
            # is the job's time to checkpoint, not time the fleet keeps the instance.
            data = _read_json(inst.dir / ENDED)
            given = data.get("time_s") if isinstance(data, dict) else None
            return ProviderEvent(
                EventType.PREEMPTED,
                inst.id,
                job,
                float(given) if isinstance(given, int | float) else now_s,
                f"local preemption of {inst.meta.offer_id}",
            )
        code = _read_exit_code(inst.dir)
        if code == 0:  # at the exit, as a replay counts it: the wrapper wrote its status then
            exited_s = self._exit_time_s(inst, now_s)
            return ProviderEvent(EventType.COMPLETED, inst.id, job, exited_s, "exit status 0")
        status = "killed without an exit status" if code is None else f"exit status {code}"
        tail = _tail(inst.dir / STDOUT, FAILED_DETAIL_LINES)
        return ProviderEvent(
            EventType.FAILED,
            inst.id,
            job,
            now_s,
            f"{status}; last output:\n{tail}" if tail else status,
        )


def machine_gpus() -> tuple[str, ...]:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES entries: the controller's own
    CUDA_VISIBLE_DEVICES if set, else one index per /proc/driver/nvidia/gpus entry."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(
            g.strip() for g in visible.split(",") if g.strip() and not g.strip().startswith("-")
        )
    try:
        return tuple(str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus"))))
    except OSError:
        return ()


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 right now: the gang's rendezvous (MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def instance_id_for(cluster: str, request_id: str) -> InstanceId:
    """The instance id a launch request gets: stable across controller restarts."""
    digest = hashlib.sha256(f"{cluster}\0{request_id}".encode()).hexdigest()
    return f"local-{digest[:16]}"


# -- files ------------------------------------------------------------------------------------
def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and _SAFE_NAME.fullmatch(p.name))
    except OSError:
        return []


def _proc_start(pid: int) -> int | None:
    st = _proc.proc_stat(pid)
    return None if st is None else st.start_ticks


def _write_json(path: Path, data: object) -> None:
    """Write atomically: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_meta(inst_dir: Path) -> _Meta | None:
    return _Meta.from_json(_read_json(inst_dir / META))


def _read_progress(inst_dir: Path) -> tuple[float, int | None, float | None] | None:
    data = _read_json(inst_dir / PROGRESS)  # a half-written file reads as None: next poll
    if not isinstance(data, dict):
        return None
    fraction, step = _fraction(data.get("fraction")), data.get("step")
    if fraction is None:
        return None
    if isinstance(step, bool) or not isinstance(step, int):
        step = None
    return fraction, step, _fraction(data.get("checkpoint_fraction"))


def _fraction(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return None
    return min(max(float(value), 0.0), 1.0)


def _read_reported(inst_dir: Path) -> _Reported:
    data = _read_json(inst_dir / REPORTED)
    if not isinstance(data, dict):
        return _Reported()
    progress = data.get("progress")
    seen: tuple[float, int | None, float | None] | None = None
    if isinstance(progress, list) and len(progress) in (2, 3):
        fraction, step, kept = (*progress, None)[:3]
        if isinstance(fraction, int | float) and (step is None or isinstance(step, int)):
            seen = (float(fraction), step, _fraction(kept))
    return _Reported(final=data.get("final") is True, progress=seen)


def _write_reported(inst_dir: Path, reported: _Reported) -> None:
    progress = None if reported.progress is None else list(reported.progress)
    _write_json(inst_dir / REPORTED, {"final": reported.final, "progress": progress})


def _read_exit_code(inst_dir: Path) -> int | None:
    try:
        return int((inst_dir / EXIT_CODE).read_text().strip())
    except (OSError, ValueError):
        return None


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - _TAIL_BYTES, 0))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])
