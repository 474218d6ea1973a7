"""What the live CLI commands do: submit, list, show, status, events, migrate, preempt, run.

Every command works on the same home (`$HELIOTROPE_HOME`, default ~/.heliotrope) and the
world its config.yaml names (`configured_world`): the state store, the providers and their
offers, the signal view, the clock. Read commands print a table, or
JSON with `--json`. A manual migration goes through the same planner, executor and
migration machine as the policy's, as one controller tick whose policy is the request.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator import units
from orchestrator.costs import move_cost
from orchestrator.errors import HeliotropeError, InputError, TransientError
from orchestrator.jobs import load_jobs
from orchestrator.live.controller import CANCELLED, LiveController
from orchestrator.live.fleet_lock import FleetLock
from orchestrator.live.world import World, configured_world
from orchestrator.loop import Controller
from orchestrator.migration import Limits
from orchestrator.model import (
    Decision,
    Event,
    EventKind,
    Intent,
    JobSpec,
    Market,
    Offer,
    Phase,
)
from orchestrator.state import LoadedFleet, StateStore
from policies.base import Policy, Snapshot
from policies.registry import make_policy
from providers.base import LogsProvider, with_logs

MIGRATE_TRIES = 5  # ticks `migrate` tries while a running controller's commits win the race


def live_controller(
    world: World, store: StateStore, policy: Policy | None = None, *, locked: bool = False
) -> LiveController:
    """The live controller of `world`. `locked`: take the fleet lock each tick, so that of
    several running controllers (CLI, Airflow workers) one acts at a time; a one-off tick
    such as a manual `migrate` goes without, guarded by the store's version check."""
    settings = world.settings
    return LiveController(
        store=store,
        provider=world.provider,
        policy=policy or make_policy(settings.policy),
        grid=world.view(store),
        clock=world.clock,
        store_uri=world.store_uri,
        options=world.options(),
        reclaim_spot=world.local is not None,
        limits=scaled_limits(settings.speed) if settings.scenario else None,
        lock=FleetLock(world.db_url()) if locked else None,
        capacity_backoff_s=settings.capacity_backoff_s,
    )


def scaled_limits(speed: float) -> Limits:
    """Migration timeouts in scenario seconds. Real processes take real seconds to start,
    checkpoint and restore, so at a speed-up the timeouts stretch to keep a minute or so
    of wall time for each step."""
    base = Limits()
    scale = max(1.0, speed / 60.0)
    return Limits(
        checkpoint_timeout_s=base.checkpoint_timeout_s * scale,
        stop_grace_s=base.stop_grace_s * scale,
        copy_timeout_s=base.copy_timeout_s * scale,
        provision_timeout_s=base.provision_timeout_s * scale,
        restore_timeout_s=base.restore_timeout_s * scale,
        rollback_timeout_s=base.rollback_timeout_s * scale,
        max_attempts=base.max_attempts,
    )


def submit(path: Path) -> list[str]:
    """Submit the jobs of a jobs file to the configured world. Everything is checked before
    anything is written: a rejected file leaves a fresh home as it was (no database, no
    folders). Relative paths in a `command:` that name an existing file (from the directory
    you submit from) are made absolute, since an instance runs in a directory of its own."""
    offers, now_s = status_context()
    specs = load_jobs(path, trace_start=datetime.fromtimestamp(now_s, UTC))
    without = [s for s in specs if not s.command]
    if without:
        raise InputError(
            str(path),
            f"job {without[0].id!r} command",
            "the command a live job runs, e.g. [python, train.py]",
            fix="add `command:` to the entry (or to `defaults:`); "
            "docs/examples/local-jobs.yaml is a file for this machine",
        )
    if offers:  # the local world: its GPU types are known without building it
        types = sorted({o.gpu_type for o in offers})
        for spec in specs:
            if not any(spec.allows(t) for t in types):
                raise InputError(
                    str(path),
                    f"job {spec.id!r} gpu_types",
                    f"a GPU type this world offers: {', '.join(types)}",
                    got=", ".join(sorted(spec.gpu_types)),
                    fix="add one of those to gpu_types (docs/examples/local-jobs.yaml runs "
                    "on this machine), or use `world: clouds`",
                )
    specs = tuple(dataclasses.replace(s, command=_absolute(s.command)) for s in specs)
    store = configured_world().open_store()
    store.submit(specs)
    return [s.id for s in specs]


def _absolute(command: Sequence[str]) -> tuple[str, ...]:
    return tuple(
        str(Path(a).resolve())
        if a and not a.startswith("-") and not Path(a).is_absolute() and Path(a).is_file()
        else a
        for a in command
    )


