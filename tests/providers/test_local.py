"""The local provider against real subprocesses (tiny `python -c` jobs, no torch).

Every test uses its own root under tmp_path; a fixture kills whatever process group a test
left behind, so a failing test leaks nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.catalog import pue
from orchestrator.clock import FakeClock, ScaledClock, SystemClock
from orchestrator.model import Market
from providers.base import Capability, EventType, FailureKind, LaunchSpec, ProviderEvent
from providers.local import LocalProvider, _proc, instance_id_for, local_offers

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

T0 = datetime(2024, 1, 1, tzinfo=UTC)
REGIONS = ("west", "north")
OFFERS = local_offers(REGIONS, grid_zones={"west": "US-CAL-CISO"})
OD_WEST = "local:west:local-cpu:on_demand"
SPOT_NORTH = "local:north:local-cpu:spot"
CLUSTER = "test"

Factory = Callable[..., LocalProvider]


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def spec(
    code: str,
    *,
    offer: str = OD_WEST,
    job: str = "job-1",
    count: int = 1,
    env: dict[str, str] | None = None,
) -> LaunchSpec:
    return LaunchSpec(
        job_id=job, offer_id=offer, cluster=CLUSTER, count=count, entrypoint=py(code), env=env or {}
    )


def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgrp, start ticks) of a process, independently of the provider's reader."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()
    return rest[0], int(rest[2]), int(rest[19])


def live_members(pgid: int) -> list[int]:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [
        p for p in pids if (st := proc_stat(p)) is not None and st[1] == pgid and st[0] not in "ZXx"
    ]


def leaders_of(provider: LocalProvider, instance_id: str) -> list[int]:
    """Live group leaders started for this instance (by its environment): one per start."""
    inst_dir = provider.instance_dir(instance_id)
    assert inst_dir is not None
    entries = {
        f"HELIOTROPE_INSTANCE_ID={instance_id}".encode(),
        f"HELIOTROPE_PROGRESS_FILE={inst_dir / 'progress.json'}".encode(),
    }
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = set(Path(f"/proc/{name}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        st = proc_stat(int(name))
        if st and st[1] == int(name) and st[0] not in "ZXx" and entries <= environ:
            found.append(int(name))
    return found


def meta(provider: LocalProvider, instance_id: str) -> dict[str, object]:
    inst_dir = provider.instance_dir(instance_id)
    assert inst_dir is not None
    data = json.loads((inst_dir / "meta.json").read_text())
    assert isinstance(data, dict)
    return data


def poll_until(
    provider: LocalProvider, types: set[EventType], timeout_s: float = 10.0
) -> list[ProviderEvent]:
    """Poll until an event of one of `types` arrives; every event seen on the way."""
    seen: list[ProviderEvent] = []

    def got() -> bool:
        seen.extend(provider.poll_events())
        return any(e.type in types for e in seen)

    wait_for(got, timeout_s)
    return seen


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Factory]:
    clock = FakeClock(T0)

    def factory(
        *, cluster: str = CLUSTER, capacity: dict[str, int] | None = None, grace_s: float = 5.0
    ) -> LocalProvider:
        return LocalProvider(
            tmp_path,
            cluster=cluster,
            offers=OFFERS,
            capacity=capacity or {"west": 4, "north": 4},
            clock=clock,
            grace_s=grace_s,
        )

    yield factory
    for meta_file in tmp_path.glob("*/instances/*/meta.json"):  # leave nothing running
        pid = json.loads(meta_file.read_text()).get("pid")
        if isinstance(pid, int) and pid > 1:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


WRITE_ENV = (
    "import json, os\n"
    "json.dump({'env': dict(os.environ), 'cwd': os.getcwd()}, open('env.json', 'w'))\n"
)
SLEEP = "import time\ntime.sleep(60)\n"


def test_launch_runs_the_entrypoint_with_its_environment(
    make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-pass")
    monkeypatch.setenv("MY_API_TOKEN", "do-not-pass")
    monkeypatch.setenv("HELIOTROPE_DB_URL", "postgresql://user:pw@db/x")
    monkeypatch.setenv("HARMLESS_SETTING", "kept")
    provider = make()
    outcome = provider.launch(
        spec(WRITE_ENV, env={"HELIOTROPE_CHECKPOINT_URI": "file:///c"}), request_id="r1"
    )
    assert outcome.ok and outcome.error is None
    assert outcome.instance_id == instance_id_for(CLUSTER, "r1")
    assert outcome.ready_at_s == T0.timestamp()
    inst_dir = provider.instance_dir(outcome.instance_id)
    assert inst_dir == provider.root / "west" / "instances" / outcome.instance_id
    wait_for((inst_dir / "exit_code").exists)
    written = json.loads((inst_dir / "env.json").read_text())
    env = written["env"]
    assert Path(written["cwd"]) == inst_dir
    assert env["HELIOTROPE_INSTANCE_ID"] == outcome.instance_id
    assert env["HELIOTROPE_REGION"] == "west"
    assert env["HELIOTROPE_PROGRESS_FILE"] == str(inst_dir / "progress.json")
    assert env["HELIOTROPE_PREEMPT_FILE"] == str(inst_dir / "preempt")
    assert env["HELIOTROPE_NOTICE_SOURCE"] == "local"
    assert env["HELIOTROPE_JOB_ID"] == "job-1"
    assert env["HELIOTROPE_CHECKPOINT_URI"] == "file:///c"
    assert env["HARMLESS_SETTING"] == "kept"
    for secret in ("AWS_SECRET_ACCESS_KEY", "MY_API_TOKEN", "HELIOTROPE_DB_URL"):
        assert secret not in env
    recorded = meta(provider, outcome.instance_id)
    assert recorded["cluster"] == CLUSTER and recorded["request_id"] == "r1"
    assert recorded["offer_id"] == OD_WEST and recorded["job_id"] == "job-1"
    assert isinstance(recorded["pid"], int) and isinstance(recorded["start_ticks"], int)
    assert recorded["launched_at_s"] == recorded["ready_at_s"] == T0.timestamp()
    assert (inst_dir / "stdout.log").exists()


def test_same_request_id_starts_one_process_even_after_a_restart(make: Factory) -> None:
    provider = make()
    first = provider.launch(spec(SLEEP), request_id="launch-1")
    again = provider.launch(spec(SLEEP), request_id="launch-1")
    instance_id = first.instance_id
    assert instance_id is not None and again.instance_id == instance_id
    wait_for(lambda: len(leaders_of(provider, instance_id)) == 1)
    pid = meta(provider, instance_id)["pid"]

    restarted = make()  # a new controller process on the same root
    third = restarted.launch(spec(SLEEP), request_id="launch-1")
    assert third.instance_id == instance_id
    assert third.ready_at_s == first.ready_at_s
    assert meta(restarted, instance_id)["pid"] == pid
    assert leaders_of(restarted, instance_id) == [pid]
    assert list(restarted.list_instances(cluster=CLUSTER)) == [instance_id]
    other = restarted.launch(spec(SLEEP), request_id="launch-2")
    assert other.instance_id not in (None, instance_id)
    assert set(restarted.list_instances(cluster=CLUSTER)) == {instance_id, other.instance_id}


def test_an_interrupted_launch_is_finished_by_the_same_request(make: Factory) -> None:
    provider = make()
    # The controller died after recording the instance and before starting its process.
    instance_id = instance_id_for(CLUSTER, "crashed")
    inst_dir = provider.root / "west" / "instances" / instance_id
    inst_dir.mkdir(parents=True)
    (inst_dir / "meta.json").write_text(
        json.dumps(
            {
                "instance_id": instance_id,
                "cluster": CLUSTER,
                "job_id": "job-1",
                "request_id": "crashed",
                "offer_id": OD_WEST,
                "region": "west",
                "count": 1,
                "entrypoint": py(SLEEP),
                "launched_at_s": 1.0,
                "ready_at_s": 1.0,
                "pid": None,
                "start_ticks": None,
            }
        )
    )
    assert provider.list_instances(cluster=CLUSTER) == {}
    outcome = provider.launch(spec(SLEEP), request_id="crashed")
    assert outcome.instance_id == instance_id and outcome.ready_at_s == 1.0
    assert list(provider.list_instances(cluster=CLUSTER)) == [instance_id]

    # It died after starting the process, before recording the pid: the process is adopted.
    (inst_dir / "meta.json").write_text(
        json.dumps({**meta(provider, instance_id), "pid": None, "start_ticks": None})
    )
    assert provider.launch(spec(SLEEP), request_id="crashed").instance_id == instance_id
    assert leaders_of(provider, instance_id) == [meta(provider, instance_id)["pid"]]


def test_capacity_and_bad_requests_are_refused_as_data(make: Factory) -> None:
    provider = make(capacity={"west": 2, "north": 1})
    assert provider.launch(spec(SLEEP), request_id="a").ok
    full = provider.launch(spec(SLEEP, count=2), request_id="b")  # a gang of 2: no room
    assert not full.ok and full.instance_id is None
    assert full.error is not None and full.error.kind is FailureKind.CAPACITY
    assert "west" in full.error.message
    assert provider.launch(spec(SLEEP), request_id="c").ok  # one slot was left
    refused = provider.launch(spec(SLEEP), request_id="d")
    assert refused.error is not None and refused.error.kind is FailureKind.CAPACITY
    assert provider.launch(spec(SLEEP, offer=SPOT_NORTH), request_id="e").ok  # other region

    unknown = provider.launch(spec(SLEEP, offer="local:mars:local-cpu:spot"), request_id="f")
    assert unknown.error is not None and unknown.error.kind is FailureKind.INVALID
    empty = provider.launch(
        LaunchSpec(job_id="j", offer_id=OD_WEST, cluster=CLUSTER), request_id="g"
    )
    assert empty.error is not None and empty.error.kind is FailureKind.INVALID
    assert len(provider.list_instances(cluster=CLUSTER)) == 3

    first = instance_id_for(CLUSTER, "a")
    provider.terminate([first], request_id="stop-a")
    assert provider.launch(spec(SLEEP), request_id="d2").ok  # the slot is free again


# Ignores SIGTERM (and so does the child it starts), after noting that it arrived.
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "def note(*_):\n"
    "    open('got_sigterm', 'w').close()\n"
    "signal.signal(signal.SIGTERM, note)\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time\\n"
    'signal.signal(signal.SIGTERM, signal.SIG_IGN)\\nopen("child_up", "w").close()\\n'
    "time.sleep(60)'])\n"
    "time.sleep(60)\n"
)
GRACEFUL = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "open('up', 'w').close()\n"
    "time.sleep(60)\n"
)


def test_terminate_sends_sigterm_then_sigkill_to_the_whole_group(make: Factory) -> None:
    provider = make(grace_s=0.5)
    outcome = provider.launch(spec(STUBBORN), request_id="stubborn")
    assert outcome.instance_id is not None
    inst_dir = provider.instance_dir(outcome.instance_id)
    assert inst_dir is not None
    wait_for((inst_dir / "child_up").exists)
    pgid = meta(provider, outcome.instance_id)["pid"]
    assert isinstance(pgid, int)
    assert len(live_members(pgid)) == 3  # wrapper shell, job, job's child

    started = time.monotonic()
    provider.terminate([outcome.instance_id], request_id="t1")
    elapsed = time.monotonic() - started
    assert (inst_dir / "got_sigterm").exists()  # SIGTERM first ...
    assert 0.5 <= elapsed < 4.0  # ... SIGKILL after the grace period
    assert live_members(pgid) == []  # no orphan left in the group (zombies aside: the
    # job's own children are reaped by init, which in some containers never happens)
    assert proc_stat(pgid) is None  # the wrapper, our child, was reaped
    assert provider.list_instances(cluster=CLUSTER) == {}
    assert provider.poll_events() == []  # a terminated instance ends silently

    started = time.monotonic()
    provider.terminate([outcome.instance_id], request_id="t1")  # idempotent
    make().terminate([outcome.instance_id], request_id="t2")
    assert time.monotonic() - started < 0.5

    graceful = provider.launch(spec(GRACEFUL), request_id="graceful")
    assert graceful.instance_id is not None
    graceful_dir = provider.instance_dir(graceful.instance_id)
    assert graceful_dir is not None
    wait_for((graceful_dir / "up").exists)
    started = time.monotonic()
    provider.terminate([graceful.instance_id], request_id="t3")
    assert time.monotonic() - started < 0.5  # it left on SIGTERM: no wait for the grace
    assert (graceful_dir / "exit_code").read_text().strip() == "0"
    assert provider.poll_events() == []  # exit 0 after our SIGTERM is not a completion


def test_processes_not_launched_for_this_cluster_are_never_listed_or_terminated(
    make: Factory, tmp_path: Path
) -> None:
    provider = make()
    ours = provider.launch(spec(SLEEP), request_id="ours")
    assert ours.instance_id is not None

    foreign_dir = tmp_path / "west" / "instances" / "foreign-1"
    bare_dir = tmp_path / "west" / "instances" / "bare"
    foreign_dir.mkdir(parents=True)
    bare_dir.mkdir(parents=True)
    strangers = [
        subprocess.Popen(py(SLEEP), cwd=d, start_new_session=True) for d in (foreign_dir, bare_dir)
    ]
    try:
        st = proc_stat(strangers[0].pid)
        assert st is not None
        (foreign_dir / "meta.json").write_text(
            json.dumps(
                {
                    "instance_id": "foreign-1",
                    "cluster": "someone-else",
                    "job_id": "theirs",
                    "request_id": "x",
                    "offer_id": OD_WEST,
                    "region": "west",
                    "count": 1,
                    "entrypoint": py(SLEEP),
                    "launched_at_s": 0.0,
                    "ready_at_s": 0.0,
                    "pid": strangers[0].pid,
                    "start_ticks": st[2],
                }
            )
        )
        assert list(provider.list_instances(cluster=CLUSTER)) == [ours.instance_id]
        assert list(provider.list_instances(cluster="someone-else")) == ["foreign-1"]
        provider.terminate(
            ["foreign-1", "bare", "../../west", "nonexistent"], request_id="stop-strangers"
        )
        assert not provider.preempt("foreign-1", notice_s=0.0)
        assert all(p.poll() is None for p in strangers)  # still running
        assert provider.poll_events() == []
        assert provider.instance_dir("foreign-1") is None
    finally:
        for p in strangers:
            p.kill()
            p.wait()


# Watches its preemption notice like the training SDK: on notice, "checkpoint" and leave.
NOTICE_WATCHER = (
    "import os, sys, time\n"
    "notice = os.environ['HELIOTROPE_PREEMPT_FILE']\n"
    "open('up', 'w').close()\n"
    "while not os.path.exists(notice):\n"
    "    time.sleep(0.01)\n"
    "open('saw_notice', 'w').close()\n"
    "sys.exit(0)\n"
)


def test_preempt_gives_notice_then_reports_preempted_once(make: Factory) -> None:
    provider = make()
    outcome = provider.launch(spec(NOTICE_WATCHER, offer=SPOT_NORTH), request_id="spot")
    assert outcome.instance_id is not None
    inst_dir = provider.instance_dir(outcome.instance_id)
    assert inst_dir is not None
    wait_for((inst_dir / "up").exists)
    started = time.monotonic()
    assert provider.preempt(outcome.instance_id, notice_s=5.0)
    assert time.monotonic() - started < 4.0  # the job left during its notice
    assert (inst_dir / "saw_notice").exists()
    assert provider.list_instances(cluster=CLUSTER) == {}
    clock = provider._clock
    assert isinstance(clock, FakeClock)
    clock.advance(300)  # polled later: the event is at the reclaim, as a cloud reports it
    events = provider.poll_events()
    assert [(e.type, e.instance_id, e.job_id) for e in events] == [
        (EventType.PREEMPTED, outcome.instance_id, "job-1")
    ]
    assert events[0].time_s == T0.timestamp()
    # Until the controller acknowledges it (after its commit), it is told again, also by a
    # restarted provider; then never again.
    assert [e.type for e in provider.poll_events()] == [EventType.PREEMPTED]
    assert [e.type for e in make().poll_events()] == [EventType.PREEMPTED]
    provider.acknowledge(events)
    assert provider.poll_events() == []
    assert make().poll_events() == []
    assert not provider.preempt(outcome.instance_id)  # nothing left to preempt


def test_exit_status_gives_completed_or_failed(make: Factory) -> None:
    provider = make()
    ok = provider.launch(spec("print('fine')", job="good"), request_id="ok")
    bad = provider.launch(
        spec("import sys\nprint('first line')\nprint('boom: disk full')\nsys.exit(3)", job="bad"),
        request_id="bad",
    )
    assert ok.instance_id is not None and bad.instance_id is not None
    finals: dict[str, ProviderEvent] = {}

    def both_done() -> bool:
        for e in provider.poll_events():
            assert finals.get(e.instance_id, e) == e  # repeated until acknowledged, the same
            finals[e.instance_id] = e
        return len(finals) == 2

    wait_for(both_done)
    provider.acknowledge(list(finals.values()))
    assert finals[ok.instance_id].type is EventType.COMPLETED
    assert finals[ok.instance_id].job_id == "good"
    failed = finals[bad.instance_id]
    assert failed.type is EventType.FAILED and failed.job_id == "bad"
    assert "exit status 3" in failed.detail and "boom: disk full" in failed.detail
    assert provider.poll_events() == []
    assert make().poll_events() == []

    missing = provider.launch(
        LaunchSpec(
            job_id="nope",
            offer_id=OD_WEST,
            cluster=CLUSTER,
            entrypoint=["/nonexistent/heliotrope-job"],
        ),
        request_id="missing",
    )
    assert missing.ok  # the wrapper started; the job's own start failed
    events = poll_until(provider, {EventType.FAILED})
    assert [e.type for e in events] == [EventType.FAILED]
    assert "exit status 127" in events[0].detail


PROGRESSING = (
    "import json, os, time\n"
    "def report(fraction, step, **kept):\n"
    "    path = os.environ['HELIOTROPE_PROGRESS_FILE']\n"
    "    json.dump({'fraction': fraction, 'step': step, **kept}, open(path + '.tmp', 'w'))\n"
    "    os.replace(path + '.tmp', path)\n"
    "report(0.25, 5)\n"
    "while not os.path.exists('next'):\n"
    "    time.sleep(0.01)\n"
    "report(1.0, 20, checkpoint_fraction=0.75)\n"
)


def test_progress_is_reported_when_it_changes(make: Factory) -> None:
    provider = make()
    outcome = provider.launch(spec(PROGRESSING), request_id="p")
    assert outcome.instance_id is not None
    inst_dir = provider.instance_dir(outcome.instance_id)
    assert inst_dir is not None
    events = poll_until(provider, {EventType.PROGRESS})
    assert [(e.type, e.value, e.detail, e.checkpointed) for e in events] == [
        (EventType.PROGRESS, 0.25, "step 5", None)  # it said nothing of its checkpoints
    ]
    assert provider.poll_events() == []  # unchanged: nothing new
    assert make().poll_events() == []  # nor after a restart
    (inst_dir / "next").touch()
    events = poll_until(provider, {EventType.COMPLETED})
    assert [(e.type, e.value, e.checkpointed) for e in events] == [
        (EventType.PROGRESS, 1.0, 0.75),
        (EventType.COMPLETED, 0.0, None),
    ]


def test_offers_capabilities_and_checkpoint_store(make: Factory) -> None:
    provider = make()
    assert provider.name == "local"
    assert provider.capabilities() == frozenset(
        {
            Capability.ON_DEMAND,
            Capability.SPOT,
            Capability.PREEMPTION_NOTICE,
            Capability.PREEMPT,
            Capability.ACKNOWLEDGE,
        }
    )
    assert list(provider.offers()) == OFFERS
    ids = [o.id for o in OFFERS]
    assert ids == [
        "local:west:local-cpu:on_demand",
        "local:west:local-cpu:spot",
        "local:north:local-cpu:on_demand",
        "local:north:local-cpu:spot",
    ]
    west = OFFERS[0]
    assert (west.cloud, west.region, west.zone, west.instance_type, west.gpu_type) == (
        "local",
        "west",
        "west",
        "local-cpu",
        "local",
    )
    assert west.market is Market.ON_DEMAND and west.grid_zone == "US-CAL-CISO"
    assert OFFERS[2].grid_zone == "unknown"
    assert west.pue == pue("local") and 0 < west.power_kw < 1
    uri = provider.checkpoint_uri("north")
    assert uri == (provider.root / "north" / "checkpoints").as_uri()
    assert uri.startswith("file:///") and (provider.root / "north" / "checkpoints").is_dir()
    with pytest.raises(ValueError, match="unknown local region"):
        provider.checkpoint_uri("mars")


@pytest.mark.parametrize(
    ("regions", "capacity", "match"),
    [
        (("west",), {}, "no capacity"),
        (("west",), {"west": -1}, ">= 0"),
        (("../up",), {"../up": 1}, "directory name"),
    ],
)
def test_bad_configuration_is_refused(
    tmp_path: Path, regions: Sequence[str], capacity: dict[str, int], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        LocalProvider(
            tmp_path,
            cluster=CLUSTER,
            offers=local_offers(regions),
            capacity=capacity,
            clock=FakeClock(T0),
        )


WAIT_FOR_READY = (
    "import json, os, time\n"
    "from orchestrator.training.boot import wait_until_ready\n"
    "wait_until_ready()\n"
    "json.dump({'first_step': time.time(), 'ready_at': os.environ.get('HELIOTROPE_READY_AT')},"
    " open('boot.json', 'w'))\n"
)


@pytest.mark.parametrize("emulate", [False, True])
def test_an_emulated_start_up_is_the_declared_one_and_the_job_waits_for_it(
    tmp_path: Path, emulate: bool
) -> None:
    """With `emulate_startup` a launch is ready after its declared start-up (as the
    simulated provider and a cloud boot), and the job's first step comes after it."""
    clock = ScaledClock(SystemClock(), T0, speed=600.0)  # 0.5 s of wall time: 300 s
    provider = LocalProvider(
        tmp_path,
        cluster=CLUSTER,
        offers=OFFERS,
        capacity={"west": 1, "north": 1},
        clock=clock,
        emulate_startup=emulate,
    )
    launch = LaunchSpec(
        job_id="job-1",
        offer_id=OD_WEST,
        cluster=CLUSTER,
        startup_s=300.0,
        entrypoint=py(WAIT_FOR_READY),
    )
    outcome = provider.launch(launch, request_id="boot-1")
    assert outcome.instance_id is not None
    recorded = meta(provider, outcome.instance_id)
    launched = float(recorded["launched_at_s"])  # type: ignore[arg-type]
    assert outcome.ready_at_s == recorded["ready_at_s"] == launched + (300.0 if emulate else 0.0)
    inst_dir = provider.instance_dir(outcome.instance_id)
    assert inst_dir is not None
    wait_for((inst_dir / "exit_code").exists)
    boot = json.loads((inst_dir / "boot.json").read_text())
    if not emulate:
        assert boot["ready_at"] is None
        return
    ready_wall = float(boot["ready_at"])
    # the ready time in wall seconds is the launch's wall time plus 300 s at 600x
    launched_wall = clock.real_origin.timestamp() + (launched - T0.timestamp()) / 600.0
    assert ready_wall == pytest.approx(launched_wall + 0.5, abs=0.25)
    assert boot["first_step"] >= ready_wall


