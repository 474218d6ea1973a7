"""What the signals poller writes is what the live policy decides on.

The live controller reads its signals through `StoreSignalView`, over the same state store
the poller (`orchestrator.signals.poll.poll`, what the signals DAG runs) appends to. Each
case runs twice from the same start: once with a changed polled value and once without, and
asserts that the decision changed because the polled value changed. The cloud is the
simulated provider (instances boot and run; the migration machine moves checkpoints between
two in-memory stores); carbon comes from a fake Electricity Maps server on 127.0.0.1
answering in the recorded response shape.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator.checkpoints import CheckpointStore
from orchestrator.clock import FakeClock
from orchestrator.live.controller import LiveController
from orchestrator.loop import LoopOptions
from orchestrator.model import (
    CostSettings,
    Event,
    EventKind,
    JobSpec,
    Market,
    Offer,
    SignalKind,
)
from orchestrator.replay.runner import build_grid
from orchestrator.signals.poll import poll
from orchestrator.signals.sources.keys import price_key, spot_key
from orchestrator.signals.view import OBSERVED_SOURCE, StoreSignalView, list_priors
from orchestrator.state import MemoryStateStore, SignalSample
from policies.registry import make_policy
from providers.base import Capability, InstanceId, InstanceInfo, InstanceState
from providers.sim import SimProvider
from tests.conftest import tiny_trace
from tests.signals.conftest import CREDS, NOW
from tests.signals.server import (
    FixtureServer,
    Reply,
    Request,
    em_zone_handler,
    recorded,
    serve,
)

CLUSTER = "signals"
TICK_S = 600
LOOKBACK_S = 6 * 3600.0  # the live view's history (a replay of its samples gets the same)
ZONES = {"gcp": "NL", "aws": "US-MIDA-PJM"}


class BootingSim(SimProvider):
    """The simulated cloud, with instances RUNNING once booted; `preempt` reclaims one, as
    the local provider does when the signals say a spot zone has no capacity left."""

    def capabilities(self) -> frozenset[Capability]:
        return super().capabilities() | {Capability.PREEMPT}

    def preempt(self, instance_id: InstanceId, notice_s: float = 2.0) -> bool:
        if instance_id not in self.list_instances(cluster=CLUSTER):
            return False
        self.terminate([instance_id], request_id=f"reclaim-{instance_id}")
        return True

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]:
        now = self._clock.now().timestamp()
        return {
            i: dataclasses.replace(info, state=InstanceState.RUNNING)
            if info.state is InstanceState.BOOTING and now >= info.ready_at_s
            else info
            for i, info in super().list_instances(cluster=cluster).items()
        }


@pytest.fixture
def server() -> Iterator[FixtureServer]:
    yield from serve()


def em_history(carbon: dict[str, float], now: datetime) -> object:
    """Electricity Maps `/carbon-intensity/history` in the recorded shape, every hour at the
    given intensity for the zone asked, its last point the hour `now` is in."""

    def answer(req: Request) -> Reply:
        body = json.loads(recorded("em_history_DE.json"))
        zone = req.q("zone")
        body["zone"] = zone
        last = max(_when(p["datetime"]) for p in body["history"])
        shift = now.replace(minute=0, second=0, microsecond=0) - last
        for point in body["history"]:
            point["zone"] = zone
            point["carbonIntensity"] = carbon[zone]
            for key in ("datetime", "updatedAt", "createdAt"):
                point[key] = (_when(point[key]) + shift).isoformat().replace("+00:00", "Z")
        return Reply(200, json.dumps(body).encode())

    return answer


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


@dataclasses.dataclass
class Run:
    store: MemoryStateStore
    clock: FakeClock
    cloud: BootingSim
    live: LiveController
    offers: tuple[Offer, ...]
    root: str

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.clock.advance(TICK_S)
            self.live.tick()

    def where(self) -> Offer | None:
        c = self.live.controller
        assert c is not None
        o = int(c.fleet.offer[0])
        return self.offers[o] if o >= 0 else None

    def events(self, kind: EventKind) -> list[str]:
        return [e.offer_id for e in self.store.history("j0") if e.kind is kind]


def make_run(
    policy: str,
    *,
    carbon_usd_per_tonne: float = 0.0,
    deadline_h: float = 200.0,
    markets: tuple[Market, ...] = (Market.ON_DEMAND, Market.SPOT),
    reclaim_spot: bool = False,
    cold_start_h: float = 0.1,
    cloud_type: type[BootingSim] | None = None,
) -> Run:
    job = JobSpec(
        id="j0",
        work_gpu_hours=40.0,
        gpus=1,
        start=NOW,
        deadline=NOW + timedelta(hours=deadline_h),
        checkpoint_size_gb=1.0,
        cold_start_h=cold_start_h,
        home_region="us-east-1",
        gpu_types=frozenset({"V100", "A100-80GB"}),
        throughput={"V100": 1.0, "A100-80GB": 1.0},
    )
    trace = tiny_trace()
    grid = build_grid(trace, [job], TICK_S, 0)
    offers = tuple(o for o in grid.offers if o.market in markets)
    clock = FakeClock(NOW)
    store = MemoryStateStore(clock=clock)
    store.submit([job])
    cloud = (cloud_type or BootingSim)(grid, clock, cluster=CLUSTER)
    view = StoreSignalView(
        store, offers, tick_s=TICK_S, priors=list_priors(offers, 4.0), lookback_s=LOOKBACK_S
    )
    root = f"memory://signals-{uuid.uuid4().hex[:8]}"
    live = LiveController(
        store=store,
        provider=cloud,
        policy=make_policy(policy),
        grid=view,
        clock=clock,
        store_uri=lambda o: f"{root}/{o.region}",
        options=LoopOptions(
            cluster=CLUSTER,
            reconcile=True,
            settings=CostSettings(carbon_usd_per_tonne=carbon_usd_per_tonne),
        ),
        capacity_backoff_s=1800.0,
        reclaim_spot=reclaim_spot,
    )
    return Run(store, clock, cloud, live, offers, root)


def poll_carbon(server: FixtureServer, run: Run, carbon: dict[str, float]) -> None:
    server.reset()
    server.add(r"/carbon-intensity/history$", handler=em_history(carbon, run.clock.now()))
    server.add(r"/carbon-intensity/forecast$", handler=em_zone_handler("em_forecast_DE.json"))
    report = poll(
        ["electricitymaps"],
        None,
        now=run.clock.now(),
        store=run.store,
        regions=[("aws", "us-east-1"), ("gcp", "europe-west4")],
        credentials=CREDS,
        base_urls={"electricitymaps": server.url},
        env={},
        sleep=lambda s: None,
    )
    assert report.result("electricitymaps").status == "ok", report.table()


def checkpoint(run: Run, offer: Offer, step: int) -> None:
    CheckpointStore(f"{run.root}/{offer.region}").write(
        "j0", step, {"model.bin": b"weights"}, now_s=run.clock.now().timestamp()
    )


def carbon_case(server: FixtureServer, nl_later: float, **run: Any) -> Run:
    run = make_run("carbon-greedy", markets=(Market.ON_DEMAND,), **run)
    poll_carbon(server, run, {"NL": 300.0, "US-MIDA-PJM": 400.0})
    run.live.tick()
    first = run.where()
    assert first is not None and first.cloud == "gcp", "lowest carbon first: NL"
    checkpoint(run, first, 10)
    run.clock.advance(TICK_S)
    poll_carbon(server, run, {"NL": nl_later, "US-MIDA-PJM": 400.0})
    run.live.tick()
    for _ in range(12):  # the poller keeps polling the same values
        run.clock.advance(TICK_S)
        poll_carbon(server, run, {"NL": nl_later, "US-MIDA-PJM": 400.0})
        run.live.tick()
    return run


def test_a_polled_carbon_rise_moves_the_job_and_the_same_run_without_it_stays(
    server: FixtureServer,
) -> None:
    moved = carbon_case(server, nl_later=900.0)
    planned = [
        e
        for e in moved.store.history("j0")
        if e.kind is EventKind.MIGRATION and "planned" in e.detail.lower()
    ]
    assert planned, [e.detail for e in moved.store.history("j0")]
    assert planned[0].offer_id.startswith("aws:")
    assert planned[0].data["src_g_co2_per_kwh"] == 900.0  # what was polled, not a scenario
    assert planned[0].data["dst_g_co2_per_kwh"] == 400.0
    assert "electricitymaps" in planned[0].detail
    # The move went through: checkpoint copied and verified, running at the destination.
    assert moved.where() is not None and moved.where().cloud == "aws"  # type: ignore[union-attr]
    assert not moved.store.open_migrations()

    stayed = carbon_case(server, nl_later=300.0)
    assert not [e for e in stayed.store.history("j0") if e.kind is EventKind.MIGRATION]
    assert stayed.where() is not None and stayed.where().cloud == "gcp"  # type: ignore[union-attr]


def price_samples(run: Run, usd: dict[str, float]) -> None:
    now = run.clock.now()
    run.store.append_samples(
        [
            SignalSample(
                time=now,
                key=price_key(o.cloud, o.region, "", o.instance_type, o.market.value),
                kind=SignalKind.PRICE,
                value=usd[o.cloud],
                unit="usd_per_hour",
                source="aws-spot-price" if o.cloud == "aws" else "gcp-billing",
                observed_at=now,
                valid_until=now + timedelta(hours=2),
            )
            for o in run.offers
            if o.market is Market.SPOT
        ]
    )


def price_case(spot_aws_later: float) -> Run:
    run = make_run("heliotrope", deadline_h=48.0)
    price_samples(run, {"aws": 0.9, "gcp": 1.6})
    run.live.tick()
    first = run.where()
    assert first is not None and first.cloud == "aws", "cheapest spot first"
    checkpoint(run, first, 10)
    for _ in range(6):
        run.clock.advance(TICK_S)
        price_samples(run, {"aws": spot_aws_later, "gcp": 1.6})
        run.live.tick()
    return run


def test_a_polled_spot_price_rise_moves_the_job_and_without_it_it_stays() -> None:
    moved = price_case(spot_aws_later=6.0)
    planned = [
        e
        for e in moved.store.history("j0")
        if e.kind is EventKind.MIGRATION and "planned" in e.detail.lower()
    ]
    assert planned and planned[0].offer_id.startswith("gcp:")
    assert planned[0].data["src_usd_per_hour"] == 6.0
    stayed = price_case(spot_aws_later=0.9)
    assert not [e for e in stayed.store.history("j0") if e.kind is EventKind.MIGRATION]


def test_stale_signals_hold_with_the_reason_and_accrue_all_the_same(server: FixtureServer) -> None:
    run = make_run("carbon-greedy", markets=(Market.ON_DEMAND,))
    poll_carbon(server, run, {"NL": 300.0, "US-MIDA-PJM": 400.0})
    run.live.tick()
    assert run.where() is not None
    usd0 = run.store.load()[0].rows["j0"].usd
    run.tick(3 * 6)  # three hours, the poller silent: every sample is past its max age
    held = [e for e in run.store.history("j0") if e.kind is EventKind.HELD]
    assert len(held) == 1 and "signals are stale" in held[0].detail
    assert run.store.load()[0].rows["j0"].usd > usd0  # the running job is still billed


def test_a_refused_spot_launch_backs_off_that_offer_through_the_store() -> None:
    run = make_run("spot-failover", markets=(Market.SPOT,))
    price_samples(run, {"aws": 0.9, "gcp": 1.6})
    aws = next(o for o in run.offers if o.cloud == "aws")
    # The cloud refuses: what the controller records is read back as no capacity there.
    run.live._observed(
        [
            dataclasses.replace(  # the event a refused launch produces
                __import__("orchestrator.model", fromlist=["Event"]).Event(
                    run.clock.now().timestamp(),
                    "j0",
                    EventKind.REJECTED,
                    aws.id,
                    "capacity: InsufficientInstanceCapacity",
                )
            )
        ]
    )
    (sample,) = [s for s in run.store.observed_samples(0, 2e9) if s.source == OBSERVED_SOURCE]
    assert sample.key == spot_key(aws.cloud, aws.region, aws.zone, aws.instance_type)
    run.live.tick()
    where = run.where()
    assert where is not None and where.cloud == "gcp", "the refused zone is skipped"
    frame = run.live.view.frame(run.clock.now().timestamp() + 3600)
    o = run.offers.index(aws)
    assert frame.grid.spot_capacity[frame.k, o] == 4.0  # after the backoff: the prior again


def test_an_instance_deleted_behind_the_controllers_back_is_a_preemption() -> None:
    run = make_run("spot-failover", markets=(Market.SPOT,))
    price_samples(run, {"aws": 0.9, "gcp": 1.6})
    run.live.tick()
    c = run.live.controller
    assert c is not None
    instance = c.instance_of[0]
    assert instance is not None
    checkpoint(run, run.offers[int(c.fleet.offer[0])], 5)
    run.clock.advance(3600)  # past the reconcile grace of a fresh launch
    run.cloud.terminate([instance], request_id="someone-else")  # not through Heliotrope
    run.live.tick()
    kinds = [e.kind for e in run.store.history("j0")]
    assert EventKind.PREEMPTED in kinds
    pre = next(e for e in run.store.history("j0") if e.kind is EventKind.PREEMPTED)
    assert "reconcile" in pre.detail
    run.tick(4)
    where = run.where()
    assert where is not None and where.cloud == "gcp", "relaunched from its checkpoint"


def test_one_shot_ticks_accrue_what_a_continuous_controller_accrues() -> None:
    def drive(one_shot: bool) -> tuple[float, float, float]:
        run = make_run("spot-failover", markets=(Market.SPOT,))
        for _ in range(30):
            price_samples(run, {"aws": 0.9, "gcp": 1.6})
            if one_shot:  # a new controller each tick, as Airflow's rebalance builds one
                run.live = LiveController(
                    store=run.store,
                    provider=run.cloud,
                    policy=make_policy("spot-failover"),
                    grid=StoreSignalView(
                        run.store,
                        run.offers,
                        tick_s=TICK_S,
                        priors=list_priors(run.offers, 4.0),
                        lookback_s=6 * 3600.0,
                    ),
                    clock=run.clock,
                    store_uri=run.live.store_uri,
                    options=run.live.options,
                )
            run.live.tick()
            run.clock.advance(900)
        row = run.store.load()[0].rows["j0"]
        return row.usd, row.kg_co2, row.progress_gpu_h

    continuous, one_shot = drive(False), drive(True)
    assert continuous[0] > 0 and continuous[2] > 0
    for a, b in zip(continuous, one_shot, strict=True):
        assert b == pytest.approx(a, rel=0.01)


def test_history_rows_are_the_same_cold_or_warm() -> None:
    """A view that has read every tick and a new one (a one-shot tick) see the same rows."""
    run = make_run("spot-failover", markets=(Market.SPOT,))
    warm = run.live.view
    for i in range(12):
        price_samples(run, {"aws": 0.9 + 0.1 * i, "gcp": 1.6})
        warm.frame(run.clock.now().timestamp())
        run.clock.advance(TICK_S)
    now = run.clock.now().timestamp()
    cold = StoreSignalView(
        run.store,
        run.offers,
        tick_s=TICK_S,
        priors=list_priors(run.offers, 4.0),
        lookback_s=6 * 3600.0,
    )
    a, b = warm.frame(now), cold.frame(now)
    assert (a.grid.usd_per_hour == b.grid.usd_per_hour).all()
    assert datetime.fromtimestamp(now, UTC) == a.grid.time_of(a.k)


def test_explain_says_which_signal_moved_the_job(server: FixtureServer) -> None:
    from orchestrator.live.commands import explain

    run = carbon_case(server, nl_later=900.0)
    text = "\n".join(explain(run.store, "j0"))
    assert "moved to aws:" in text
    assert "carbon rose 300 -> 900 g/kWh" in text
    assert "electricitymaps" in text
    assert "USD/h equivalent vs" in text and "cheapest per hour: " in text


def placement(run: Run, offer: Offer, score: float) -> None:
    now = run.clock.now()
    run.store.append_samples(
        [
            SignalSample(
                time=now,
                key=spot_key(offer.cloud, offer.region, offer.zone, offer.instance_type),
                kind=SignalKind.SPOT_AVAILABILITY,
                value=score,
                unit="placement_score",
                source="aws-placement-score",
                observed_at=now,
                valid_until=now + timedelta(hours=1),
            )
        ]
    )


def capacity_case(score_later: float) -> Run:
    run = make_run("spot-failover", markets=(Market.SPOT,), reclaim_spot=True)
    price_samples(run, {"aws": 0.9, "gcp": 1.6})
    aws = next(o for o in run.offers if o.cloud == "aws")
    placement(run, aws, 9)
    run.live.tick()
    assert run.where() == aws
    checkpoint(run, aws, 10)
    for _ in range(6):
        run.clock.advance(TICK_S)
        price_samples(run, {"aws": 0.9, "gcp": 1.6})
        placement(run, aws, score_later)
        run.live.tick()
    return run


def test_polled_spot_capacity_vanishing_moves_the_job_and_without_it_it_stays() -> None:
    gone = capacity_case(score_later=1)  # placement score 1: a request is unlikely to succeed
    assert gone.events(EventKind.PREEMPTED)[:1] == ["aws:us-east-1a:p3.2xlarge:spot"]
    where = gone.where()
    assert where is not None and where.cloud == "gcp"
    stayed = capacity_case(score_later=9)
    assert stayed.events(EventKind.PREEMPTED) == []
    assert stayed.where() is not None and stayed.where().cloud == "aws"  # type: ignore[union-attr]


def power_price(run: Run, zone: str, usd_per_mwh: float) -> None:
    now = run.clock.now()
    run.store.append_samples(
        [
            SignalSample(
                time=now.replace(minute=0, second=0, microsecond=0),
                key=zone,
                kind=SignalKind.POWER_PRICE,
                value=usd_per_mwh,
                unit="usd_per_mwh",
                source="pjm-prices",
                observed_at=now,
                valid_until=now + timedelta(hours=1),
            )
        ]
    )


def curtailment_case(server: FixtureServer, pjm_usd_per_mwh: float) -> Run:
    run = make_run("curtailment-threshold", markets=(Market.ON_DEMAND,))
    poll_carbon(server, run, {"NL": 60.0, "US-MIDA-PJM": 400.0})
    power_price(run, "US-MIDA-PJM", 35.0)
    run.live.tick()
    first = run.where()
    assert first is not None and first.cloud == "gcp", "clean first: NL at 60 g/kWh"
    checkpoint(run, first, 10)
    for _ in range(8):  # NL's grid gets dirtier; in PJM the day-ahead price is as given
        run.clock.advance(TICK_S)
        poll_carbon(server, run, {"NL": 300.0, "US-MIDA-PJM": 400.0})
        power_price(run, "US-MIDA-PJM", pjm_usd_per_mwh)
        run.live.tick()
    return run


def test_a_curtailment_window_opening_elsewhere_moves_the_job(server: FixtureServer) -> None:
    moved = curtailment_case(server, pjm_usd_per_mwh=-12.0)  # a negative day-ahead price
    planned = [
        e
        for e in moved.store.history("j0")
        if e.kind is EventKind.MIGRATION and "planned" in e.detail.lower()
    ]
    assert planned and planned[0].offer_id.startswith("aws:")
    assert planned[0].data["dst_curtailing"] == 1.0
    stayed = curtailment_case(server, pjm_usd_per_mwh=35.0)
    assert not [
        e
        for e in stayed.store.history("j0")
        if e.kind in (EventKind.MIGRATION, EventKind.LAUNCHED) and e.offer_id.startswith("aws:")
    ]


def placements(events: Iterable[Event]) -> list[tuple[float, str]]:
    """(time, offer) of each launch and preemption."""
    return [
        (e.time_s, e.offer_id)
        for e in events
        if e.kind in (EventKind.LAUNCHED, EventKind.PREEMPTED)
    ]


def replay_samples(
    run: Run, policy: str, *, history_s: float = LOOKBACK_S, spot_only: bool = False
) -> tuple[list[tuple[float, str]], datetime]:
    """The placements of `policy` replayed on the live run's polled samples, through the
    replay runner (`build_grid` with `history_s` of history, from the window's first tick),
    and the replay grid's first row."""
    from orchestrator.replay.runner import build_grid as replay_grid
    from orchestrator.replay.runner import first_tick, run_policy

    jobs = run.store.load()[0].jobs
    samples = run.store.observed_samples(0, 2e9)
    grid = replay_grid(tiny_trace(), jobs, TICK_S, 0, samples=samples, history_s=history_s)
    if spot_only:
        grid = grid.select([k for k, o in enumerate(grid.offers) if o.market is Market.SPOT])
    replayed = run_policy(
        make_policy(policy),
        jobs,
        grid,
        options=LoopOptions(cluster="replay"),
        start_tick=first_tick(jobs, grid),
    )
    return placements(replayed.events), grid.start


def test_a_replay_of_the_polled_samples_places_the_job_as_the_live_controller_did() -> None:
    """The live run's samples, replayed by `grid_from_samples` through the replay runner,
    give the same placements (the next test: a policy that reads the history before the
    job's start)."""
    run = make_run("spot-failover", markets=(Market.SPOT,), reclaim_spot=True)
    aws = next(o for o in run.offers if o.cloud == "aws")
    for i in range(18):
        price_samples(run, {"aws": 0.9 if i < 9 else 2.5, "gcp": 1.6})
        placement(run, aws, 9 if i not in (4, 5, 6) else 1)  # aws capacity gone for a while
        if i:
            run.clock.advance(TICK_S)
        run.live.tick()
        if i == 0:
            checkpoint(run, aws, 5)
    live = placements(run.store.history("j0"))
    assert len(live) >= 3, live

    again, _ = replay_samples(run, "spot-failover", spot_only=True)
    # The same placements, in the same order. Their times differ by design: the simulated
    # cloud reclaims a spot instance during the tick before the row that shows no capacity
    # (live, the controller learns it at the tick it is polled), and a replayed move is
    # immediate (its transfer is part of the cold start) while a live one takes the
    # migration machine's ticks (checkpoint, copy, verify, launch, restore).
    assert [o for _, o in again[: len(live)]] == [o for _, o in live], (live, again)


def test_a_replay_of_the_polled_samples_sees_the_history_the_live_policy_saw() -> None:
    """Six hours before the job starts, the polled placement scores show the cheaper aws
    spot offer flickering (available every other tick). Live, heliotrope reads that history
    in its frame and starts on gcp spot; the replay of the same samples gives it the same
    history before the window and starts it there too. Replayed without the history, it
    takes the flickering offer."""
    run = make_run("heliotrope", deadline_h=48.0)
    aws = next(o for o in run.offers if o.cloud == "aws" and o.market is Market.SPOT)
    gcp = next(o for o in run.offers if o.cloud == "gcp" and o.market is Market.SPOT)

    def poll_at(when: datetime, aws_up: bool) -> None:
        run.store.append_samples(
            [
                SignalSample(
                    time=when,
                    key=price_key(o.cloud, o.region, "", o.instance_type, o.market.value),
                    kind=SignalKind.PRICE,
                    value=0.9 if o is aws else 1.0,
                    unit="usd_per_hour",
                    source="aws-spot-price" if o is aws else "gcp-billing",
                    observed_at=when,
                    valid_until=when + timedelta(hours=2),
                )
                for o in (aws, gcp)
            ]
            + [
                SignalSample(
                    time=when,
                    key=spot_key(aws.cloud, aws.region, aws.zone, aws.instance_type),
                    kind=SignalKind.SPOT_AVAILABILITY,
                    value=9 if aws_up else 1,  # placement scores: likely / unlikely
                    unit="placement_score",
                    source="aws-placement-score",
                    observed_at=when,
                    valid_until=when + timedelta(hours=1),
                )
            ]
        )

    start = run.clock.now()
    for i in range(36, 0, -1):  # the six hours before the job's start
        poll_at(start - timedelta(seconds=i * TICK_S), aws_up=i % 2 == 0)
    for i in range(8):
        if i:
            run.clock.advance(TICK_S)
        poll_at(run.clock.now(), aws_up=i % 2 == 0)
        run.live.tick()
    until_s = run.clock.now().timestamp()
    live = placements(run.store.history("j0"))
    assert live and live[0] == (start.timestamp(), gcp.id), live

    replayed, first_row = replay_samples(run, "heliotrope")
    assert first_row == start - timedelta(seconds=LOOKBACK_S)  # the live frame's history
    assert [p for p in replayed if p[0] <= until_s] == live
    without, _ = replay_samples(run, "heliotrope", history_s=0.0)
    assert without[0] == (start.timestamp(), aws.id)


def test_signals_of_places_the_world_does_not_use_never_make_it_stale() -> None:
    run = make_run("spot-failover", markets=(Market.SPOT,))
    now = run.clock.now()
    run.store.append_samples(
        [
            SignalSample(
                time=now,
                key="GB",
                kind=SignalKind.CARBON,
                value=150.0,
                unit="g_co2_per_kwh",
                source="uk-carbon",
                observed_at=now - timedelta(hours=5),
            )
        ]
    )
    frame = run.live.view.frame(now.timestamp())
    assert frame.stale == ()
    assert frame.basis is not None and frame.basis.fallbacks()  # on priors, and it says so


def test_a_move_that_would_miss_the_deadline_holds_with_the_reason(server: FixtureServer) -> None:
    """The same carbon rise as above, but the job's slack is less than a new cold start:
    it stays, and its events say why."""
    held = carbon_case(server, nl_later=900.0, cold_start_h=2.0, deadline_h=42.1)
    assert not [e for e in held.store.history("j0") if e.kind is EventKind.MIGRATION]
    assert held.where() is not None and held.where().cloud == "gcp"  # type: ignore[union-attr]
    why = [e.detail for e in held.store.history("j0") if e.kind is EventKind.REJECTED]
    assert any("after the deadline" in d and "held where it is" in d for d in why), why
