"""``cbl-v100``: the 9 AWS p3.2xlarge (V100) zones of the Can't Be Late 2023-02-15 traces
(Wu et al., NSDI'24), 195 s ticks, per-tick spot prices from the SkyNomad artifact, on-demand
3.06 USD/h.

Jobs of 48 instance-hours (the Can't Be Late paper's job length) with 4 h and 22 h of slack,
cold starts of 0.05 h and 0.2 h (4 settings), 6 windows a week apart; other costs as in
``skynomad-h100``. The trace's absolute start is taken as 2023-02-15T00:00Z (the files carry
only the date). `work_hours`, `slack_hours` (or `deadline_ratio` instead), `cold_start_hours`
and `checkpoint_gb` may be lists.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Final

import pandas as pd
from pydantic import Field

from orchestrator import catalog
from orchestrator.errors import InputError
from orchestrator.model import CostSettings, JobSpec
from orchestrator.replay.suites.base import Suite, SuiteCase
from orchestrator.replay.suites.data import changes, require, yearly_carbon
from orchestrator.replay.suites.options import (
    BillingOptions,
    Names,
    Numbers,
    One,
    Positive,
    Ratios,
    Whole,
    listed,
    move_label,
)
from orchestrator.signals.traces import Trace, make_manifest

CBL_SEGMENTS: Final = "spot/spot_traces_segments.csv.gz"
CBL_PRICES: Final = "spot/skynomad_aws_v100_spot_price_per_tick_9zones_2023-02.csv.gz"
CBL_ZONES: Final = (
    "us-east-1a",
    "us-east-1c",
    "us-east-1d",
    "us-east-1f",
    "us-east-2a",
    "us-east-2b",
    "us-west-2a",
    "us-west-2b",
    "us-west-2c",
)
CBL_TRACE: Final = "cbl/availability/1-node/aws-02-15-2023/{zone}_v100_1"
CBL_START: Final = datetime(2023, 2, 15, tzinfo=UTC)  # the files carry only the date
CBL_TICK_S: Final = 195
CBL_ON_DEMAND_USD_PER_HOUR: Final = 3.06  # p3.2xlarge, us-east-1 list price
CBL_INSTANCE: Final = "p3.2xlarge"


class CblOptions(BillingOptions):
    """The options of ``cbl-v100`` and their defaults. The deadline is given one way:
    `slack_hours`, or `deadline_ratio` (slack = work x (ratio - 1))."""

    suite: ClassVar[str] = "cbl-v100"

    zones: Names = Field(default_factory=lambda: list(CBL_ZONES))
    work_hours: Positive = Field(default_factory=lambda: [48.0])
    slack_hours: Numbers = Field(default_factory=lambda: [4.0, 22.0])
    cold_start_hours: Numbers = Field(default_factory=lambda: [0.05, 0.2])
    checkpoint_gb: Numbers = Field(default_factory=lambda: [50.0])
    start_ticks: Whole = Field(default_factory=lambda: [0, 3100, 6200, 9300, 12400, 15500])
    deadline_ratio: Ratios | None = None
    egress_usd_per_gb: One | None = 0.02

    def check(self) -> None:
        super().check()
        if self.deadline_ratio is not None and "slack_hours" in self.model_fields_set:
            raise self.refuse("slack_hours or deadline_ratio", fix="give the deadline one way")
        bad = sorted(set(self.zones) - set(CBL_ZONES))
        if bad or not self.zones:
            raise InputError(
                "",
                f"suite {self.suite!r} option 'zones'",
                "zones of: " + ", ".join(CBL_ZONES),
                got=", ".join(bad) or "none",
            )

    @property
    def deadlines(self) -> list[float]:
        """The deadline axis: ratios, or hours of slack."""
        return self.deadline_ratio if self.deadline_ratio is not None else self.slack_hours


def cbl_v100(data_dir: Path, overrides: Mapping[str, Any]) -> Suite:
    """Can't Be Late's AWS V100 traces with SkyNomad's spot prices (module docstring).
    `work_hours`, `slack_hours` (or instead `deadline_ratio`: slack = work x (ratio - 1)),
    `cold_start_hours` and `checkpoint_gb` may be lists: one setting per point of their
    cross product."""
    opts = CblOptions.parse(overrides)
    settings = opts.cost_settings(transfer_default=False, bill_final_tick=not opts.bill_to_finish)
    seg_path = require(data_dir, CBL_SEGMENTS)
    price_path = require(data_dir, CBL_PRICES)
    segments = pd.read_csv(seg_path)
    prices = pd.read_csv(price_path)
    n_ticks = int(prices["tick"].max()) + 1
    trace = _cbl_trace(data_dir, segments, prices, opts.zones)
    by_ratio = opts.deadline_ratio is not None
    deadline = (
        f"deadline = work x ratio {listed(opts.deadlines)}"
        if by_ratio
        else f"slack {listed(opts.deadlines)} h"
    )
    return Suite(
        name=opts.suite,
        description=(
            f"Can't Be Late AWS V100 (p3.2xlarge), {len(opts.zones)} zones, 195 s ticks, "
            f"{len(opts.start_ticks)} windows, work {listed(opts.work_hours)} h, {deadline}, "
            f"cold start {listed(opts.cold_start_hours)} h, checkpoint "
            f"{listed(opts.checkpoint_gb)} GB, {move_label(settings)}, {opts.billing_label}"
        ),
        cases=tuple(_cases(opts, settings, trace, n_ticks)),
        config={
            "zones": opts.zones,
            "work_hours": opts.work_hours,
            "slack_hours": None if by_ratio else opts.deadlines,
            "deadline_ratio": opts.deadlines if by_ratio else None,
            "cold_start_hours": opts.cold_start_hours,
            "checkpoint_gb": opts.checkpoint_gb,
            "start_ticks": opts.start_ticks,
            "drop_finishing_tick": opts.drop_finishing_tick,
            "bill_to_finish": opts.bill_to_finish,
            "tick_s": CBL_TICK_S,
            "on_demand_usd_per_hour": CBL_ON_DEMAND_USD_PER_HOUR,
            "egress_usd_per_gb": settings.egress_usd_per_gb,
            "transfer_time": settings.transfer_time,
            "transfer_gbps": settings.transfer_gbps,
            "checkpoint_interval_h": 0.0,
            "trace_start": CBL_START.isoformat(),
            "data": [str(seg_path), str(price_path)],
        },
    )


def _cases(opts: CblOptions, settings: CostSettings, trace: Trace, n_ticks: int) -> list[SuiteCase]:
    by_ratio = opts.deadline_ratio is not None
    works, ckpts = opts.work_hours, opts.checkpoint_gb
    tick = timedelta(seconds=CBL_TICK_S)
    data_end = CBL_START + n_ticks * tick
    cases: list[SuiteCase] = []
    for slack_or_ratio, cold, work_h, ckpt in itertools.product(
        opts.deadlines, opts.cold_start_hours, works, ckpts
    ):
        slack = work_h * (slack_or_ratio - 1.0) if by_ratio else slack_or_ratio
        setting = (f"ratio {slack_or_ratio:g}" if by_ratio else f"slack {slack:g} h") + (
            f", cold {cold:g} h"
            + (f", work {work_h:g} h" if len(works) > 1 else "")
            + (f", ckpt {ckpt:g} GB" if len(ckpts) > 1 else "")
        )
        window = timedelta(hours=work_h + slack)
        for s in opts.start_ticks:
            start = CBL_START + s * tick
            if start + window > data_end:
                raise InputError(
                    "",
                    f"suite {opts.suite!r} option 'start_ticks'",
                    "windows inside the trace",
                    got=s,
                    fix=f"start before tick {n_ticks} minus the window",
                )
            job = JobSpec(
                id=f"t{s}",
                work_gpu_hours=work_h,
                gpus=1,
                start=start,
                deadline=start + window,
                checkpoint_size_gb=ckpt,
                cold_start_h=cold,
                home_region=opts.zones[0][:-1],
                gpu_types=frozenset({"V100"}),
                throughput={"V100": 1.0},
                checkpoint_interval_h=0.0,
            )
            cases.append(
                SuiteCase(
                    setting=setting,
                    window=f"t{s}",
                    trace=trace,
                    jobs=(job,),
                    tick_s=CBL_TICK_S,
                    start=start,
                    end=min(start + 2 * window, max(data_end, start + window)),
                    settings=settings,
                    drop_finishing_tick=opts.drop_finishing_tick,
                )
            )
    return cases


def _cbl_trace(
    data_dir: Path, segments: pd.DataFrame, prices: pd.DataFrame, zones: Sequence[str]
) -> Trace:
    regions = {z: z[:-1] for z in zones}
    offers = pd.DataFrame(
        [
            {
                "cloud": "aws",
                "region": regions[z],
                "zone": z,
                "instance_type": CBL_INSTANCE,
                "gpu_type": "V100",
                "gpu_count": 1,
                "grid_zone": "",
            }
            for z in zones
        ]
    )
    price_rows = _price_rows(prices, regions)
    tick = pd.Timedelta(seconds=CBL_TICK_S)
    t0 = pd.Timestamp(CBL_START)
    ids = {CBL_TRACE.format(zone=z): z for z in zones}
    seg = segments[segments["trace_id"].isin(ids)].sort_values(["trace_id", "start_tick"])
    missing = sorted(set(ids) - set(seg["trace_id"]))
    if missing:
        raise InputError(
            CBL_SEGMENTS,
            "trace_id",
            "the Can't Be Late 2023-02-15 V100 traces",
            got="missing " + ", ".join(missing),
        )
    spot = pd.DataFrame(
        {
            "time": t0 + seg["start_tick"].to_numpy() * tick,
            "cloud": "aws",
            "zone": seg["trace_id"].map(ids),
            "instance_type": CBL_INSTANCE,
            "capacity": seg["value"].astype(float),
        }
    )
    grid_zones = [catalog.grid_zone("aws", r) or "" for r in regions.values()]
    grid = yearly_carbon(data_dir, grid_zones, 2023, CBL_START)
    return Trace(
        offers=offers,
        prices=price_rows,
        spot=spot.reset_index(drop=True),
        grid=grid,
        manifest=make_manifest(
            generator="suite cbl-v100",
            sources=[{"file": CBL_SEGMENTS}, {"file": CBL_PRICES}],
            start=CBL_START.isoformat(),
        ),
    )


def _price_rows(prices: pd.DataFrame, regions: Mapping[str, str]) -> pd.DataFrame:
    """Spot prices where they change (per-tick in the artifact), on-demand at list price."""
    zones = list(regions)
    tick = pd.Timedelta(seconds=CBL_TICK_S)
    t0 = pd.Timestamp(CBL_START)
    p = prices[prices["zone"].isin(zones)].sort_values(["zone", "tick"], kind="stable")
    p = changes(p, "zone", "spot_usd_per_hour")
    price_rows = pd.concat(
        [
            pd.DataFrame(
                {
                    "time": t0 + p["tick"].to_numpy() * tick,
                    "cloud": "aws",
                    "region": p["zone"].map(regions),
                    "zone": p["zone"],
                    "instance_type": CBL_INSTANCE,
                    "market": "spot",
                    "usd_per_hour": p["spot_usd_per_hour"].astype(float),
                }
            ),
            pd.DataFrame(
                [
                    {
                        "time": CBL_START,
                        "cloud": "aws",
                        "region": regions[z],
                        "zone": z,
                        "instance_type": CBL_INSTANCE,
                        "market": "on_demand",
                        "usd_per_hour": CBL_ON_DEMAND_USD_PER_HOUR,
                    }
                    for z in zones
                ]
            ),
        ],
        ignore_index=True,
    )
    return price_rows
