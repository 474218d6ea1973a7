"""`heliotrope demo` (`make demo`): the live control plane end to end on this machine.

Three small language-model jobs (examples/train_lm.py) run as real processes in four local
"regions" that take the names, L4 machines and signals of four cloud regions in the
built-in scenario (prices, spot capacity, grid carbon), in scenario time at 300x (a
10-minute tick every two real seconds). The fleet prices carbon at 200 USD/t (about the US
EPA's 2023 social cost of carbon, 190 USD/t for 2020 emissions at a 2% discount rate).
On top of the scenario's own weather and spot outages, three events are scripted, each of a
size the traces show (`DEMO_EVENTS`, printed at the start): the cheap clean zone's spot
capacity is reclaimed for three hours, a wind lull puts coal on the margin in us-central1,
and a solar noon in europe-west4 curtails renewables.
The `heliotrope` policy places, holds and moves the jobs; every move checkpoints, copies and
verifies the checkpoint, and resumes; each line of the log says which signal decided.

Then it replays the same period: the same signals, the same realized spot capacity and the
same jobs, for heliotrope and the baselines, and compares heliotrope's replay with what the
live fleet did. The training steps run on a schedule of `STEP_TIME_S` of real time each,
so the live progress does not depend on how busy this machine is, and each local instance
is ready after the cold start the job declares (`emulate_startup`: 0.25 h, 3 s real at
300x, inside which the process starts, imports torch and restores), as the replay counts
it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator import units
from orchestrator.costs import objective_usd, relative_throughput
from orchestrator.live.commands import jobs_table, live_controller, signal_reason
from orchestrator.live.world import (
    LiveSettings,
    load_settings,
    local_world,
    restart_scenario_clock,
)
from orchestrator.model import Event, EventKind, JobSpec
from orchestrator.replay.report import format_table, summary
from orchestrator.replay.report.table import ranked_policies
from orchestrator.replay.runner import Replay
from orchestrator.replay.service import replay_loaded
from orchestrator.signals.events import GridEvent

REPO = Path(__file__).resolve().parents[2]
BASELINES = (
    "on-demand",
    "spot-failover",
    "uniform-progress",
    "carbon-greedy",
    "curtailment-threshold",
    "heliotrope",
)
SPEED = 300.0  # scenario seconds per real second
STEP_TIME_S = 0.5  # real seconds per training step: 150 s of scenario time at 300x
CARBON_USD_PER_TONNE = 200.0
# Hours from the scenario's start (2024-04-02 06:00 UTC). Sizes from the traces: AWS spot
# reclaims last hours (SkyNomad's availability traces: mean outage 1-4 h on the H100
# zones); MISO's average intensity reaches ~900 g/kWh on windless nights with coal on the
# margin (Siler-Evans et al. 2012); the Netherlands curtail solar at noon in spring with
# ~60 g/kWh on the grid.
DEMO_EVENTS: tuple[GridEvent, ...] = (
    GridEvent(
        kind="reclaim", zone="eu-north-1a", at_h=1.5, hours=3.0, note="AWS reclaims its spot"
    ),
    GridEvent(
        kind="carbon",
        region="us-central1",
        at_h=3.0,
        hours=8.0,
        g_per_kwh=900.0,
        note="wind lull, coal on the margin",
    ),
    GridEvent(
        kind="curtailment",
        region="europe-west4",
        at_h=5.0,
        hours=4.0,
        g_per_kwh=60.0,
        note="solar noon",
    ),
)


def demo_jobs(steps: int) -> dict[str, Any]:
    """The demo's jobs file: `steps` paced steps of training each (work in GPU-hours is
    what those steps take in scenario time on one L4)."""
    train = str(REPO / "examples" / "train_lm.py")
    command = [
        sys.executable,
        train,
        "--steps",
        str(steps),
        "--log-every",
        "2",
        "--every-steps",
        "2",
        "--step-time-s",
        str(STEP_TIME_S),
        "--corpus-bytes",
        "60000",
    ]
    base = {
        "gpus": 1,
        "gpu_types": ["L4"],
        "throughput": {"L4": 1.0},
        "cold_start_h": 0.25,
        "checkpoint_size_gb": 0.01,
        "checkpoint_interval_h": 0.1,
        "command": command,
    }
    work = round(units.hours(steps * STEP_TIME_S * SPEED), 3)
    start = LiveSettings().start
    return {
        "defaults": base,
        "jobs": [
            {
                "name": "lm-east",
                "work_gpu_hours": work,
                "start": start.isoformat(),
                "deadline_h": 30,
                "home_region": "us-east-1",
            },
            {
                "name": "lm-eu",
                "work_gpu_hours": work,
                "start": start.isoformat(),
                "deadline_h": 10,
                "home_region": "europe-west4",
            },
            {
                "name": "lm-central",
                "work_gpu_hours": work,
                "start": (start + timedelta(hours=1)).isoformat(),
                "deadline_h": 24,
                "home_region": "us-central1",
            },
        ],
    }


def demo_config() -> dict[str, Any]:
    """The demo home's config.yaml."""
    return {
        "signals": "scenario",
        "speed": SPEED,
        "days": 2,
        "carbon_usd_per_tonne": CARBON_USD_PER_TONNE,
        "emulate_startup": True,
        "events": [e.model_dump(exclude_none=True) for e in DEMO_EVENTS],
    }


