"""Scripted events on a scenario's signals: what-if spikes, curtailment and spot reclaims.

`signals: scenario` worlds (the demo, tests, rehearsals) may list events in config.yaml;
each changes the scenario's grid over a window, before any controller or replay reads it,
so the live run and the replay of the same period see exactly the same signals:

    events:
      - {kind: carbon, region: us-central1, at_h: 4, hours: 6, g_per_kwh: 850,
         note: "wind lull: coal on the margin"}
      - {kind: curtailment, region: europe-west4, at_h: 9, hours: 4, g_per_kwh: 60}
      - {kind: spot_price, zone: us-east-1c, at_h: 2, hours: 5, factor: 2.5}
      - {kind: reclaim, zone: eu-north-1a, at_h: 3, hours: 4}

`at_h` counts hours from the scenario's start. A carbon event sets the zone's average and
marginal intensity; a curtailment event marks the zone curtailing (marginal intensity 0,
the average at `g_per_kwh` when given); `spot_price` multiplies the zone's spot prices;
`reclaim` takes the zone's spot capacity away (the cloud reclaims every spot instance
there). Events are pure functions of the grid: the same list gives the same grid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.errors import InputError
from orchestrator.model import Market
from orchestrator.signals.grid import SignalGrid
from orchestrator.units import SECONDS_PER_HOUR

EventKind = Literal["carbon", "curtailment", "spot_price", "reclaim"]


class GridEvent(BaseModel):
    """One scripted change of the scenario's signals (module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: EventKind
    region: str | None = None
    zone: str | None = None
    at_h: float = Field(ge=0, allow_inf_nan=False)
    hours: float = Field(gt=0, le=24 * 60, allow_inf_nan=False)
    g_per_kwh: float | None = Field(default=None, ge=0, le=5000, allow_inf_nan=False)
    factor: float | None = Field(default=None, gt=0, le=100, allow_inf_nan=False)
    note: str = Field(default="", max_length=200)

    @model_validator(mode="after")
    def _fields_of_kind(self) -> GridEvent:
        if (self.region is None) == (self.zone is None):
            raise ValueError("name exactly one of region: or zone:")
        if self.kind == "carbon" and self.g_per_kwh is None:
            raise ValueError("a carbon event needs g_per_kwh: (the intensity it sets)")
        if self.kind == "spot_price" and self.factor is None:
            raise ValueError("a spot_price event needs factor: (e.g. 2.5)")
        return self

    @property
    def where(self) -> str:
        return str(self.region or self.zone)

    def describe(self) -> str:
        """The event in words, for logs and the demo's output."""
        if self.kind == "carbon":
            what = f"grid carbon {self.g_per_kwh:g} g/kWh"
        elif self.kind == "curtailment":
            what = "renewables curtailed" + (
                f", {self.g_per_kwh:g} g/kWh" if self.g_per_kwh is not None else ""
            )
        elif self.kind == "spot_price":
            what = f"spot price x{self.factor:g}"
        else:
            what = "spot capacity reclaimed"
        span = f"hours {self.at_h:g}-{self.at_h + self.hours:g}"
        return f"{self.where}: {what}, {span}" + (f" ({self.note})" if self.note else "")


def apply_events(grid: SignalGrid, events: Sequence[GridEvent]) -> SignalGrid:
    """The grid with `events` applied in order (a new grid; `grid` is not changed).

    An event naming a region or zone the grid has no offer in is refused: a typo would
    otherwise script nothing, silently."""
    if not events:
        return grid
    usd = grid.usd_per_hour.copy()
    capacity = grid.spot_capacity.copy()
    carbon = grid.carbon_g_per_kwh.copy()
    marginal = grid.carbon_marginal_g_per_kwh.copy()
    curtailing = grid.curtailing.copy()
    for i, event in enumerate(events):
        cols = _columns(grid, event, i)
        k0 = int(event.at_h * SECONDS_PER_HOUR // grid.tick_s)
        if k0 >= grid.n_ticks:
            raise InputError(
                "events",
                f"{i}.at_h",
                f"a time within the scenario's {grid.n_ticks * grid.tick_s / SECONDS_PER_HOUR:g} h",
                got=event.at_h,
                fix="lower at_h, or raise days:",
            )
        k1 = min(
            grid.n_ticks, int(np.ceil((event.at_h + event.hours) * SECONDS_PER_HOUR / grid.tick_s))
        )
        window = np.s_[k0:k1]
        if event.kind == "carbon":
            carbon[window, cols] = event.g_per_kwh
            marginal[window, cols] = event.g_per_kwh
        elif event.kind == "curtailment":
            curtailing[window, cols] = True
            marginal[window, cols] = 0.0
            if event.g_per_kwh is not None:
                carbon[window, cols] = event.g_per_kwh
        elif event.kind == "spot_price" and event.factor is not None:
            usd[window, cols] *= event.factor
        else:  # reclaim
            capacity[window, cols] = 0.0
    for a in (usd, capacity, carbon, marginal, curtailing):
        a.flags.writeable = False
    return dataclasses.replace(
        grid,
        usd_per_hour=usd,
        spot_capacity=capacity,
        carbon_g_per_kwh=carbon,
        carbon_marginal_g_per_kwh=marginal,
        curtailing=curtailing,
    )


def _columns(grid: SignalGrid, event: GridEvent, i: int) -> list[int]:
    spot_only = event.kind in ("spot_price", "reclaim")
    cols = [
        o
        for o, offer in enumerate(grid.offers)
        if (offer.region == event.region or offer.zone == event.zone)
        and (offer.market is Market.SPOT or not spot_only)
    ]
    if not cols:
        field = "region" if event.region is not None else "zone"
        known = sorted({getattr(o, field) for o in grid.offers})
        raise InputError(
            "events",
            f"{i}.{field}",
            f"a {field} of this world's offers: {', '.join(known)}",
            got=event.where,
        )
    return cols
