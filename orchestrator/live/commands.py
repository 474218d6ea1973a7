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
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError, TransientError
from orchestrator.jobs import load_jobs
from orchestrator.live.controller import LiveController
from orchestrator.live.fleet_lock import FleetLock
from orchestrator.live.world import World, configured_world
from orchestrator.migration import Limits
from orchestrator.model import Decision, Intent, Market, Phase, Snapshot
from orchestrator.state import StateStore
from policies.base import Policy
from policies.costs import move_cost
from policies.registry import make_policy

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
    world = configured_world()
    specs = load_jobs(path, trace_start=world.clock.now())
    with_command = [s for s in specs if not s.command]
    if with_command:
        raise InputError(
            str(path),
            f"job {with_command[0].id!r} command",
            "the command a live job runs, e.g. [python, train.py]",
            fix="add `command:` to the entry (or to `defaults:`)",
        )
    store = world.open_store()
    store.submit(specs)
    return [s.id for s in specs]


def jobs_table(store: StateStore) -> list[dict[str, Any]]:
    loaded, _ = store.load()
    out = []
    for job in loaded.jobs:
        row = loaded.rows.get(job.id)
        phase = Phase(row.phase).name.lower() if row is not None else "pending"
        out.append(
            {
                "job": job.id,
                "phase": phase,
                "where": (row.offer_id or "") if row else "",
                "progress": round(row.progress_gpu_h / job.work_gpu_hours, 4) if row else 0.0,
                "usd": round(row.usd, 4) if row else 0.0,
                "kg_co2": round(row.kg_co2, 4) if row else 0.0,
                "migrations": row.migrations if row else 0,
                "preemptions": row.preemptions if row else 0,
                "deadline": job.deadline.isoformat(),
            }
        )
    return out


def events_table(store: StateStore, job_id: str) -> list[dict[str, Any]]:
    return [
        {
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
    offer: int
    reason: str
    name: str = "manual"

    def __call__(self, snapshot: Snapshot) -> Decision:
        return Decision({self.job: Intent(self.offer, self.reason)})


def migrate(
    job_id: str, region: str, *, market: str | None, dry_run: bool, force: bool
) -> dict[str, Any]:
    """Plan (and unless `dry_run`, start) a move of `job_id` to `region`. Refuses, naming
    why, a move that would miss the deadline or break the budget, unless `force`."""
    world = configured_world()
    store = world.open_store()
    live = live_controller(world, store)
    live.reload()
    controller = live._sync()
    index = {job.id: j for j, job in enumerate(controller.jobs)}
    if job_id not in index:
        raise InputError(
            "",
            "JOB",
            "a submitted job: " + ", ".join(sorted(index)) or "(none)",
            got=repr(job_id),
            fix="see `heliotrope jobs list`",
        )
    j = index[job_id]
    job = controller.jobs[j]
    fleet = controller.fleet
    if fleet.phase[j] == Phase.DONE:
        raise InputError("", "JOB", "a job that is not done", got=f"{job_id} is done")
    if j in controller.busy:
        raise InputError(
            "",
            "JOB",
            "a job with no migration in progress",
            got=f"{job_id} is being migrated",
            fix="wait for it to finish",
        )
    now = world.clock.now()
    frame = controller.frame_at(now.timestamp())
    price = frame.grid.usd_per_hour[frame.k]
    offers = controller.offers
    current = int(fleet.offer[j])
    want = (
        Market(market)
        if market
        else (offers[current].market if current >= 0 else Market.ON_DEMAND)
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
    finish = now.timestamp() + hours * 3600.0
    usd_to_finish = (
        hours * float(price[dst]) * int(controller.fit.instances[j, dst])
        + move.egress_usd
    )
    refusals = []
    if finish > job.deadline.timestamp():
        late_h = (finish - job.deadline.timestamp()) / 3600.0
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
    live.policy = ManualMove(j, dst, f"manual: heliotrope migrate --to {region}")
    # A running controller commits every tick, so ours may be refused (VersionConflict:
    # nothing of it was written). Then tick again from what the store holds now.
    for _ in range(MIGRATE_TRIES):
        live.reload()  # with the manual policy, from the store
        refused = live.conflicts
        live.tick()
        if live.conflicts == refused:
            plan["started"] = True
            return plan
    raise TransientError(
        f"migrate {job_id}: another controller committed first {MIGRATE_TRIES} times in a "
        "row; nothing was started, try again"
    )


def preempt(job_id: str) -> str:
    world = configured_world()
    if world.local is None:
        raise InputError("", "preempt", "a local world (world: local in config.yaml)",
                         got=f"world: {world.settings.world}",
                         fix="preempt is a local stand-in for a spot reclaim; on a cloud, "
                             "stop the instance there or use `heliotrope migrate`")
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
    live.run(
        once=once,
        interval_s=interval_s or world.settings.interval_s,
        until_done=until_done,
        max_ticks=max_ticks,
        on_tick=on_tick,
    )
    return live


def explain(store: StateStore, job_id: str) -> list[str]:
    """Each placement decision of a job in words: where it went, why (the policy's reason),
    and the signals it was decided on; for a move, how the signals of the place it left
    changed since it went there (``carbon rose 300 -> 900 g/kWh``)."""
    from datetime import UTC, datetime

    if job_id not in {j.id for j in store.load()[0].jobs}:
        raise InputError("", "JOB", "a submitted job", got=repr(job_id),
                         fix="see `heliotrope jobs list`")
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
        text.append(f"    there: {d['dst_usd_per_hour']:.3f} USD/h, "
                    f"{d['dst_g_co2_per_kwh']:.0f} g/kWh"
                    + (", curtailing" if d.get("dst_curtailing") else "")
                    + f", carbon priced at {carbon_price:g} USD/t")
        if signals:
            text.append(f"    from: {signals}")
        if "src_usd_per_hour" in d and last:
            changes = []
            for key, name, unit in (("g_co2_per_kwh", "carbon", "g/kWh"),
                                    ("usd_per_hour", "price", "USD/h")):
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