def run_demo(out: Path, *, steps: int = 144) -> int:
    console = Console(width=None if Console().is_terminal else 140)
    live_home = out.resolve() / "live"
    if live_home.exists():
        shutil.rmtree(live_home)
    live_home.mkdir(parents=True)
    os.environ["HELIOTROPE_HOME"] = str(live_home)
    (live_home / "config.yaml").write_text(yaml.safe_dump(demo_config()))
    jobs_file = live_home / "jobs.yaml"
    jobs_file.write_text(yaml.safe_dump(demo_jobs(steps)))

    from orchestrator.live.commands import submit

    world = local_world(load_settings())
    ids = submit(jobs_file)
    console.print(
        f"[bold]Heliotrope live demo[/]: {len(ids)} jobs, 4 local regions, scenario time "
        f"x{world.settings.speed:g} from {world.settings.start:%a %H:%M}, carbon at "
        f"{world.settings.carbon_usd_per_tonne:g} USD/t, home {escape(str(live_home))}"
    )
    console.print("Scripted on the built-in scenario (besides its own weather and outages):")
    for event in sorted(world.settings.events, key=lambda e: e.at_h):
        when = world.settings.start.timestamp() + units.seconds(event.at_h)
        console.print(
            escape(f"  {_clock(when)}  {event.describe()}"), highlight=False, markup=False
        )
    store = world.open_store()
    live = live_controller(world, store)
    restart_scenario_clock(world)  # the first tick is the scenario's first

    def on_tick(controller: Any, events: list[Event]) -> None:
        for e in events:
            line = _log_line(e)
            if line:
                console.print(
                    escape(f"  {controller.clock.now():%a %H:%M}  {line}"), highlight=False
                )

    live.run(interval_s=world.settings.interval_s, until_done=True, max_ticks=2000, on_tick=on_tick)
    fleet = jobs_table(store)
    _print_fleet(console, fleet)

    loaded, _ = store.load()
    speed = measured_speed(store, loaded.jobs)
    console.print(
        "\n[bold]The same period, replayed[/]: the same signals, spot capacity and jobs, "
        "each at the speed it ran live ("
        + ", ".join(f"{k} {v:.2f}x" for k, v in speed.items())
        + " of its nominal steps after its cold start; this machine's load sets it)"
    )
    assert world.grid is not None  # signals: scenario
    done_replay = replay_loaded(
        _at_speed(loaded.jobs, speed),
        world.grid,
        BASELINES,
        out / "replay",
        carbon_usd_per_tonne=world.settings.carbon_usd_per_tonne,
        seed=world.settings.seed,
        config={"traces": "built-in scenario", "jobs": "demo"},
    )
    replay, results = done_replay.replay, done_replay.results
    console.print(format_table(results))
    console.print(summary(results), markup=False, highlight=False)
    _print_loss(console, replay, results)
    _print_why(console, store, ids)
    helio = next((r for r in replay.runs if r.policy == "heliotrope"), None)
    _print_agreement(
        console,
        store,
        results.get("policies", {}).get("heliotrope", {}),
        helio.events if helio is not None else (),
    )
    console.print(f"report: {done_replay.report}", markup=False)
    return 0 if all(r["phase"] == "done" for r in fleet) else 1


def _clock(when_s: float) -> str:
    from datetime import UTC, datetime

    return f"{datetime.fromtimestamp(when_s, UTC):%a %H:%M}"


def _log_line(e: Event) -> str | None:
    """One line of the demo's log for an event worth telling, with what decided it."""
    if e.kind is EventKind.MIGRATION and not e.detail.startswith("planned:"):
        return None  # the phases of a move: the plan says where and why
    if e.kind not in (
        EventKind.LAUNCHED,
        EventKind.PREEMPTED,
        EventKind.FINISHED,
        EventKind.MIGRATION,
        EventKind.HELD,
    ):
        return None
    verb = {EventKind.MIGRATION: "moves to", EventKind.LAUNCHED: "launched on"}.get(
        e.kind, e.kind.value
    )
    why = signal_reason(e.data) if "dst_usd_per_hour" in e.data else e.detail[:70]
    rule = e.detail.removeprefix("planned: ").split(" | ")[0]
    if rule.startswith("safety net"):  # the deadline decided, whatever the signals say
        why = f"{rule} (deadline); {why}"
    where = e.offer_id.removesuffix(":spot").removesuffix(":on_demand")
    market = "" if not e.offer_id else (" (spot)" if e.offer_id.endswith(":spot") else " (od)")
    return f"{e.job_id:10s} {verb:11s} {where}{market}: {why}"