def jobs_table(
    store: StateStore, *, offers: Sequence[Offer] = (), now_s: float | None = None
) -> list[dict[str, Any]]:
    """One row per job, times as ISO strings (UTC). With `offers` and `now_s` (what
    `status_context` reads), each row also says when the job should finish (`eta`: at the
    rate of the offer it runs on, or for a job without an instance its best offer plus a
    cold start) and whether that keeps its deadline (`deadline_status`: met | missed (+H h)
    for finished jobs; on track | at risk | missed for the others; cancelled)."""
    from orchestrator.costs import relative_throughput

    loaded, _ = store.load()
    by_id = {o.id: o for o in offers}
    out = []
    for job in loaded.jobs:
        row = loaded.rows.get(job.id)
        phase = Phase(row.phase).name.lower() if row is not None else "pending"
        cancelled = loaded.status.get(job.id) == CANCELLED
        deadline_s = job.deadline.timestamp()
        finished = row.finished_at_s if row is not None else None
        eta: float | None = None
        if finished is not None and not math.isnan(finished):
            eta = finished
            verdict = (
                "met"
                if finished <= deadline_s
                else f"missed (+{units.hours(finished - deadline_s):.1f} h)"
            )
        elif cancelled:
            verdict = "cancelled"
        elif now_s is None:
            verdict = "?"
        else:
            remaining = job.work_gpu_hours - (row.progress_gpu_h if row is not None else 0.0)
            here = by_id.get(row.offer_id or "") if row is not None else None
            rates = [
                relative_throughput(job, o.gpu_type) * job.gpus
                for o in ([here] if here is not None else offers)
                if job.allows(o.gpu_type)
            ]
            rate = max(rates, default=0.0)
            if rate > 0:
                start_s = max(now_s, job.start.timestamp())
                ready = row.ready_at_s if row is not None and here is not None else None
                wait_h = 0.0 if here is not None else job.cold_start_h
                if ready is not None and not math.isnan(ready) and ready > start_s:
                    start_s = ready
                eta = start_s + units.seconds(wait_h + remaining / rate)
            if now_s > deadline_s:
                verdict = "missed"
            elif eta is None:
                verdict = "?"
            else:
                verdict = "on track" if eta <= deadline_s else "at risk"
        held = loaded.held_until_s.get(job.id)
        out.append(
            {
                "job": job.id,
                "phase": "cancelled" if cancelled and phase != "done" else phase,
                "where": (row.offer_id or "") if row else "",
                "progress": round(row.progress_gpu_h / job.work_gpu_hours, 4) if row else 0.0,
                "usd": round(row.usd, 4) if row else 0.0,
                "kg_co2": round(row.kg_co2, 4) if row else 0.0,
                "migrations": row.migrations if row else 0,
                "preemptions": row.preemptions if row else 0,
                "eta": _iso(eta),
                "deadline": job.deadline.isoformat(),
                "deadline_status": verdict,
                "held_until": _iso(held)
                if held is not None and (math.isinf(held) or now_s is None or held > now_s)
                else None,
            }
        )
    return out


def status_context() -> tuple[tuple[Offer, ...], float]:
    """The configured world's offers and time, read without building the world (nothing
    is written: a read command on a fresh home leaves it as it was)."""
    from orchestrator.clock import SystemClock
    from orchestrator.live.world import load_settings, local_offers, read_origin

    settings = load_settings()
    now = SystemClock().now()
    if settings.scenario:
        now = settings.start + (now - (read_origin() or now)) * settings.speed
    offers = local_offers() if settings.world == "local" else ()
    return offers, now.timestamp()


def events_table(store: StateStore, job_id: str) -> list[dict[str, Any]]:
    return [
        {
            "time": _iso(e.time_s),
            "time_s": e.time_s,
            "kind": e.kind.value,
            "offer": e.offer_id,
            "instance": e.instance_id,
            "detail": e.detail,
        }
        for e in store.history(job_id)
    ]


@dataclasses.dataclass
class ManualMove:
    """A policy that asks for exactly one move: the CLI's request, through the same loop."""

    job: int
    offer: int | None  # None: stop it (`jobs cancel`)
    reason: str
    name: str = "manual"
    manual: bool = True  # not filtered by the operator's cancels and holds

    def __call__(self, snapshot: Snapshot) -> Decision:
        return Decision({self.job: Intent(self.offer, self.reason)})


