"""`heliotrope logs JOB [--follow]` on the clouds world (`world: clouds` in config.yaml):
the job's console, read through the providers (`Capability.LOGS`). AWS through moto with
the AWS suite's botocore hooks (`GetConsoleOutput` answered with the text a test gives),
GCP through the recorded-response Compute Engine endpoint with its serial port
(`tests.providers.gcp.fake_compute.FakeCompute`).

`logs(...)` builds its world from config.yaml itself (standard credential chains, as the
CLI does); the controller that launches and moves the job runs the same config on a fake
clock, against the same SQLite state store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import tests.providers.conftest as cloud_conftest
from orchestrator.checkpoints import CheckpointStore
from orchestrator.errors import InputError
from orchestrator.jobs import parse_jobs
from orchestrator.live.commands import (
    CLOUD_POLL_S,
    LOCAL_POLL_S,
    _log_tail,
    console_suffix,
    live_controller,
    logs,
)
from orchestrator.live.controller import LiveController
from orchestrator.live.world import World, configured_world, home, load_settings
from orchestrator.model import EventKind, Phase
from orchestrator.state import StateStore, open_store
from providers.base import Capability, with_logs
from providers.local import LocalProvider
from providers.multi import MultiProvider
from tests.e2e.test_multicloud import STEP, TICK_S, aligned_now, job_doc
from tests.providers.aws.test_logs import console
from tests.providers.conftest import AWS_SPOT_L4, CLUSTER, GCP_SPOT_L4, CloudFakes
from tests.providers.gcp.fake_compute import FakeCompute, serial_body
from tests.providers.gcp.test_logs import SERIAL_API

JOB = "lm-spot"  # job_doc()'s
BOOT = "boot ok\nstep 1 loss 2.31\n"


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[CloudFakes]:
    with cloud_conftest.open_cloud_fakes(monkeypatch, tmp_path) as f:
        f.use_standard_credential_chains(monkeypatch)
        assert isinstance(f.compute, FakeCompute)
        where = home()
        where.mkdir(parents=True)
        (where / "config.yaml").write_text(
            yaml.safe_dump(
                {
                    "world": "clouds",
                    "cluster": CLUSTER,
                    "policy": "spot-failover",
                    "db_url": f"sqlite:///{where}/heliotrope.db",
                    "clouds": {k: v for k, v in f.settings_doc().items() if k != "policy"},
                }
            )
        )
        yield f


class Fleet:
    """The controller of the configured clouds world, on a fake clock, and its store."""

    def __init__(self, fakes: CloudFakes) -> None:
        self.clock = aligned_now()
        self.world = configured_world(
            load_settings(), clock=self.clock, access=fakes.access(sleep=self.clock.sleep)
        )
        self.store: StateStore = open_store(self.world.db_url(), clock=self.clock)
        self.store.submit(parse_jobs(job_doc(), trace_start=self.clock.now()))
        self.live: LiveController = live_controller(self.world, self.store)

    def tick(self) -> list[EventKind]:
        self.clock.advance(TICK_S)
        return [e.kind for e in self.live.tick()]

    def instance(self) -> str:
        row = self.store.load()[0].rows[JOB]
        assert row.instance_id
        return row.instance_id

    def offer_store(self, offer_id: str) -> CheckpointStore:
        [offer] = [o for o in self.world.offers if o.id == offer_id]
        return CheckpointStore(self.world.store_uri(offer), durable=False)


def test_logs_print_the_console_of_the_jobs_instance(fakes: CloudFakes) -> None:
    fleet = Fleet(fakes)
    with pytest.raises(InputError, match="has not run yet"):
        logs(JOB, print)
    with pytest.raises(InputError, match="no-such-job"):
        logs("no-such-job", print)

    assert EventKind.LAUNCHED in [e.kind for e in fleet.live.tick()]
    aws_id = fleet.instance()
    assert aws_id.startswith("i-")
    got: list[str] = []
    fakes.hooks.on("ec2:GetConsoleOutput", console(BOOT))
    assert logs(JOB, got.append) == len(BOOT)
    assert got == [BOOT]
    [read] = fakes.aws_ops("ec2:GetConsoleOutput")
    assert read["InstanceId"] == aws_id and read["Latest"] is True


@pytest.mark.timeout(180)
def test_follow_prints_what_is_new_across_a_move_from_aws_to_gcp(fakes: CloudFakes) -> None:
    """The job starts on AWS; its console grows; AWS reclaims it and it moves to GCP, whose
    serial port grows too; then it finishes. `--follow` prints each new part once, says
    when the job changed instances, and ends when the job is done (its GCP instance, and
    with it the console, is deleted then)."""
    fleet = Fleet(fakes)
    assert EventKind.LAUNCHED in [e.kind for e in fleet.live.tick()]
    aws_id = fleet.instance()
    aws_text = [BOOT]

    def aws_console(params: dict[str, Any]) -> dict[str, Any]:
        return console("".join(aws_text))(params)  # the text so far

    fakes.hooks.on("ec2:GetConsoleOutput", aws_console)
    gcp: dict[str, Any] = {}

    def grow_aws() -> None:
        aws_text.append("step 2 loss 2.10\n")

    def move_to_gcp() -> None:
        aws_text.append("step 3 (never printed: the job moved on)\n")
        ref = fleet.offer_store(AWS_SPOT_L4).write(
            JOB, STEP, {"model.pt": b"w" * 1000}, now_s=fleet.clock.now().timestamp()
        )
        request = fakes.raw.tags(aws_id)["heliotrope:request"]
        fakes.raw.terminate(aws_id)
        fakes.answer_spot_reclaimed(aws_id, job_id=JOB, request_id=request)
        for _ in range(10):
            fleet.tick()
            row = fleet.store.load()[0].rows[JOB]
            if row.instance_id and row.instance_id != aws_id and not fleet.store.open_migrations():
                break
        gcp_id = fleet.instance()
        zone, name = gcp_id.split("/")
        gcp.update(id=gcp_id, key=(zone, name))
        assert fleet.offer_store(GCP_SPOT_L4).latest(JOB) is not None and ref.step == STEP

    def grow_gcp() -> None:
        assert isinstance(fakes.compute, FakeCompute)
        zone, name = gcp["key"]
        sample = serial_body(fakes.compute.project, zone, name)["contents"]
        fakes.compute.serial[gcp["key"]] = sample + "restored step 40\nstep 41 loss 1.98\n"
        gcp["printed"] = sample

    def finish() -> None:
        for _ in range(40):
            if fleet.store.load()[0].rows[JOB].phase == Phase.DONE:
                return
            fleet.tick()
        raise AssertionError("the job did not finish")

    # What happens after each thing `logs` writes (the writes are synchronous).
    script: list[Callable[[], None]] = [grow_aws, move_to_gcp, lambda: None, grow_gcp, finish]
    got: list[str] = []

    def write(text: str) -> None:
        got.append(text)
        if script:
            script.pop(0)()

    written = logs(JOB, write, follow=True, poll_s=0.01, max_s=120)

    assert script == []
    gcp_id = gcp["id"]
    assert got == [
        BOOT,
        "step 2 loss 2.10\n",
        f"--- {JOB}: now on instance {gcp_id} ---\n",
        gcp["printed"],
        "restored step 40\nstep 41 loss 1.98\n",
    ]
    assert written == sum(len(t.encode()) for t in got if not t.startswith("---"))
    assert fleet.store.load()[0].rows[JOB].phase == Phase.DONE
    assert fakes.compute.instances == {}  # the job's GCP instance went when it finished
    reads = fakes.gcp_ops(SERIAL_API)
    assert reads and all(
        c.path.endswith(f"/instances/{gcp_id.split('/')[1]}/serialPort") for c in reads
    )
    assert {c["InstanceId"] for c in fakes.aws_ops("ec2:GetConsoleOutput")} == {aws_id}


def test_the_router_reads_only_what_an_adapter_owns(fakes: CloudFakes) -> None:
    """A fresh `MultiProvider` (the CLI's) learns whose an id is; a gone instance, which no
    adapter lists any more, is still read by the adapter it belongs to; an id nobody owns
    reads nothing anywhere."""
    fleet = Fleet(fakes)
    fleet.live.tick()
    aws_id = fleet.instance()
    fakes.hooks.on("ec2:GetConsoleOutput", console(BOOT))

    def fresh() -> MultiProvider:
        multi = configured_world().provider
        assert isinstance(multi, MultiProvider) and Capability.LOGS in multi.capabilities()
        return multi

    assert fresh().console_output(aws_id) == BOOT
    fakes.raw.terminate(aws_id)  # still described (terminated) for a while, as on EC2
    assert fresh().console_output(aws_id) == BOOT
    foreign = fakes.raw.run(tags={"heliotrope:cluster": "someone-else"}, instance_type="g6.xlarge")[
        0
    ]
    before = len(fakes.aws_ops("ec2:GetConsoleOutput"))
    for instance_id in (foreign, "us-central1-a/hel-0123456789abcdef0123", "nonsense"):
        with pytest.raises(InputError, match="an instance of this cluster on aws, gcp"):
            fresh().console_output(instance_id)
    assert len(fakes.aws_ops("ec2:GetConsoleOutput")) == before
    assert fakes.gcp_ops(SERIAL_API) == []


def test_a_world_whose_providers_read_no_console_says_where_to_look(
    fakes: CloudFakes, tmp_path: Path
) -> None:
    """Providers without `Capability.LOGS` (here a local one behind the router, which is not
    the local world): the InputError names the cloud tools, as before."""
    import dataclasses

    fleet = Fleet(fakes)
    fleet.live.tick()
    offers = fleet.world.offers[:1]
    local = LocalProvider(
        tmp_path / "local",
        cluster=CLUSTER,
        offers=offers,
        capacity={o.region: 1 for o in offers},
        clock=fleet.clock,
    )
    world: World = dataclasses.replace(fleet.world, provider=MultiProvider([local]))
    assert world.local is None and with_logs(world.provider) is None
    with pytest.raises(InputError, match=r"get-console-output.*get-serial-port-output"):
        _log_tail(world, fleet.store, JOB)


def test_poll_defaults() -> None:
    assert LOCAL_POLL_S < CLOUD_POLL_S  # a console read is an API call


@pytest.mark.parametrize(
    ("seen", "text", "new"),
    [
        ("", "boot\n", "boot\n"),
        ("boot\n", "boot\nstep 1\n", "step 1\n"),  # cumulative: the suffix
        ("boot\nstep 1\n", "boot\nstep 1\n", ""),  # nothing new
        ("boot\nstep 1\n", "boot\n", ""),  # a stale read inside the last one
        # the cloud keeps a window: the start fell off, the overlap is found
        ("a" * 300 + "B" * 300, "B" * 300 + "step 9\n", "step 9\n"),
        ("x1\n" * 200 + "y\n", "x1\n" * 150 + "y\nz\n", "z\n"),  # repeated lines
        ("old text\n" * 10, "after a reboot\n", "after a reboot\n"),  # no overlap: all new
    ],
)
def test_console_suffix(seen: str, text: str, new: str) -> None:
    assert console_suffix(seen, text) == new


def test_console_suffix_as_a_64_kb_window_slides() -> None:
    console_text = "".join(f"line {i}\n" for i in range(20_000))  # 228 KB
    window = 64 * 1024

    def read(upto: int) -> str:  # what EC2 returns when the console is `upto` long
        return console_text[:upto][-window:]

    assert console_suffix(read(100_000), read(150_000)) == console_text[100_000:150_000]
    # polled too seldom: what fell out of the window between two reads is lost
    assert console_suffix(read(100_000), read(228_000)) == read(228_000)
