"""The state store contract, run against the memory store, SQLite and PostgreSQL."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, timedelta

import numpy as np
import pandas as pd
import pytest

from orchestrator.errors import InputError, PermanentError, TransientError
from orchestrator.model import Event, EventKind, FleetState, Market, Offer, Phase, SignalKind
from orchestrator.state import (
    InstanceRecord,
    JobRow,
    MigrationRecord,
    SignalSample,
    StateStore,
    VersionConflict,
    fleet_from_rows,
    rows_from_fleet,
    samples_to_frame,
)
from tests.state.conftest import T0, Backend, make_job


def ev(t: float, job: str, kind: EventKind = EventKind.READY, **kw: object) -> Event:
    return Event(time_s=t, job_id=job, kind=kind, **kw)  # type: ignore[arg-type]


def snapshot(store: StateStore) -> tuple[object, ...]:
    """Everything a failed write must leave unchanged."""
    fleet, version = store.load()
    rows = {k: (r, r.version) for k, r in fleet.rows.items()}
    return (version, fleet.jobs, rows, fleet.migrations, store.events(limit=10_000))


# -- jobs -------------------------------------------------------------------------------------


def test_submit_load_round_trip(store: StateStore, backend: Backend) -> None:
    jobs = [make_job(i) for i in (3, 1, 2, 0)]
    jobs[1] = replace(jobs[1], command=("python", "train.py", "--lr=0.1"))
    jobs[2] = replace(jobs[2], throughput={"H100": 2.25, "L4": 0.5})
    store.submit(jobs[:2])
    backend.clock.advance(60)
    store.submit(jobs[2:])
    fleet, version = store.load()
    assert version == 0  # submitting does not bump the fleet version
    assert fleet.jobs == tuple(jobs)  # submission order, every field equal
    for got, want in zip(fleet.jobs, jobs, strict=True):
        assert got.start.utcoffset() == timedelta(0) and got.start.tzinfo is UTC
        assert got.deadline.tzinfo is UTC and got.deadline == want.deadline
        assert isinstance(got.gpu_types, frozenset)
        assert dict(got.throughput) == dict(want.throughput)
    assert fleet.submitted_at == {
        "job-003": T0,
        "job-001": T0,
        "job-002": T0 + timedelta(seconds=60),
        "job-000": T0 + timedelta(seconds=60),
    }
    assert all(at.tzinfo is UTC for at in fleet.submitted_at.values())
    assert fleet.status == dict.fromkeys(fleet.status, "active")
    assert fleet.rows == {j.id: JobRow() for j in jobs}
    assert {r.version for r in fleet.rows.values()} == {0}
    assert fleet.migrations == ()


def test_submit_duplicate_writes_nothing(store: StateStore) -> None:
    store.submit([make_job(1)])
    before = snapshot(store)
    with pytest.raises(InputError, match="job-001"):
        store.submit([make_job(2), make_job(1)])  # already submitted
    with pytest.raises(InputError, match="job-005"):
        store.submit([make_job(5), make_job(5)])  # twice in one batch
    assert snapshot(store) == before
    store.submit([])
    assert snapshot(store) == before


# -- commit -----------------------------------------------------------------------------------


def test_commit_writes_rows_and_events_and_bumps_versions(store: StateStore) -> None:
    store.submit([make_job(1), make_job(2)])
    _, v0 = store.load()
    row = JobRow(
        phase=Phase.RUNNING,
        offer_id="aws:us-east-1a:p3.2xlarge:spot",
        checkpoint_offer_id="aws:us-east-1a:p3.2xlarge:spot",
        progress_gpu_h=1.25,
        checkpointed_gpu_h=1.0,
        last_checkpoint_s=1.7e9 + 0.5,
        ready_at_s=math.nan,
        usd=3.5,
        kwh=2.0,
        kwh_curtailed=0.25,
        kg_co2=0.8,
        kg_co2_marginal=1.1,
        egress_usd=0.1,
        migrations=1,
        preemptions=2,
        launches=3,
        finished_at_s=None,
        preempted_offer_id="gcp:europe-west4-a:a2-ultragpu-1g:spot",
        instance_id="i-0abc",
    )
    v1 = store.commit(
        [ev(10.0, "job-001", EventKind.LAUNCHED)], {"job-001": row}, expected_version=v0
    )
    assert v1 == v0 + 1
    fleet, version = store.load()
    assert version == v1
    got = fleet.rows["job-001"]
    assert got == replace(row, ready_at_s=None)  # NaN comes back as None; == ignores version
    assert got.ready_at_s is None and got.finished_at_s is None
    assert got.version == 1 and fleet.rows["job-002"].version == 0
    v2 = store.commit(
        [], {"job-001": JobRow(phase=Phase.DONE, finished_at_s=99.0)}, expected_version=v1
    )
    fleet, _ = store.load()
    assert v2 == v1 + 1
    assert fleet.rows["job-001"] == JobRow(phase=Phase.DONE, finished_at_s=99.0)
    assert fleet.rows["job-001"].version == 2
    assert store.version() == v2


def test_stale_commit_conflicts_and_changes_nothing(backend: Backend) -> None:
    a, b = backend.open(), backend.open()
    a.submit([make_job(1)])
    _, va = a.load()
    _, vb = b.load()
    assert va == vb
    a.commit([ev(1.0, "job-001")], {"job-001": JobRow(progress_gpu_h=1.0)}, expected_version=va)
    before = snapshot(b)
    with pytest.raises(VersionConflict) as info:
        b.commit(
            [ev(2.0, "job-001", detail="stale")],
            {"job-001": JobRow(progress_gpu_h=9.0)},
            expected_version=vb,
        )
    assert isinstance(info.value, TransientError)
    assert (info.value.expected, info.value.actual) == (vb, va + 1)
    assert snapshot(b) == before
    assert b.load()[0].rows["job-001"].progress_gpu_h == 1.0
    # after reloading, the second writer goes through
    _, vb = b.load()
    assert b.commit([ev(2.0, "job-001")], {}, expected_version=vb) == vb + 1


def test_commit_for_unknown_job_writes_nothing(store: StateStore) -> None:
    store.submit([make_job(1)])
    v = store.version()
    before = snapshot(store)
    with pytest.raises(InputError, match="nope"):
        store.commit([ev(1.0, "job-001")], {"nope": JobRow()}, expected_version=v)
    with pytest.raises(InputError, match="nope"):
        store.commit(
            [ev(1.0, "job-001"), ev(1.0, "nope")], {"job-001": JobRow(usd=1.0)}, expected_version=v
        )
    assert snapshot(store) == before


# -- events -----------------------------------------------------------------------------------


def test_history_and_event_paging(store: StateStore) -> None:
    store.submit([make_job(1), make_job(2)])
    v = store.version()
    first = [
        ev(
            5.0,
            "job-001",
            EventKind.LAUNCHED,
            offer_id="o1",
            instance_id="i-1",
            data={"ready_at_s": 6.0, "egress_usd": 0.0},
        ),
        ev(1.0, "job-002", EventKind.REJECTED, detail="no capacity"),
        ev(3.0, "job-001", EventKind.READY),
    ]  # order of commit, not of time_s
    v = store.commit(first, {}, expected_version=v)
    second = [
        ev(
            7.0,
            "job-001",
            EventKind.PREEMPTED,
            offer_id="o1",
            instance_id="i-1",
            detail="spot reclaimed",
            data={"lost_gpu_h": 0.5, "n": 2},
        )
    ]
    store.commit(second, {}, expected_version=v)
    assert store.history("job-001") == [first[0], first[2], second[0]]
    assert store.history("job-002") == [first[1]]
    page = store.events(limit=2)
    assert [e for _, e in page] == first[:2]
    ids = [i for i, _ in store.events()]
    assert ids == sorted(ids) and len(set(ids)) == 4
    rest = store.events(since_id=page[-1][0])
    assert [e for _, e in rest] == [first[2], second[0]]
    assert [e for _, e in store.events(job_id="job-001", since_id=ids[0])] == [first[2], second[0]]
    assert store.history("job-001")[2].data == {"lost_gpu_h": 0.5, "n": 2.0}
    with pytest.raises(InputError, match="ghost"):
        store.history("ghost")


def test_event_data_keeps_non_finite_numbers(store: StateStore) -> None:
    store.submit([make_job(1)])
    data = {"nan": math.nan, "inf": math.inf, "neg": -math.inf, "x": 1.5}
    store.commit([ev(1.0, "job-001", data=data)], {}, expected_version=0)
    (got,) = store.history("job-001")
    assert math.isnan(got.data["nan"])
    assert {k: v for k, v in got.data.items() if k != "nan"} == {
        "inf": math.inf,
        "neg": -math.inf,
        "x": 1.5,
    }


# -- instances and migrations -----------------------------------------------------------------


def inst(i: str, request: str, state: str = "running", **kw: object) -> InstanceRecord:
    values: dict[str, object] = dict(
        id=i,
        provider="local",
        cluster="c1",
        job_id="job-001",
        offer_id="local:r1::spot",
        state=state,
        launched_at=T0 + timedelta(minutes=int(i[-1])),
        request_id=request,
    )
    values.update(kw)
    return InstanceRecord(**values)  # type: ignore[arg-type]


def test_instances(store: StateStore) -> None:
    store.submit([make_job(1), make_job(2)])
    store.record_instance(inst("i-2", "r-2", job_id="job-002"))
    store.record_instance(inst("i-1", "r-1"))
    store.record_instance(inst("i-3", "r-3", cluster="other", job_id=None))
    store.record_instance(inst("i-1", "r-1", state="terminated"))  # update by id
    assert store.instances("c1") == [
        inst("i-1", "r-1", state="terminated"),
        inst("i-2", "r-2", job_id="job-002"),
    ]
    assert store.instances("c1", job_id="job-002") == [inst("i-2", "r-2", job_id="job-002")]
    assert store.instances("other")[0].launched_at.tzinfo is UTC
    with pytest.raises(PermanentError, match="r-1"):
        store.record_instance(inst("i-9", "r-1"))  # one request, two instances
    with pytest.raises(PermanentError):
        store.record_instance(inst("i-1", "r-7"))  # one instance, two requests
    with pytest.raises(InputError, match="ghost"):
        store.record_instance(inst("i-8", "r-8", job_id="ghost"))
    assert len(store.instances("c1")) == 2


def mig(i: str, job: str, phase: str, started: float = 1.0, **kw: object) -> MigrationRecord:
    values: dict[str, object] = dict(
        id=i,
        job_id=job,
        phase=phase,
        src_offer_id="a",
        dst_offer_id="b",
        request_id=f"req-{i}",
        started_s=started,
        updated_s=started,
    )
    values.update(kw)
    return MigrationRecord(**values)  # type: ignore[arg-type]


def test_migrations(store: StateStore) -> None:
    store.submit([make_job(1), make_job(2)])
    store.save_migration(mig("m1", "job-001", "planned", 5.0, src_offer_id=None))
    store.save_migration(mig("m2", "job-002", "copying", 2.0, checkpoint_uri="file:///ck"))
    assert [m.id for m in store.open_migrations()] == ["m2", "m1"]  # by start time
    assert store.open_migrations("job-001") == [
        mig("m1", "job-001", "planned", 5.0, src_offer_id=None)
    ]
    with pytest.raises(VersionConflict, match="m1"):
        store.save_migration(mig("m3", "job-001", "planned"))  # one open migration per job
    store.save_migration(mig("m1", "job-001", "FAILED", 5.0, error="capacity"))
    store.save_migration(mig("m3", "job-001", "planned", 6.0))  # now allowed
    assert [m.id for m in store.open_migrations()] == ["m2", "m3"]
    with pytest.raises(InputError, match="ghost"):
        store.save_migration(mig("m4", "ghost", "planned"))
    # commit carries migrations atomically, with the same rules
    v = store.version()
    v = store.commit([], {}, expected_version=v, migrations=[mig("m2", "job-002", "done", 2.0)])
    assert [m.id for m in store.load()[0].migrations] == ["m3"]
    before = snapshot(store)
    with pytest.raises(VersionConflict):
        store.commit(
            [ev(1.0, "job-001")],
            {},
            expected_version=v,
            migrations=[mig("m5", "job-001", "planned")],
        )
    assert snapshot(store) == before


def test_one_commit_closes_a_migration_and_opens_the_next(store: StateStore) -> None:
    """Closing a job's migration and opening its next one in one batch is no conflict,
    whichever order the batch lists them in; a second open one still is."""
    store.submit([make_job(1)])
    store.save_migration(mig("m1", "job-001", "copying", 1.0))
    v = store.commit(
        [ev(2.0, "job-001")],
        {},
        expected_version=store.version(),
        migrations=[mig("m1", "job-001", "done", 1.0), mig("m2", "job-001", "planned", 2.0)],
    )
    assert [m.id for m in store.open_migrations("job-001")] == ["m2"]
    v = store.commit(
        [],
        {},
        expected_version=v,  # the new one listed first
        migrations=[
            mig("m3", "job-001", "planned", 3.0),
            mig("m2", "job-001", "failed", 2.0, error="capacity"),
        ],
    )
    assert [m.id for m in store.load()[0].migrations] == ["m3"]
    before = snapshot(store)
    with pytest.raises(VersionConflict, match="m3"):  # m3 stays open: m4 conflicts
        store.commit(
            [],
            {},
            expected_version=v,
            migrations=[mig("m2", "job-001", "done", 2.0), mig("m4", "job-001", "planned", 4.0)],
        )
    assert snapshot(store) == before


# -- claims -----------------------------------------------------------------------------------


def test_claim_jobs(backend: Backend) -> None:
    a, b = backend.open(), backend.open()
    a.submit([make_job(i) for i in range(5)])
    a.commit([], {"job-000": JobRow(phase=Phase.DONE)}, expected_version=0)
    with a.claim_jobs(2) as first:
        assert first.job_ids == ("job-001", "job-002")  # unfinished, submission order
        with b.claim_jobs(2) as second:
            if backend.name == "sqlite":  # no row locks: claims may overlap
                assert second.job_ids == ("job-001", "job-002")
            else:  # SKIP LOCKED
                assert second.job_ids == ("job-003", "job-004")
        v = first.commit([ev(1.0, "job-001")], {"job-001": JobRow(usd=2.0)})
        with pytest.raises(PermanentError):
            first.commit([], {})
    assert v == 2 == a.version()
    row = a.load()[0].rows["job-001"]
    assert row == JobRow(usd=2.0) and row.version == 1
    with a.claim_jobs(10) as claim, pytest.raises(InputError, match="job-000"):
        claim.commit([ev(1.0, "job-000")], {})


def test_claim_commit_detects_a_changed_row(backend: Backend) -> None:
    if backend.name == "postgresql":
        pytest.skip("PostgreSQL locks claimed rows: another writer waits instead")
    store = backend.open()
    store.submit([make_job(1)])
    with store.claim_jobs(1) as claim:
        store.commit([], {"job-001": JobRow(usd=1.0)}, expected_version=0)
        with pytest.raises(VersionConflict, match="job-001"):
            claim.commit([], {"job-001": JobRow(usd=5.0)})
    assert store.load()[0].rows["job-001"] == JobRow(usd=1.0)


# -- signal samples ---------------------------------------------------------------------------


def test_signal_samples(store: StateStore) -> None:
    hour = timedelta(hours=1)
    frame = pd.DataFrame(
        {
            "time": pd.to_datetime([T0, T0 + hour, T0, T0 + 2 * hour], utc=True),
            "key": ["NL", "NL", "DE", "NL"],
            "kind": ["carbon"] * 4,
            "value": [300.0, np.nan, 410.0, 280.0],
            "unit": ["g/kWh"] * 4,
            "source": ["electricitymaps"] * 4,
            "observed_at": pd.to_datetime([T0 + hour] * 4, utc=True),
            "valid_until": pd.to_datetime(pd.Series([T0 + 2 * hour, None, None, None]), utc=True),
        }
    )
    store.append_samples(frame)
    store.append_samples(frame)  # the same samples again: skipped
    price = SignalSample(
        time=T0,
        key="aws:us-east-1a:p3.2xlarge:spot",
        kind=SignalKind.PRICE,
        value=0.92,
        unit="usd/h",
        source="aws",
        observed_at=T0,
    )
    store.append_samples([price])
    got = store.samples(
        SignalKind.CARBON, ["NL", "DE"], T0.timestamp(), (T0 + 2 * hour).timestamp()
    )  # end excluded
    assert [(s.key, s.time) for s in got] == [("DE", T0), ("NL", T0), ("NL", T0 + hour)]
    assert got[0].value == 410.0 and math.isnan(got[2].value)
    assert got[1].valid_until == T0 + 2 * hour and got[0].valid_until is None
    assert all(s.time.tzinfo is UTC and s.observed_at.tzinfo is UTC for s in got)
    assert len(store.samples(SignalKind.CARBON, None, 0, 2e9)) == 4
    assert store.samples(SignalKind.CARBON, ["NL"], 0, 2e9)[-1].value == 280.0
    assert store.samples(SignalKind.PRICE, None, 0, 2e9) == [price]
    out = samples_to_frame(got)
    assert list(out["key"]) == ["DE", "NL", "NL"] and str(out["time"].dt.tz) == "UTC"
    with pytest.raises(InputError, match="kind"):
        store.append_samples([{**frame.iloc[0].to_dict(), "kind": "weather"}])


# -- fleet conversions (pure) -----------------------------------------------------------------


def test_rows_fleet_round_trip() -> None:
    offers = [
        Offer(
            id=f"o{k}",
            cloud="aws",
            region="r",
            zone="z",
            instance_type="t",
            gpu_type="V100",
            gpu_count=1,
            market=Market.SPOT,
            grid_zone="g",
            power_kw=0.5,
            pue=1.1,
        )
        for k in range(3)
    ]
    jobs = [make_job(i) for i in range(3)]
    fleet = FleetState.empty(3)
    fleet.phase[1] = Phase.RUNNING
    fleet.offer[1] = 2
    fleet.checkpoint_offer[1] = 2
    fleet.preempted_offer[1] = 0
    fleet.progress_gpu_h[1] = 4.5
    fleet.ready_at_s[1] = 1234.0
    fleet.launches[1] = 2
    rows = rows_from_fleet(jobs, fleet, offers, [None, "i-1", None])
    assert rows["job-001"] == JobRow(
        phase=Phase.RUNNING,
        offer_id="o2",
        checkpoint_offer_id="o2",
        preempted_offer_id="o0",
        progress_gpu_h=4.5,
        ready_at_s=1234.0,
        launches=2,
        instance_id="i-1",
    )
    assert rows["job-000"] == JobRow()
    back, instance_of = fleet_from_rows(jobs, rows, offers)
    for name in FleetState.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(back, name), getattr(fleet, name), err_msg=name)
    assert instance_of == [None, "i-1", None]
    assert list(rows_from_fleet(jobs, fleet, offers, [None] * 3, indices=[2])) == ["job-002"]
    with pytest.raises(InputError, match="o2"):
        fleet_from_rows(jobs, rows, offers[:2])