def _job_to_move(live: LiveController, controller: Controller, job_id: str) -> int:
    """The index of `job_id`, if it may be moved now (submitted, not done, not cancelled,
    no move in progress); else the error that says which."""
    index = {job.id: j for j, job in enumerate(controller.jobs)}
    if job_id not in index:
        raise InputError(
            "",
            "JOB",
            "a submitted job: " + (", ".join(sorted(index)) or "(none)"),
            got=repr(job_id),
            fix="see `heliotrope jobs list`",
        )
    j = index[job_id]
    fleet = controller.fleet
    if fleet.phase[j] == Phase.DONE:
        raise InputError("", "JOB", "a job that is not done", got=f"{job_id} is done")
    if j in live.cancelled:
        raise InputError("", "JOB", "a job that is not cancelled", got=f"{job_id} is cancelled")
    if j in controller.busy:
        raise InputError(
            "",
            "JOB",
            "a job with no migration in progress",
            got=f"{job_id} is being migrated",
            fix="wait for it to finish",
        )
    return j


def migrate(
    job_id: str,
    region: str,
    *,
    market: str | None,
    dry_run: bool,
    force: bool,
    hold_h: float | None = None,
) -> dict[str, Any]:
    """Plan (and unless `dry_run`, start) a move of `job_id` to `region`. Refuses, naming
    why, a move that would miss the deadline or break the budget, unless `force`. With
    `hold_h`, the job is then held there that many hours (`hold`), so the policy does not
    move it straight back."""
    if hold_h is not None:
        _check_hours(hold_h, "--hold")
    world = configured_world()
    store = world.open_store()
    live = live_controller(world, store)
    live.reload()
    controller = live._sync()
    j = _job_to_move(live, controller, job_id)
    job = controller.jobs[j]
    fleet = controller.fleet
    now = world.clock.now()
    frame = controller.frame_at(now.timestamp())
    price = frame.grid.usd_per_hour[frame.k]
    offers = controller.offers
    current = int(fleet.offer[j])
    want = (
        Market(market) if market else (offers[current].market if current >= 0 else Market.ON_DEMAND)
    )
    candidates = [
        o
        for o, offer in enumerate(offers)
        if offer.region == region
        and offer.market is want
        and controller.fit.rate[j, o] > 0
        and not math.isnan(price[o])
    ]
    if not candidates:
        regions = sorted({o.region for o in offers})
        raise InputError(
            "",
            "--to",
            "a region with an offer this job may use: " + ", ".join(regions),
            got=f"{region} ({want.value})",
            fix="pick another region or --market",
        )
    dst = min(candidates, key=lambda o: price[o])
    offer = offers[dst]
    src_k = current if current >= 0 else int(fleet.checkpoint_offer[j])
    src = offers[src_k].location if src_k >= 0 else None
    move = move_cost(job, src, offer.location, controller.options.settings)
    rate = float(controller.fit.rate[j, dst])
    remaining = max(0.0, job.work_gpu_hours - float(fleet.progress_gpu_h[j]))
    hours = job.cold_start_h + move.transfer_h + remaining / rate
    finish = now.timestamp() + units.seconds(hours)
    usd_to_finish = (
        hours * float(price[dst]) * int(controller.fit.instances[j, dst]) + move.egress_usd
    )
    refusals = []
    if finish > job.deadline.timestamp():
        late_h = units.hours(finish - job.deadline.timestamp())
        refusals.append(f"would finish {late_h:.1f} h after the deadline")
    if job.budget_usd is not None and float(fleet.usd[j]) + usd_to_finish > job.budget_usd:
        refusals.append(
            f"would spend {float(fleet.usd[j]) + usd_to_finish:.2f} USD of a "
            f"{job.budget_usd:.2f} USD budget"
        )
    plan = {
        "job": job_id,
        "to": offer.id,
        "egress_usd": round(move.egress_usd, 4),
        "hours_to_finish": round(hours, 3),
        "usd_to_finish": round(usd_to_finish, 2),
        "refused": refusals,
        "started": False,
        "held_until": None,
    }
    if refusals and not force:
        raise InputError(
            "",
            "migrate",
            "a move that keeps the deadline and the budget",
            got="; ".join(refusals),
            fix="pick another region, or --force",
        )
    if dry_run:
        return plan
    _manual_tick(
        live, ManualMove(j, dst, f"manual: heliotrope migrate --to {region}"), f"migrate {job_id}"
    )
    plan["started"] = True
    if hold_h is not None:
        # The move is in progress (the policy cannot touch the job); held from here on.
        plan["held_until"] = _iso(hold(job_id, hold_h, store=store, now_s=now.timestamp()))
    return plan


def _manual_tick(live: LiveController, policy: ManualMove, what: str) -> None:
    """One controller tick whose policy is the operator's request. A running controller
    commits every tick, so ours may be refused (VersionConflict: nothing of it was
    written); then tick again from what the store holds now."""
    live.policy = policy
    live.start_moves = False  # the plan is committed here; the running controller moves
    for _ in range(MIGRATE_TRIES):
        live.reload()  # with the manual policy, from the store
        refused = live.conflicts
        live.tick()
        if live.conflicts == refused:
            return
    raise TransientError(
        f"{what}: another controller committed first {MIGRATE_TRIES} times in a "
        "row; nothing was started, try again"
    )


