"""Results of a replay: per-policy totals, a per-job timeline and cumulative series."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator import units
from orchestrator.costs import objective_usd
from orchestrator.model import EventKind, Phase
from orchestrator.replay.runner import PolicyRun, Replay

TIMELINE_COLUMNS = [
    "policy",
    "job",
    "start",
    "end",
    "offer_id",
    "cloud",
    "region",
    "zone",
    "market",
    "gpu_type",
    "usd",
    "kg_co2",
    "end_reason",
]


def policy_results(replay: Replay, run: PolicyRun) -> dict[str, Any]:
    f = run.fleet
    feasible = replay.feasible
    deadlines = np.array([j.deadline.timestamp() for j in replay.jobs])
    starts = np.array([j.start.timestamp() for j in replay.jobs])
    finished = f.phase == Phase.DONE
    met = finished & (f.finished_at_s <= deadlines + 1e-6)
    kwh = float(f.kwh.sum())
    usd = float(f.usd.sum())
    kg = float(f.kg_co2.sum())
    budgets = np.array([j.budget_usd if j.budget_usd is not None else np.inf for j in replay.jobs])
    completion_h = units.hours(f.finished_at_s[finished] - starts[finished])
    return {
        "usd": round(usd, 4),
        "kg_co2": round(kg, 4),
        "kg_co2_marginal": round(float(f.kg_co2_marginal.sum()), 4),
        "kwh": round(kwh, 3),
        "curtailed_energy_share": round(float(f.kwh_curtailed.sum()) / kwh, 6) if kwh > 0 else 0.0,
        "deadlines_met": int((met & feasible).sum()),
        "deadlines_missed": int((~met & feasible).sum()),
        "infeasible": int((~feasible).sum()),
        "finished": int(finished.sum()),
        "migrations": int(f.migrations.sum()),
        "preemptions": int(f.preemptions.sum()),
        "egress_usd": round(float(f.egress_usd.sum()), 4),
        "mean_completion_h": round(float(completion_h.mean()), 4) if completion_h.size else None,
        "over_budget": int((f.usd > budgets).sum()),
        "objective_usd": round(objective_usd(usd, kg, replay.carbon_usd_per_tonne), 4),
    }


def results(replay: Replay, *, extra_config: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "config": {**replay.config, **(extra_config or {})},
        "policies": {run.policy: policy_results(replay, run) for run in replay.runs},
        "jobs": {
            run.policy: {
                job.id: {
                    "usd": round(float(run.fleet.usd[j]), 4),
                    "kg_co2": round(float(run.fleet.kg_co2[j]), 4),
                    "finished_at": _iso(run.fleet.finished_at_s[j]),
                    "deadline": job.deadline.isoformat(),
                    "feasible": bool(replay.feasible[j]),
                    "migrations": int(run.fleet.migrations[j]),
                    "preemptions": int(run.fleet.preemptions[j]),
                }
                for j, job in enumerate(replay.jobs)
            }
            for run in replay.runs
        },
    }


def timeline(replay: Replay) -> pd.DataFrame:
    """One row per stint of a job on an instance, cut from the event log."""
    offers = {o.id: o for o in replay.grid.offers}
    rows: list[dict[str, Any]] = []
    for run in replay.runs:
        open_: dict[str, tuple[float, str, float, float]] = {}
        for e in run.events:
            usd, kg = e.data.get("usd", 0.0), e.data.get("kg_co2", 0.0)
            if e.kind is EventKind.LAUNCHED:
                open_[e.job_id] = (e.time_s, e.offer_id, usd, kg)
                continue
            reason = {EventKind.PREEMPTED: "preempted", EventKind.FINISHED: "finished"}.get(e.kind)
            if e.kind is EventKind.TERMINATED:
                reason = "paused" if e.detail.startswith("pause") else "migrated"
            if reason is None or e.job_id not in open_:
                continue
            t0, offer_id, usd0, kg0 = open_.pop(e.job_id)
            rows.append(
                _row(
                    run.policy,
                    e.job_id,
                    t0,
                    e.time_s,
                    offers[offer_id],
                    usd - usd0,
                    kg - kg0,
                    reason,
                )
            )
        index = {job.id: j for j, job in enumerate(replay.jobs)}
        for job_id, (t0, offer_id, usd0, kg0) in open_.items():
            j = index[job_id]
            rows.append(
                _row(
                    run.policy,
                    job_id,
                    t0,
                    run.end_s,
                    offers[offer_id],
                    float(run.fleet.usd[j]) - usd0,
                    float(run.fleet.kg_co2[j]) - kg0,
                    "replay_end",
                )
            )
    frame = pd.DataFrame(rows, columns=TIMELINE_COLUMNS)
    for col in ("start", "end"):
        frame[col] = pd.to_datetime(frame[col], unit="s", utc=True)
    return frame.sort_values(["policy", "job", "start"], kind="stable").reset_index(drop=True)


def cumulative(replay: Replay, points: int = 400) -> pd.DataFrame:
    frames = []
    for run in replay.runs:
        step = max(1, len(run.times_s) // points)
        idx = np.unique(np.r_[np.arange(0, len(run.times_s), step), len(run.times_s) - 1])
        frames.append(
            pd.DataFrame(
                {
                    "policy": run.policy,
                    "time": pd.to_datetime(run.times_s[idx], unit="s", utc=True),
                    "usd": run.cumulative_usd[idx],
                    "kg_co2": run.cumulative_kg_co2[idx],
                }
            )
        )
    return (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=["policy", "time", "usd", "kg_co2"])
    )


def write_outputs(
    replay: Replay,
    out_dir: Path,
    *,
    extra_config: dict[str, Any] | None = None,
    doc: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """results.json (`doc` when the caller has it already: `results(replay, ...)`),
    timeline.csv, cumulative.csv, the plots and report.html."""
    from orchestrator.replay.report import write_report  # matplotlib: only when writing

    out_dir.mkdir(parents=True, exist_ok=True)
    res = doc if doc is not None else results(replay, extra_config=extra_config)
    tl = timeline(replay)
    cum = cumulative(replay)
    (out_dir / "results.json").write_text(json.dumps(res, indent=2, sort_keys=False))
    tl.to_csv(out_dir / "timeline.csv", index=False)
    cum.to_csv(out_dir / "cumulative.csv", index=False)
    report = write_report(res, tl, cum, out_dir)
    return {
        "results": out_dir / "results.json",
        "timeline": out_dir / "timeline.csv",
        "report": report,
    }


def _row(
    policy: str, job: str, t0: float, t1: float, offer: Any, usd: float, kg: float, reason: str
) -> dict[str, Any]:
    return {
        "policy": policy,
        "job": job,
        "start": t0,
        "end": t1,
        "offer_id": offer.id,
        "cloud": offer.cloud,
        "region": offer.region,
        "zone": offer.zone,
        "market": offer.market.value,
        "gpu_type": offer.gpu_type,
        "usd": round(usd, 4),
        "kg_co2": round(kg, 4),
        "end_reason": reason,
    }


def _iso(ts: float) -> str | None:
    if math.isnan(ts):
        return None
    return pd.Timestamp(ts, unit="s", tz="UTC").isoformat()
