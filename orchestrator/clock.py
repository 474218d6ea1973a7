"""Clocks. Nothing in Heliotrope reads the time except through a `Clock`, so runs replay."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Current time, always timezone-aware UTC."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to; `sleep` advances it instantly."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FakeClock start must be timezone-aware (UTC)")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += timedelta(seconds=seconds)

    def set(self, when: datetime) -> None:
        if when < self._now:
            raise ValueError("a clock cannot go backwards")
        self._now = when


def utc(value: datetime) -> datetime:
    """Return `value` as aware UTC; naive datetimes are taken to be UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class ScaledClock:
    """Scenario time running `speed` times faster than `base`, from `origin` on.

    A demo replays a day of prices and carbon in minutes: the controller reads this clock,
    the instances it starts are real processes on wall time.
    """

    def __init__(
        self, base: Clock, origin: datetime, speed: float, real_origin: datetime | None = None
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self._base = base
        self._real0 = utc(real_origin) if real_origin is not None else base.now()
        self._origin = utc(origin)
        self.speed = speed

    def now(self) -> datetime:
        return self._origin + (self._base.now() - self._real0) * self.speed

    @property
    def real_origin(self) -> datetime:
        return self._real0

    def restart(self) -> None:
        """Scenario time starts over at `origin`, from now on."""
        self._real0 = self._base.now()

    def sleep(self, seconds: float) -> None:
        self._base.sleep(seconds / self.speed)


def real_seconds(clock: Clock, seconds: float) -> float:
    """The wall-clock seconds that `seconds` of `clock`'s time take (a `ScaledClock` runs
    `speed` times faster than the wall; every other clock keeps wall time)."""
    return seconds / float(getattr(clock, "speed", 1.0))