def _check_hours(hours: float, name: str) -> None:
    if not (hours > 0 and math.isfinite(hours)):
        raise InputError(
            "",
            name,
            "a positive number of hours",
            got=hours,
            fix="e.g. --hold 6 (or `heliotrope jobs hold JOB` until released)",
        )


def _iso(s: float | None) -> str | None:
    if s is None:
        return None
    if math.isinf(s):
        return "until released"
    return datetime.fromtimestamp(round(s), UTC).isoformat()


def _known_job(loaded: LoadedFleet, job_id: str) -> int:
    for j, job in enumerate(loaded.jobs):
        if job.id == job_id:
            return j
    raise InputError(
        "", "JOB", "a submitted job", got=repr(job_id), fix="see `heliotrope jobs list`"
    )


def hold(
    job_id: str, hours: float | None, *, store: StateStore | None = None, now_s: float | None = None
) -> float:
    """Hold `job_id` where it runs for `hours` (None: until `release`): the policy's
    intents for it are ignored while it holds an instance. Returns until when (seconds)."""
    if hours is not None:
        _check_hours(hours, "--hours")
    if store is None or now_s is None:
        world = configured_world()
        store = store or world.open_store()
        now_s = world.clock.now().timestamp() if now_s is None else now_s
    loaded, _ = store.load()
    _known_job(loaded, job_id)
    row = loaded.rows.get(job_id)
    if row is not None and row.phase == Phase.DONE:
        raise InputError("", "JOB", "a job that is not done", got=f"{job_id} is done")
    if loaded.status.get(job_id) == CANCELLED:
        raise InputError("", "JOB", "a job that is not cancelled", got=f"{job_id} is cancelled")
    until = math.inf if hours is None else now_s + units.seconds(hours)
    store.set_control(job_id, held_until_s=until)
    return until


def release(job_id: str) -> bool:
    """End a hold; False when the job was not held."""
    store = configured_world().open_store()
    loaded, _ = store.load()
    _known_job(loaded, job_id)
    was = job_id in loaded.held_until_s
    store.set_control(job_id, held_until_s=None)
    return was


def cancel(job_id: str) -> dict[str, Any]:
    """Cancel a job: it is stopped through the provider (the job checkpoints on SIGTERM;
    its checkpoints stay where they are), ends `cancelled` and no controller places it
    again (the cancel is stored first, so a running controller that ticks in between
    stops it too)."""
    world = configured_world()
    store = world.open_store()
    loaded, _ = store.load()
    j = _known_job(loaded, job_id)
    row = loaded.rows.get(job_id)
    if loaded.status.get(job_id) == CANCELLED:
        raise InputError(
            "", "JOB", "a job that is not cancelled", got=f"{job_id} is cancelled already"
        )
    if row is not None and row.phase == Phase.DONE:
        raise InputError("", "JOB", "a job that is not done", got=f"{job_id} is done")
    if any(m.job_id == job_id for m in loaded.migrations):
        raise InputError(
            "",
            "JOB",
            "a job with no migration in progress",
            got=f"{job_id} is being migrated",
            fix="wait for the move to end (`heliotrope events JOB`), then cancel",
        )
    instance = row.instance_id if row is not None else None
    store.set_control(job_id, status=CANCELLED, held_until_s=None)
    live = live_controller(world, store)
    _manual_tick(live, ManualMove(j, None, "cancelled: heliotrope jobs cancel"), f"cancel {job_id}")
    after = store.load()[0].rows.get(job_id)
    return {
        "job": job_id,
        "stopped": instance,
        "checkpoint_at": (after.checkpoint_offer_id if after is not None else None),
        "progress": round(after.progress_gpu_h / loaded.jobs[j].work_gpu_hours, 4)
        if after is not None
        else 0.0,
    }


def preempt(job_id: str) -> str:
    world = configured_world()
    if world.local is None:
        raise InputError(
            "",
            "preempt",
            "a local world (world: local in config.yaml)",
            got=f"world: {world.settings.world}",
            fix="preempt is a local stand-in for a spot reclaim; on a cloud, "
            "stop the instance there or use `heliotrope migrate`",
        )
    store = world.open_store()
    loaded, _ = store.load()
    row = loaded.rows.get(job_id)
    if job_id not in {j.id for j in loaded.jobs}:
        raise InputError(
            "", "JOB", "a submitted job", got=repr(job_id), fix="see `heliotrope jobs list`"
        )
    if row is None or not row.instance_id:
        raise InputError("", "JOB", "a job that holds an instance", got=f"{job_id} holds none")
    if not world.local.preempt(row.instance_id, notice_s=2.0):
        raise InputError("", "JOB", "an instance this provider runs", got=row.instance_id)
    return row.instance_id