AGREE_WITHIN = 0.05  # the replay's heliotrope row agrees with the live fleet within 5%


def live_totals(store: Any) -> dict[str, float]:
    """The live fleet's USD, kgCO2 and mean completion hours (of the jobs that finished)."""
    loaded, _ = store.load()
    usd = sum(r.usd for r in loaded.rows.values())
    kg = sum(r.kg_co2 for r in loaded.rows.values())
    done = [
        (loaded.rows[j.id].finished_at_s or math.nan) - j.start.timestamp()
        for j in loaded.jobs
        if loaded.rows.get(j.id) is not None and loaded.rows[j.id].finished_at_s is not None
    ]
    done = [d for d in done if not math.isnan(d)]
    return {
        "usd": usd,
        "kg_co2": kg,
        "mean_completion_h": units.hours(sum(done) / len(done)) if done else math.nan,
    }


def agreement(
    live: dict[str, float], replayed: dict[str, Any]
) -> list[tuple[str, float, float, float]]:
    """(metric, live, replay, relative difference) for USD, kgCO2 and mean completion."""
    rows = []
    for key in ("usd", "kg_co2", "mean_completion_h"):
        a, b = float(live.get(key, math.nan)), float(replayed.get(key) or math.nan)
        rel = abs(b - a) / abs(a) if a and not math.isnan(a) and not math.isnan(b) else math.nan
        rows.append((key, a, b, rel))
    return rows


def first_parting(live: Sequence[Event], replayed: Sequence[Event]) -> str | None:
    """Where the two runs part ways: the first launch (time to the minute, job, offer) one
    made and the other did not, and what the other did with that job next."""

    def launches(events: Sequence[Event]) -> set[tuple[int, str, str]]:
        return {
            (round(e.time_s / 60) * 60, e.job_id, e.offer_id)
            for e in events
            if e.kind is EventKind.LAUNCHED
        }

    mine, theirs = launches(live), launches(replayed)
    only = sorted(mine ^ theirs)
    if not only:
        return None
    t, job, offer = only[0]
    side, other, other_name = (
        ("the live run", theirs, "the replay")
        if (t, job, offer) in mine
        else ("the replay", mine, "the live run")
    )
    later = sorted((s, o) for s, j, o in other if j == job and s >= t)
    then = (
        f"{other_name} launched it at {_clock(later[0][0])} on {later[0][1]}"
        if later
        else f"{other_name} did not launch it again after that"
    )
    return f"They first part at {_clock(t)}: {side} launched {job} on {offer}; {then}."


def _print_agreement(
    console: Console,
    store: Any,
    replayed: dict[str, Any],
    replayed_events: Sequence[Event] = (),
) -> None:
    """Say whether the replay's heliotrope row agrees with what the live fleet did; when it
    does not, say so, by how much and where the two first part ways (never hidden)."""
    if not replayed:
        return
    rows = agreement(live_totals(store), replayed)
    table = Table(title="heliotrope: the live run against its replay", title_justify="left")
    for col in ("", "live", "replay", "difference"):
        table.add_column(col, justify="right" if col else "left")
    names = {"usd": "USD", "kg_co2": "kgCO2", "mean_completion_h": "mean completion h"}
    for key, a, b, rel in rows:
        table.add_row(
            names[key], f"{a:.3f}", f"{b:.3f}", "n/a" if math.isnan(rel) else f"{rel:.1%}"
        )
    console.print(table)
    off = [names[k] for k, _, _, rel in rows if math.isnan(rel) or rel > AGREE_WITHIN]
    if off:
        console.print(
            f"The replay does not agree with the live run within {AGREE_WITHIN:.0%} on "
            f"{', '.join(off)}. Both decide on the same ticks from the same signals, each job "
            "at the speed it ran live and after the same cold starts, but a live reclaim or "
            "move takes real time (the job checkpoints and leaves, the copy is made and "
            "verified): a step of progress more or less than the replay counts, and where "
            "the policy is close to a tie once one run decides differently the two part "
            "ways (compare `heliotrope explain JOB` with the replay's timeline.csv).",
            markup=False,
            highlight=False,
        )
        live_events = [e for job in store.load()[0].jobs for e in store.history(job.id)]
        parting = first_parting(live_events, replayed_events)
        if parting:
            console.print(parting, markup=False, highlight=False)
    else:
        console.print(
            f"The replay agrees with the live run within {AGREE_WITHIN:.0%}.", markup=False
        )


