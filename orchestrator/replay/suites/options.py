"""Suite options as pydantic models: what `heliotrope bench policies` flags (and a test's
overrides) may set, each checked once, a bad one refused naming the suite and the option.

A sweep option takes one number, a list, or a comma list (``"1.2,1.5"``): one setting per
point of the suite's cross product. Options given as None keep the suite's default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from orchestrator.errors import InputError, Refused, expected_of
from orchestrator.model import CostSettings


def _items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return value.split(",")
    return list(value) if isinstance(value, list | tuple) else [value]


def _numbers(minimum: float) -> Callable[[Any], list[float]]:
    def parse(value: Any) -> list[float]:
        try:
            out = [float(v) for v in _items(value)]
        except (TypeError, ValueError):
            raise Refused("a number or a list of numbers") from None
        if not out or any(not math.isfinite(v) or v < minimum for v in out):
            raise Refused(f"numbers >= {minimum:g}")
        return out

    return parse


def _one(minimum: float) -> Callable[[Any], float]:
    many = _numbers(minimum)

    def parse(value: Any) -> float:
        values = many(value)
        if len(values) != 1:
            raise Refused("one number")
        return values[0]

    return parse


def _whole(value: Any) -> list[int]:
    floats = _numbers(0.0)(value)
    if any(v != int(v) for v in floats):
        raise Refused("whole numbers")
    return [int(v) for v in floats]


def _names(value: Any) -> list[str]:
    return [str(v).strip() for v in _items(value) if str(v).strip()]


def _integer(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise Refused("a whole number") from None


Numbers = Annotated[list[float], BeforeValidator(_numbers(0.0))]
Positive = Annotated[list[float], BeforeValidator(_numbers(1e-9))]
Ratios = Annotated[list[float], BeforeValidator(_numbers(1.0))]
One = Annotated[float, BeforeValidator(_one(0.0))]
OnePositive = Annotated[float, BeforeValidator(_one(1e-9))]
AtLeastOne = Annotated[float, BeforeValidator(_one(1.0))]
Whole = Annotated[list[int], BeforeValidator(_whole)]
Names = Annotated[list[str], BeforeValidator(_names)]
Flag = Annotated[bool, BeforeValidator(bool)]
Integer = Annotated[int, BeforeValidator(_integer)]


class SuiteOptions(BaseModel):
    """The options of one suite; `parse(overrides)` is the only way in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    suite: ClassVar[str] = ""

    @classmethod
    def parse(cls, overrides: Mapping[str, Any]) -> Self:
        """The suite's options over its defaults; unknown names and bad values raise
        `InputError` naming the suite and the option."""
        fields = list(cls.model_fields)
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise InputError(
                "",
                f"suite {cls.suite!r} options",
                "one of: " + ", ".join(fields),
                got=", ".join(unknown),
                fix="drop or rename the option",
            )
        given = {k: v for k, v in overrides.items() if v is not None}
        try:
            opts = cls.model_validate(given)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = str(err["loc"][0]) if err["loc"] else ""
            raise InputError(
                "",
                f"suite {cls.suite!r} option {key!r}",
                expected_of(err),
                got=repr(given.get(key)),
            ) from None
        opts.check()
        return opts

    def check(self) -> None:
        """Rules across options (a suite overrides it)."""

    def refuse(self, expected: str, *, fix: str = "") -> InputError:
        return InputError("", f"suite {self.suite!r} options", expected, got="both", fix=fix)


class MoveOptions(SuiteOptions):
    """Egress and transfer time of a checkpoint move: `egress_usd_per_gb` (one price for
    every cross-region move; None: the catalog's per route) and `transfer_gbps` (copies take
    time at that bandwidth; None: the suite's default)."""

    egress_usd_per_gb: One | None = None
    transfer_gbps: OnePositive | None = None

    def cost_settings(
        self,
        *,
        transfer_default: bool,
        bill_final_tick: bool = False,
        carbon_usd_per_tonne: float = 0.0,
    ) -> CostSettings:
        """`transfer_default`: without `transfer_gbps`, False for instant copies, True for
        the catalog's per-route bandwidth."""
        return CostSettings(
            carbon_usd_per_tonne=carbon_usd_per_tonne,
            egress_usd_per_gb=self.egress_usd_per_gb,
            transfer_time=self.transfer_gbps is not None or transfer_default,
            transfer_gbps=self.transfer_gbps,
            bill_final_tick=bill_final_tick,
        )


class BillingOptions(MoveOptions):
    """Billing: every tick by default; `drop_finishing_tick` reports SkyNomad's convention,
    `bill_to_finish` bills the finishing tick up to the finishing instant (at most one)."""

    drop_finishing_tick: Flag = False
    bill_to_finish: Flag = False

    def check(self) -> None:
        if self.drop_finishing_tick and self.bill_to_finish:
            raise self.refuse("at most one of drop_finishing_tick and bill_to_finish")

    @property
    def billing_label(self) -> str:
        if self.drop_finishing_tick:
            return "finishing tick dropped (SkyNomad's reported convention)"
        return "billed to the finishing instant" if self.bill_to_finish else "every tick billed"


def move_label(settings: CostSettings) -> str:
    egress = (
        "egress at catalog prices"
        if settings.egress_usd_per_gb is None
        else f"egress {settings.egress_usd_per_gb:g} USD/GB"
    )
    if not settings.transfer_time:
        return egress + ", instant checkpoint copies"
    if settings.transfer_gbps is None:
        return egress + ", copies at catalog bandwidth"
    return egress + f", copies at {settings.transfer_gbps:g} Gbit/s"


def listed(values: list[float], fmt: str = "{:g}") -> str:
    return ", ".join(fmt.format(v) for v in values)