def run(
    *,
    once: bool,
    interval_s: float | None,
    until_done: bool,
    max_ticks: int | None = None,
    on_tick: Any = None,
) -> LiveController:
    world = configured_world()
    live = live_controller(world, world.open_store(), locked=True)
    try:
        live.run(
            once=once,
            interval_s=interval_s or world.settings.interval_s,
            until_done=until_done,
            max_ticks=max_ticks,
            on_tick=on_tick,
        )
    finally:
        if live.lock is not None:  # a standby may take over now, not when we are collected
            live.lock.release()
    return live


def signal_reason(d: Mapping[str, Any]) -> str:
    """What decided a launch or a move, in a few words, from its event data (the signals it
    was decided on, `orchestrator.loop`): the signal that makes up most of the gap in USD/h
    equivalent between where the job was (its running or checkpointed offer) and where it
    went; for a first launch, the signals there."""
    there = f"{d['dst_usd_per_hour']:.3f} USD/h, {d['dst_g_co2_per_kwh']:.0f} g/kWh" + (
        ", curtailing" if d.get("dst_curtailing") else ""
    )
    if "src_usd_per_hour" not in d:
        return there
    if d.get("src_spot_capacity", 1.0) == 0.0:
        return f"spot capacity gone where it was; {there}"
    d_price = d["src_usd_per_hour"] - d["dst_usd_per_hour"]
    d_equiv = d.get("src_usd_equiv_per_hour", math.nan) - d.get("dst_usd_equiv_per_hour", math.nan)
    d_carbon = d_equiv - d_price if math.isfinite(d_equiv) else 0.0
    price = f"price {d['src_usd_per_hour']:.3f} -> {d['dst_usd_per_hour']:.3f} USD/h"
    carbon = f"carbon {d['src_g_co2_per_kwh']:.0f} -> {d['dst_g_co2_per_kwh']:.0f} g/kWh"
    if abs(d_carbon) > abs(d_price):
        return f"{carbon} (and {price})"
    if abs(d_price) > 1e-9:
        return f"{price} (and {carbon})"
    return there


def explain(store: StateStore, job_id: str) -> list[str]:
    """Each placement decision of a job in words: where it went, why (the policy's reason),
    and the signals it was decided on; for a move, how the signals of the place it left
    changed since it went there (``carbon rose 300 -> 900 g/kWh``)."""
    from datetime import UTC, datetime

    if job_id not in {j.id for j in store.load()[0].jobs}:
        raise InputError(
            "", "JOB", "a submitted job", got=repr(job_id), fix="see `heliotrope jobs list`"
        )
    lines: list[str] = []
    last: dict[str, float] = {}
    for e in store.history(job_id):
        when = datetime.fromtimestamp(e.time_s, UTC).strftime("%Y-%m-%d %H:%M UTC")
        if e.kind.value == "held":
            lines.append(f"{when}  held: {e.detail}")
            continue
        if "dst_usd_per_hour" not in e.data:
            continue
        reason, _, signals = e.detail.partition(" | ")
        d = e.data
        verb = "moved to" if e.kind.value == "migration" else "launched on"
        text = [f"{when}  {verb} {e.offer_id}: {reason}"]
        carbon_price = d.get("carbon_usd_per_tonne", 0.0)
        there = (
            f"    there: {d['dst_usd_per_hour']:.3f} USD/h, "
            f"{d['dst_g_co2_per_kwh']:.0f} g/kWh"
            + (", curtailing" if d.get("dst_curtailing") else "")
        )
        if "dst_usd_equiv_per_hour" in d:
            there += f"; {d['dst_usd_equiv_per_hour']:.2f} USD/h equivalent"
            if "src_usd_equiv_per_hour" in d:
                there += f" vs {d['src_usd_equiv_per_hour']:.2f} where it was"
        text.append(there + f" at {carbon_price:g} USD/t")
        if signals:
            text.append(f"    from: {signals}")
        if "src_usd_per_hour" in d and last:
            changes = []
            for key, name, unit in (
                ("g_co2_per_kwh", "carbon", "g/kWh"),
                ("usd_per_hour", "price", "USD/h"),
            ):
                before, now = last.get(f"dst_{key}"), d.get(f"src_{key}")
                if before is not None and now is not None and abs(now - before) > 1e-9:
                    word = "rose" if now > before else "fell"
                    changes.append(f"{name} {word} {before:.3g} -> {now:.3g} {unit}")
            if d.get("src_spot_capacity", 1.0) == 0.0:
                changes.append("spot capacity gone")
            if changes:
                text.append("    where it was: " + "; ".join(changes))
        lines += text
        last = dict(d)
    return lines


