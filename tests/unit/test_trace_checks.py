"""A trace with values a replay would take silently for something else is refused (when
written, and when read), naming the row and the fix."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.errors import InputError
from orchestrator.signals.traces import read_trace, write_trace
from tests.conftest import tiny_trace


def written(tmp_path: Path, table: str, change) -> Path:  # type: ignore[no-untyped-def]
    trace = tiny_trace()
    trace = dataclasses.replace(trace, **{table: change(getattr(trace, table).copy())})
    write_trace(trace, tmp_path)
    return tmp_path


def infinite_price(f: pd.DataFrame) -> pd.DataFrame:
    f.loc[0, "usd_per_hour"] = np.inf
    return f


def infinite_carbon(f: pd.DataFrame) -> pd.DataFrame:
    f.loc[0, "value"] = np.inf
    return f


def astronomical_price(f: pd.DataFrame) -> pd.DataFrame:
    f.loc[0, "usd_per_hour"] = 1e308
    return f


def conflicting_duplicate(f: pd.DataFrame) -> pd.DataFrame:
    row = f.iloc[[0]].copy()
    row["usd_per_hour"] = row["usd_per_hour"] + 1.0
    return pd.concat([f, row], ignore_index=True)


def epoch_seconds_as_ns(f: pd.DataFrame) -> pd.DataFrame:
    f["time"] = pd.to_datetime(f["time"].astype("int64") // 10**9, utc=True)  # read as ns
    return f


@pytest.mark.parametrize(
    ("table", "change", "says"),
    [
        ("prices", infinite_price, "finite"),
        ("prices", astronomical_price, "unit mistake"),
        ("grid", infinite_carbon, "finite"),
        ("prices", conflicting_duplicate, "one value per series and time"),
        ("prices", epoch_seconds_as_ns, "nanoseconds"),
    ],
)
def test_a_suspicious_trace_is_refused(tmp_path: Path, table: str, change, says: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match=says):  # refused when written, and when read
        read_trace(written(tmp_path, table, change))


def test_a_repeated_row_with_the_same_value_is_fine(tmp_path: Path) -> None:
    path = written(tmp_path, "prices", lambda f: pd.concat([f, f.iloc[[0]]], ignore_index=True))
    assert len(read_trace(path).prices) == len(tiny_trace().prices) + 1
