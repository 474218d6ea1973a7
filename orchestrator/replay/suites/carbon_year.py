"""``carbon-year``: GCP A100/H100/L4 on their real price history, May 2023 to December 2024,
in the regions whose grid zone has an hourly carbon series (Electricity Maps), with the
negative wholesale price as the curtailment proxy; one setting per carbon price.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Final

import numpy as np
import pandas as pd
from pydantic import Field

from orchestrator import catalog
from orchestrator.errors import InputError
from orchestrator.model import JobSpec
from orchestrator.replay.suites.base import Suite, SuiteCase
from orchestrator.replay.suites.options import (
    AtLeastOne,
    Flag,
    Integer,
    MoveOptions,
    Numbers,
    One,
    listed,
    move_label,
)
from orchestrator.signals.traces import Trace, empty_frame
from providers.sim import DEFAULT_LOSS_PER_HOUR

# The oracle's progress grid for carbon-year: 4,096 levels instead of 16,384 gave the same J
# to the cent on 8 jobs of the first window at 200 USD/t, 2.5x faster (docs/policies.md).
CARBON_ORACLE_LEVELS: Final = 4096
CARBON_GPUS: Final = frozenset({"A100-40GB", "A100-80GB", "H100", "L4"})
# One single-GPU and one 8-GPU shape per GPU type (GCP's list has ~15 shapes per region).
CARBON_TYPES: Final = frozenset(
    {
        "a2-highgpu-1g",
        "a2-highgpu-8g",
        "a2-ultragpu-1g",
        "a2-ultragpu-8g",
        "a3-highgpu-8g",
        "g2-standard-4",
        "g2-standard-96",
    }
)


class CarbonYearOptions(MoveOptions):
    """The options of ``carbon-year`` and their defaults (200 jobs in 10 windows)."""

    suite: ClassVar[str] = "carbon-year"

    carbon_prices: Numbers = Field(default_factory=lambda: [0.0, 50.0, 200.0])
    windows: AtLeastOne = 10
    jobs_per_window: AtLeastOne = 20
    window_days: AtLeastOne = 8.0
    seed: Integer = 0
    # The seeded hazard that fills GCP's missing spot availability: lost at this rate per
    # hour (back at providers.sim's 0.15/h); 0 keeps every spot offer up throughout.
    spot_loss_per_hour: One = DEFAULT_LOSS_PER_HOUR
    # Each job replayed by itself on its window's world (the same prices, carbon and spot
    # draws; no other job takes its slots): one case per job, the window named by the job.
    jobs_alone: Flag = False


def carbon_year(data_dir: Path, overrides: Mapping[str, Any]) -> Suite:
    """`windows` windows of `window_days` spread over the period, `jobs_per_window` seeded
    jobs each (200 in all by default): 1 or 8 GPUs, A100/H100 or L4/A100 allowed, 1.5-3x
    slack on the fastest offer, checkpoints of 20-200 GB. One setting per carbon price. GCP
    spot availability has no trace in that period: the replay's seeded hazard fills it
    (providers.sim: calibrated on the Can't Be Late V100 traces, 60 % available, outages of
    hours). Shapes the price source lists at the bare VM's price in some region are left
    out there (`_unpriced_gpu_regions`). `jobs_alone`: one case per job, alone on its
    window's world (`providers.sim.realize_spot` draws each offer's chain from its own
    seed, so a job's offers see the fleet's spot draws); beside the fleet's run, what
    sharing the slots costs."""
    opts = CarbonYearOptions.parse(overrides)
    n_windows, per_window = int(opts.windows), int(opts.jobs_per_window)
    days = opts.window_days
    trace, unpriced_gpu = _trace(data_dir)
    regions = sorted(set(trace.offers["region"]))
    windows = _windows(n_windows, per_window, days, opts.seed, regions)
    if opts.jobs_alone:
        windows = [(job.id, w_start, (job,)) for _, w_start, jobs in windows for job in jobs]
    cases = tuple(
        SuiteCase(
            setting=f"carbon {price:g} USD/t",
            window=label,
            trace=trace,
            jobs=jobs,
            tick_s=1800,
            start=w_start,
            end=w_start + timedelta(days=days),
            settings=opts.cost_settings(transfer_default=True, carbon_usd_per_tonne=price),
            spot_loss_per_hour=opts.spot_loss_per_hour,
        )
        for price in opts.carbon_prices
        for label, w_start, jobs in windows
    )
    return Suite(
        name=opts.suite,
        description=(
            f"GCP A100/H100/L4, real prices and hourly carbon, 2023-05..2024-12, "
            f"{n_windows} windows of {days:g} days, {n_windows * per_window} jobs "
            f"(seed {opts.seed}), 30-minute ticks, carbon price "
            f"{listed(opts.carbon_prices)} USD/t, {move_label(cases[0].settings)}, "
            f"spot lost at {opts.spot_loss_per_hour:g}/h"
            + (", each job alone" if opts.jobs_alone else "")
        ),
        cases=cases,
        config={
            "carbon_prices": opts.carbon_prices,
            "windows": n_windows,
            "jobs_per_window": per_window,
            "window_days": days,
            "seed": opts.seed,
            "spot_loss_per_hour": opts.spot_loss_per_hour,
            "jobs_alone": opts.jobs_alone,
            "regions": regions,
            "egress_usd_per_gb": cases[0].settings.egress_usd_per_gb,
            "transfer_gbps": cases[0].settings.transfer_gbps,
            "oracle_levels": CARBON_ORACLE_LEVELS,
            "dropped_unpriced_gpu": sorted(f"{r} {i}" for r, i in unpriced_gpu),
        },
        oracle_levels=CARBON_ORACLE_LEVELS,
    )


def _trace(data_dir: Path) -> tuple[Trace, set[tuple[str, str]]]:
    """The shared data's GCP offers of the suite's shapes in zones with hourly carbon, their
    prices and grid series; and the (region, shape) left out as priced without GPUs."""
    from orchestrator.signals.importers import import_shared_data

    full = import_shared_data(Path(data_dir))
    hourly = set(full.grid.loc[full.grid["metric"] == "carbon_avg_g_per_kwh", "grid_zone"])
    offers = full.offers[
        (full.offers["cloud"] == "gcp")
        & full.offers["gpu_type"].isin(CARBON_GPUS)
        & full.offers["instance_type"].isin(CARBON_TYPES)
        & full.offers["grid_zone"].isin(hourly)
    ].reset_index(drop=True)
    if offers.empty:
        raise InputError(
            str(data_dir),
            "carbon-year offers",
            "GCP A100/H100/L4 offers in zones with hourly carbon",
            got="none",
        )
    keys = set(zip(offers["cloud"], offers["region"], offers["instance_type"], strict=True))
    price_rows = full.prices[
        [
            (c, r, i) in keys
            for c, r, i in zip(
                full.prices["cloud"],
                full.prices["region"],
                full.prices["instance_type"],
                strict=True,
            )
        ]
    ]
    unpriced_gpu = _unpriced_gpu_regions(price_rows)
    if unpriced_gpu:
        offers = offers[_kept(offers, unpriced_gpu)].reset_index(drop=True)
        price_rows = price_rows[_kept(price_rows, unpriced_gpu)]
    zones = set(offers["grid_zone"])
    trace = Trace(
        offers=offers,
        prices=price_rows.reset_index(drop=True),
        spot=empty_frame("spot"),
        grid=full.grid[full.grid["grid_zone"].isin(zones)].reset_index(drop=True),
        manifest=full.manifest,
    )
    return trace, unpriced_gpu


def _kept(frame: pd.DataFrame, dropped: set[tuple[str, str]]) -> list[bool]:
    return [
        (r, i) not in dropped for r, i in zip(frame["region"], frame["instance_type"], strict=True)
    ]


def _windows(
    n_windows: int, per_window: int, days: float, seed: int, regions: list[str]
) -> list[tuple[str, datetime, tuple[JobSpec, ...]]]:
    """The windows, spread evenly over the period, each with its seeded jobs."""
    first, last = datetime(2023, 5, 8, tzinfo=UTC), datetime(2024, 12, 20, tzinfo=UTC)
    step = (last - first - timedelta(days=days)) / max(1, n_windows - 1)
    rng = np.random.default_rng(seed)
    windows: list[tuple[str, datetime, tuple[JobSpec, ...]]] = []
    for w in range(n_windows):
        w_start = (first + step * w).replace(minute=0, second=0, microsecond=0)
        jobs = tuple(
            _job(rng, f"w{w:02d}-j{i:03d}", w_start, days, regions) for i in range(per_window)
        )
        windows.append((f"{w_start:%Y-%m-%d}", w_start, jobs))
    return windows


def _job(
    rng: np.random.Generator, name: str, w_start: datetime, days: float, regions: list[str]
) -> JobSpec:
    gpus = int(rng.choice([1, 8]))
    types = (
        frozenset({"A100-40GB", "A100-80GB", "H100"})
        if rng.random() < 0.6
        else frozenset({"L4", "A100-80GB"})
    )
    work = float(rng.uniform(4, 36)) * gpus  # 4-36 h on A100s
    # Slack is measured on A100-80GB speed: every window has it (H100 shapes arrive in GCP's
    # list only later in 2023), so every deadline is feasible.
    fastest_h = work / (gpus * catalog.gpu("A100-80GB").relative_throughput)
    start = w_start + timedelta(hours=float(rng.uniform(0, 24)))
    slack = float(rng.uniform(1.5, 3.0))
    deadline = start + timedelta(hours=min(fastest_h * slack + 1.0, days * 24 - 30))
    return JobSpec(
        id=name,
        work_gpu_hours=work,
        gpus=gpus,
        start=start,
        deadline=deadline,
        checkpoint_size_gb=float(rng.uniform(20, 200)),
        cold_start_h=0.2,
        home_region=regions[int(rng.integers(len(regions)))],
        gpu_types=types,
        checkpoint_interval_h=1.0,
    )


UNPRICED_GPU_RATIO: Final = 0.4


def _unpriced_gpu_regions(prices: pd.DataFrame) -> set[tuple[str, str]]:
    """(region, instance type) whose on-demand price is under `UNPRICED_GPU_RATIO` of the
    type's median over regions: the source priced the VM without its GPUs (SkyPilot's GCP
    catalog lists a2-highgpu-1g in northamerica-northeast2 at 0.81 USD/h, 3.67 to 5.88
    elsewhere). Such a region would be a bargain that does not exist."""
    od = prices[prices["market"] == "on_demand"]
    if od.empty:
        return set()
    per_region = od.groupby(["instance_type", "region"])["usd_per_hour"].median()
    typical = per_region.groupby(level="instance_type").median()
    ratio = (
        per_region / typical.reindex(per_region.index.get_level_values("instance_type")).to_numpy()
    )
    return {(str(r), str(i)) for (i, r), v in ratio.items() if v < UNPRICED_GPU_RATIO}