# -- logs ----------------------------------------------------------------------------------

CLOUD_LOGS = (
    "on AWS: `aws ec2 get-console-output --instance-id ID`; on GCP: `gcloud "
    "compute instances get-serial-port-output NAME --zone ZONE` (the instance of "
    "each launch: `heliotrope events JOB`)"
)
LOCAL_POLL_S = 0.5  # `logs --follow`: how often a local stdout.log is read
CLOUD_POLL_S = 5.0  # ... and a cloud console (an API call each; clouds refresh it slowly)
OVERLAP_ANCHOR = 256  # characters of the last read looked for in the next (`console_suffix`)


def _log_instance(store: StateStore, job_id: str) -> str | None:
    """The job's current instance, else the last one it had."""
    loaded, _ = store.load()
    _known_job(loaded, job_id)
    row = loaded.rows.get(job_id)
    if row is not None and row.instance_id:
        return row.instance_id
    last = [e.instance_id for e in store.history(job_id) if e.instance_id]
    return last[-1] if last else None


def log_file(world: World, store: StateStore, job_id: str) -> tuple[str, Path] | None:
    """(instance, its stdout.log) of the job's current or last instance; None if it has
    not run. Only the local world keeps job output in files (`InputError` elsewhere; a
    clouds world whose provider reads consoles is read by `logs` through it)."""
    if world.local is None:
        raise InputError(
            "",
            "logs",
            "a local world (world: local in config.yaml), or providers that read "
            "instance consoles (aws, gcp)",
            got=f"world: {world.settings.world}, whose job output stays on the cloud",
            fix=CLOUD_LOGS,
        )
    instance = _log_instance(store, job_id)
    if instance is None:
        return None
    where = world.local.instance_dir(instance)
    return (instance, where / "stdout.log") if where is not None else None


def console_suffix(seen: str, text: str) -> str:
    """What a console read `text` adds to the last read `seen`. A console is cumulative,
    but a cloud keeps only its newest part (EC2: 64 KB; Compute Engine: 1 MB), so a read
    may have lost the start of the last one: the new text is what follows the longest end
    of `seen` that `text` begins with (found by the last `OVERLAP_ANCHOR` characters of
    `seen`). A read inside the last one adds nothing; one that shares no such end with it
    (the window moved past all of it, or the instance rebooted) is new as a whole."""
    if text.startswith(seen):
        return text[len(seen) :]
    if text in seen:
        return ""
    anchor = seen[-OVERLAP_ANCHOR:]
    end = len(text)
    while (at := text.rfind(anchor, 0, end)) >= 0:
        k = at + len(anchor)
        if seen.endswith(text[:k]):
            return text[k:]
        end = k - 1
    return text


class _Tail:
    """The output of one instance of the job, read as it grows: `read()` returns what is
    new since the last read; `drained()`, whether nothing is left to read."""

    def read(self) -> str:
        raise NotImplementedError

    def drained(self) -> bool:
        raise NotImplementedError