def test_completion_is_reported_at_the_exit_not_at_the_poll(tmp_path: Path) -> None:
    clock = ScaledClock(SystemClock(), T0, speed=600.0)
    provider = LocalProvider(
        tmp_path, cluster=CLUSTER, offers=OFFERS, capacity={"west": 1, "north": 1}, clock=clock
    )
    outcome = provider.launch(spec("pass"), request_id="quick")
    assert outcome.instance_id is not None
    inst_dir = provider.instance_dir(outcome.instance_id)
    assert inst_dir is not None
    wait_for((inst_dir / "exit_code").exists)
    time.sleep(0.5)  # 300 s of the provider's clock pass before the poll
    (done,) = [e for e in poll_until(provider, {EventType.COMPLETED})]
    polled_s = clock.now().timestamp()
    assert float(meta(provider, outcome.instance_id)["launched_at_s"]) <= done.time_s  # type: ignore[arg-type]
    assert done.time_s <= polled_s - 250.0


def test_two_threads_reaping_the_same_exited_child_is_fine() -> None:
    """The live controller preempts in a thread pool, so two `reap`s can list the same
    exited child; the second found it gone and raised KeyError, which ended `make demo`
    (tests/e2e/test_demo.py, once in three runs here). The interleaving is forced: while
    the outer reap polls the child, another reap takes it first."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    real_poll = proc.poll
    raced: list[bool] = []

    def poll_while_another_thread_reaps() -> int | None:
        if not raced:
            raced.append(True)
            _proc.reap()  # the other thread gets there first
        return real_poll()

    proc.poll = poll_while_another_thread_reaps  # type: ignore[method-assign]
    _proc.register_child(proc)
    _proc.reap()
    assert raced and proc.pid not in _proc._CHILDREN