def _print_why(console: Console, store: Any, ids: list[str]) -> None:
    """Each job's placement decisions and the signals they were made on (`explain`)."""
    from orchestrator.live.commands import explain

    console.print("\n[bold]Why each job went where it did[/] (`heliotrope explain JOB`):")
    for job_id in ids:
        lines = explain(store, job_id)
        console.print(escape(f"{job_id}:"))
        for line in lines or ["  no placement decision recorded"]:
            if not line.startswith("    from:"):  # the alternatives: `heliotrope explain`
                console.print(escape("  " + line), highlight=False)


_ENDS = (EventKind.PREEMPTED, EventKind.FINISHED, EventKind.TERMINATED)


def measured_speed(store: Any, jobs: Sequence[JobSpec]) -> dict[str, float]:
    """Per job, its progress per hour of running as a share of its nominal rate: what the
    live processes really did. A launch runs from when the replay counts it running: its
    ready time, or its cold start after the launch when that is later (with
    `emulate_startup` the two are the same; a local instance without it is ready at once,
    and its process's own start-up is counted once, in the replay's cold start, not again
    as a slower speed)."""
    out: dict[str, float] = {}
    for job in jobs:
        ran_h = gained = 0.0
        start: tuple[float, float] | None = None
        cold_s = units.seconds(job.cold_start_h)
        for e in store.history(job.id):
            if e.kind is EventKind.LAUNCHED and "ready_at_s" in e.data:
                ready = max(float(e.data["ready_at_s"]), e.time_s + cold_s)
                start = (ready, float(e.data.get("progress_gpu_h", 0.0)))
            elif e.kind in _ENDS and start is not None:
                ran_h += units.hours(max(0.0, e.time_s - start[0]))
                gained += max(0.0, float(e.data.get("progress_gpu_h", 0.0)) - start[1])
                start = None
        nominal = max((relative_throughput(job, t) for t in job.gpu_types), default=1.0)
        rate = nominal * job.gpus
        out[job.id] = gained / ran_h / rate if ran_h > 0 and gained > 0 else 1.0
    return out


def _at_speed(jobs: Sequence[JobSpec], speed: dict[str, float]) -> tuple[JobSpec, ...]:
    """The jobs as they ran: each GPU type's throughput times the job's measured speed."""
    return tuple(
        dataclasses.replace(
            j,
            throughput={t: relative_throughput(j, t) * speed.get(j.id, 1.0) for t in j.gpu_types},
        )
        for j in jobs
    )


def _print_loss(console: Console, replay: Replay, results: Mapping[str, Any]) -> None:
    """Where heliotrope's replay loses to a policy the report ranks (it met every
    deadline), say by how much, on which job, and what that job did (never tuned away,
    never hidden)."""
    runs = {r.policy: r for r in replay.runs}
    helio = runs.get("heliotrope")
    if helio is None:
        return

    def objective(run: Any) -> Any:
        return objective_usd(run.fleet.usd, run.fleet.kg_co2, replay.carbon_usd_per_tonne)

    met = [runs[n] for n in ranked_policies(results) if n != "heliotrope" and n in runs]
    if not met:
        return
    best = min(met, key=lambda r: float(objective(r).sum()))
    gap = objective(helio) - objective(best)
    if gap.sum() <= 0:
        return
    j = int(gap.argmax())
    job = replay.jobs[j]
    mine = [e for e in helio.events if e.job_id == job.id]
    preempted = sum(e.kind is EventKind.PREEMPTED for e in mine)
    on_demand = any(
        e.kind is EventKind.LAUNCHED and e.offer_id.endswith(":on_demand") for e in mine
    )
    console.print(
        f"heliotrope paid {gap.sum():.2f} USD (carbon priced in) more than {best.policy} here, "
        f"{gap[j]:.2f} of it on {job.id}: preempted {preempted} time(s)"
        + (", it ended on on-demand (the safety net kept its deadline)" if on_demand else "")
        + ". The policy is measured, not tuned, on this scenario (docs/policies.md).",
        markup=False,
        highlight=False,
    )


def _print_fleet(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title="Fleet at the end", title_justify="left")
    for key in ("job", "phase", "progress", "usd", "kg_co2", "migrations", "preemptions"):
        table.add_column(key)
    for r in rows:
        table.add_row(
            r["job"],
            r["phase"],
            f"{r['progress']:.0%}",
            f"{r['usd']:.2f}",
            f"{r['kg_co2']:.3f}",
            str(r["migrations"]),
            str(r["preemptions"]),
        )
    console.print(table)