class _FileTail(_Tail):
    """A local instance's stdout.log, read from the last byte read."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def read(self) -> str:
        if not self.path.is_file():
            return ""
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        return chunk.decode("utf-8", errors="replace")

    def drained(self) -> bool:
        return _drained(self.path, self.offset)


class _ConsoleTail(_Tail):
    """A cloud instance's console (`Capability.LOGS`): each read is the whole text the
    cloud keeps, of which only what follows the last read is new (`console_suffix`)."""

    def __init__(self, provider: LogsProvider, instance: str) -> None:
        self.provider, self.instance, self.seen = provider, instance, ""

    def read(self) -> str:
        text = self.provider.console_output(self.instance)
        new = console_suffix(self.seen, text)
        self.seen = text
        return new

    def drained(self) -> bool:
        return True  # read once more after the job ended: nothing is known to be left


def _log_tail(world: World, store: StateStore, job_id: str) -> tuple[str, _Tail] | None:
    """(instance, its output) of the job's current or last instance; None if it has not
    run. The local world reads stdout.log files; a clouds world reads consoles through a
    provider with `Capability.LOGS`; any other raises `InputError` (see `log_file`)."""
    if world.local is None:
        reader = with_logs(world.provider)
        if reader is not None:
            instance = _log_instance(store, job_id)
            return (instance, _ConsoleTail(reader, instance)) if instance else None
    found = log_file(world, store, job_id)
    return (found[0], _FileTail(found[1])) if found is not None else None


def logs(
    job_id: str,
    write: Any,
    *,
    follow: bool = False,
    poll_s: float | None = None,
    max_s: float | None = None,
) -> int:
    """Write the job's output (`write(text)`): a local instance's stdout.log, a cloud
    instance's console (EC2 console output, GCE serial port 1). With `follow`, keep writing
    what it adds, across its later instances, until the job is done or cancelled (or `max_s`
    wall seconds, or Ctrl-C), reading every `poll_s` seconds (default: `LOCAL_POLL_S`, or
    `CLOUD_POLL_S` for a console). A console that cannot be read while following (the
    instance is gone, the cloud fails) is said once in a line and read again later; without
    `follow` the error is raised. Returns the bytes (UTF-8) written."""
    import time

    world = configured_world()
    store = world.open_store()
    cloud = world.local is None
    if poll_s is None:
        poll_s = CLOUD_POLL_S if cloud else LOCAL_POLL_S
    found = _log_tail(world, store, job_id)
    if found is None and not follow:
        raise InputError(
            "",
            "JOB",
            "a job that has been launched",
            got=f"{job_id} has not run yet",
            fix="see `heliotrope status`; or `logs --follow` to wait",
        )
    started = time.monotonic()
    written, current, tail = 0, None, None
    unreadable: set[str] = set()  # instances whose console failed (said once each)
    while True:
        over = follow and _logs_over(store, job_id)  # before the read: it gets the last text
        if found is not None:
            instance, fresh = found
            if instance != current:
                if current is not None:
                    write(f"--- {job_id}: now on instance {instance} ---\n")
                current, tail = instance, fresh
            assert tail is not None
            try:
                chunk = tail.read()
            except HeliotropeError as exc:
                if not follow:
                    raise
                if over:  # the job ended and its instance went with its console
                    return written
                if instance not in unreadable:
                    unreadable.add(instance)
                    write(f"--- {job_id}: cannot read the console of {instance}: {exc} ---\n")
                chunk = ""
            if chunk:
                write(chunk)
                written += len(chunk.encode("utf-8"))
        if not follow:
            return written
        if over and (tail is None or tail.drained()):  # never ran (cancelled): nothing
            return written
        if max_s is not None and time.monotonic() - started >= max_s:
            return written
        time.sleep(poll_s)
        found = _log_tail(world, store, job_id)


def _logs_over(store: StateStore, job_id: str) -> bool:
    """Whether the job is done, or cancelled and off its instance: `--follow` ends."""
    loaded, _ = store.load()
    row = loaded.rows.get(job_id)
    return (row is not None and row.phase == Phase.DONE) or (
        loaded.status.get(job_id) == CANCELLED and not (row and row.instance_id)
    )


def _drained(path: Path, offset: int) -> bool:
    return not path.is_file() or path.stat().st_size <= offset


# -- cost report ---------------------------------------------------------------------------


def cost_report(since: datetime | None = None) -> dict[str, Any]:
    """What the fleet spent and emitted since `since` (default: ever), per job and by
    region and market, against an on-demand baseline: each hour a job held an instance,
    priced at the on-demand price of the same instance type in the same region, by the
    signals as they are now (egress is the same for both).

    Built from the job's events, which carry its running totals: what accrued between two
    events is booked to the offer the job held in between (a launch sets it; a stop, a
    preemption or the finish clears it)."""
    from orchestrator.costs import JobOfferFit

    world = configured_world()
    store = world.open_store()
    loaded, _ = store.load()
    now_s = world.clock.now().timestamp()
    since_s = since.timestamp() if since is not None else -math.inf
    offers = {o.id: k for k, o in enumerate(world.offers)}
    fit = JobOfferFit.build(loaded.jobs, world.offers)
    try:
        frame = world.view(store).frame(now_s)
        price = frame.grid.usd_per_hour[frame.k]
    except TransientError:
        price = None
    od_of: dict[tuple[str, str], int] = {}
    for k, o in enumerate(world.offers):
        if o.market is Market.ON_DEMAND:
            od_of.setdefault((o.region, o.instance_type), k)

    places: dict[tuple[str, str], dict[str, float]] = {}
    at = _Pricing(tuple(world.offers), offers, od_of, price, fit)
    jobs: list[dict[str, Any]] = []
    for j, job in enumerate(loaded.jobs):
        row = loaded.rows.get(job.id)
        marks: list[tuple[float, float | None, float | None, Event | None]] = [
            (e.time_s, e.data.get("usd"), e.data.get("kg_co2"), e)
            for e in store.history(job.id)
            if "usd" in e.data
        ]
        if row is not None:  # the row: accrued until the last committed tick
            marks.append((loaded.accrued_until_s or now_s, row.usd, row.kg_co2, None))
        jobs.append(_job_costs(j, job, marks, since_s, at, places))
    fleet_usd = sum(r["usd"] for r in jobs)
    known = all(r["on_demand_usd"] is not None for r in jobs)
    fleet_od = sum(r["on_demand_usd"] or 0.0 for r in jobs)
    return {
        "since": since.isoformat() if since is not None else None,
        "until": datetime.fromtimestamp(now_s, UTC).isoformat(),
        "jobs": jobs,
        "by_place": [
            {
                "region": r,
                "market": m,
                "usd": round(v["usd"], 4),
                "kg_co2": round(v["kg_co2"], 4),
                "instance_hours": round(v["hours"], 3),
            }
            for (r, m), v in sorted(places.items())
        ],
        "fleet": {
            "usd": round(fleet_usd, 4),
            "kg_co2": round(sum(r["kg_co2"] for r in jobs), 4),
            "egress_usd": round(sum(r["egress_usd"] for r in jobs), 4),
            "on_demand_usd": round(fleet_od, 4) if known else None,
            "saved_pct": _saved(fleet_usd, fleet_od) if known else None,
        },
    }


@dataclasses.dataclass(frozen=True)
class _Pricing:
    """What `cost_report` prices an hour with: the offers, their index by id, the
    on-demand twin per (region, instance type), the prices now (None: unknown)."""

    offers: tuple[Offer, ...]
    index: dict[str, int]
    on_demand_of: dict[tuple[str, str], int]
    price: Any
    fit: Any


def _job_costs(
    j: int,
    job: JobSpec,
    marks: list[tuple[float, float | None, float | None, Event | None]],
    since_s: float,
    at: _Pricing,
    places: dict[tuple[str, str], dict[str, float]],
) -> dict[str, Any]:
    """One job's spend, emissions and on-demand baseline since `since_s`, from its running
    totals at each event (`marks`); what accrued between two marks is booked to the offer
    it held in between, in `places` too."""
    offers, od_of, price, fit = at.index, at.on_demand_of, at.price, at.fit
    usd = kg = egress = hours = od_usd = 0.0
    od_known = True
    where: str | None = None
    t, last_usd, last_kg = None, 0.0, 0.0
    for time_s, total_usd, total_kg, e in marks:
        d_usd, d_kg = float(total_usd or 0.0) - last_usd, float(total_kg or 0.0) - last_kg
        e_egress = (
            float(e.data.get("egress_usd", 0.0))
            if e is not None and e.kind is EventKind.LAUNCHED
            else 0.0
        )
        d_usd -= e_egress
        if t is not None and where is not None and time_s > t:
            share = max(0.0, min(1.0, (time_s - max(t, since_s)) / (time_s - t)))
            d_usd, d_kg = d_usd * share, d_kg * share
            h = units.hours(time_s - max(t, since_s)) if share > 0 else 0.0
            ko = offers.get(where)
            offer = at.offers[ko] if ko is not None else None
            key = (offer.region, offer.market.value) if offer is not None else (where, "?")
            place = places.setdefault(key, {"usd": 0.0, "kg_co2": 0.0, "hours": 0.0})
            place["usd"] += d_usd
            place["kg_co2"] += d_kg
            place["hours"] += max(h, 0.0)
            usd, kg, hours = usd + d_usd, kg + d_kg, hours + max(h, 0.0)
            od: int | None = od_of.get((offer.region, offer.instance_type)) if offer else None
            if od is None or price is None or math.isnan(price[od]) or ko is None:
                od_known = False
            else:
                od_usd += max(h, 0.0) * float(price[od]) * int(fit.instances[j, ko])
        if e is not None and time_s >= since_s:
            egress += e_egress
            usd += e_egress
            od_usd += e_egress
        if e is not None:
            if e.kind is EventKind.LAUNCHED:
                where = e.offer_id or None
            elif e.kind in (EventKind.TERMINATED, EventKind.PREEMPTED, EventKind.FINISHED):
                where = None
        t, last_usd, last_kg = time_s, float(total_usd or 0.0), float(total_kg or 0.0)
    return {
        "job": job.id,
        "usd": round(usd, 4),
        "kg_co2": round(kg, 4),
        "egress_usd": round(egress, 4),
        "instance_hours": round(hours, 3),
        "on_demand_usd": round(od_usd, 4) if od_known else None,
        "saved_pct": _saved(usd, od_usd) if od_known else None,
    }


def _saved(usd: float, baseline: float) -> float | None:
    return round(100.0 * (1.0 - usd / baseline), 1) if baseline > 0 else None
