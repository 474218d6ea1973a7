"""Property-based fuzzing of every parser: random JSON, garbled bytes and mutated
recordings never raise anything but our permanent errors (MalformedResponse)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import PermanentError
from orchestrator.signals.sources import carbon, clouds, power
from orchestrator.signals.sources.base import parse_utc
from tests.signals.conftest import NOW
from tests.signals.server import recorded

# HELIOTROPE_FUZZ_EXAMPLES=2000 for a long run
FUZZ = settings(
    max_examples=int(os.environ.get("HELIOTROPE_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(
        [
            "2024-03-31T01:00Z",
            "2024-03-31T01:00:00+01:00",
            "9999-12-31T23:59Z",
            "0001-01-01T00:00Z",
            "2024-03-31T01:00",
            "NaN",
            "-1",
            "1e400",
            "lbs_co2_per_mwh",
            "percentile",
            "megawatthours",
            "DE",
            "GB",
            "OnDemand",
            "Preemptible",
            "Compute",
            "h",
            "GiBy.h",
        ]
    )
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
    ),
    max_leaves=15,
)


def only_ours(fn: Callable[[], Any]) -> None:
    with contextlib.suppress(PermanentError):
        fn()


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.extend(_leaves(v, (*path, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:6]):
            out.extend(_leaves(v, (*path, i)))
    return out


@st.composite
def mutated(draw: st.DrawFn, name: str) -> bytes:
    """A recording with one node replaced, deleted, or the text cut or spliced."""
    raw = recorded(name)
    how = draw(st.sampled_from(["replace", "delete", "cut", "splice"]))
    if how in ("cut", "splice"):
        at = draw(st.integers(0, len(raw)))
        junk = draw(st.binary(max_size=20)) if how == "splice" else b""
        return raw[:at] + junk + (raw[at + draw(st.integers(0, 40)) :] if how == "splice" else b"")
    doc = json.loads(raw)
    paths = [p for p in _leaves(doc) if p]
    path = draw(st.sampled_from(paths))
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    if how == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return json.dumps(doc).encode()


def body_of(value: Any) -> bytes:
    return json.dumps(value).encode()


# name of a recording -> a call of its parser on a body
PARSERS: dict[str, Callable[[bytes], Any]] = {
    "em_history_DE.json": lambda b: carbon.parse_em_history(b, "DE"),
    "em_past_range_DE.json": lambda b: carbon.parse_em_history(b, "DE"),
    "em_latest_DE.json": lambda b: carbon.parse_em_latest(b, "DE"),
    "em_forecast_DE.json": lambda b: carbon.parse_em_forecast(b, "DE"),
    "uk_intensity_range.json": carbon.parse_uk_intensity,
    "wt_historical.json": lambda b: carbon.parse_wt_moer(b, "US-CAL-CISO", forecast=False),
    "wt_forecast.json": lambda b: carbon.parse_wt_moer(b, "US-CAL-CISO", forecast=True),
    "wt_signal_index.json": lambda b: carbon.parse_wt_index(b, "US-CAL-CISO"),
    "eia_fuel_type_page1.json": lambda b: power.eia_intensity(power.eia_page(b)[0], "US-CAL-CISO"),
    "aws_spot_advisor.json": lambda b: clouds.parse_spot_advisor(b, ["us-east-1"], None, NOW),
    "gcp_billing_skus_page1.json": lambda b: clouds.gcp_prices(
        clouds.parse_gcp_sku_page(b)[0], ["us-central1"], list(clouds.GCP_MACHINE_SHAPES), NOW
    ),
    "aws_spot_price_history_page1.json": lambda b: clouds.parse_spot_price_pages(
        [json.loads(b)], "us-east-1", NOW - timedelta(hours=6), NOW, NOW
    ),
    "aws_placement_scores.json": lambda b: clouds.parse_placement_scores(
        [json.loads(b)], "p5.48xlarge", {}, NOW
    ),
}


def _json_only(name: str, body: bytes) -> bool:
    """The AWS parsers take what boto3 decoded, never raw bytes."""
    if not name.startswith("aws_spot_price") and not name.startswith("aws_placement"):
        return True
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


@FUZZ
@given(name=st.sampled_from(sorted(PARSERS)), value=json_values)
def test_random_json_is_rejected_cleanly(name: str, value: Any) -> None:
    only_ours(lambda: PARSERS[name](body_of(value)))


@FUZZ
@given(name=st.sampled_from(sorted(PARSERS)), body=st.binary(max_size=200))
def test_garbage_bytes_are_rejected_cleanly(name: str, body: bytes) -> None:
    if _json_only(name, body):
        only_ours(lambda: PARSERS[name](body))


@FUZZ
@given(data=st.data(), name=st.sampled_from(sorted(PARSERS)))
def test_mutated_recordings_are_parsed_or_rejected_cleanly(data: st.DataObject, name: str) -> None:
    body = data.draw(mutated(name))
    if _json_only(name, body):
        only_ours(lambda: PARSERS[name](body))


@FUZZ
@given(data=st.data())
def test_entsoe_xml_mutations(data: st.DataObject) -> None:
    raw = recorded("entsoe_a44_DE_dst.xml").decode()
    tags = [
        "position",
        "price.amount",
        "resolution",
        "start",
        "end",
        "currency_Unit.name",
        "price_Measure_Unit.name",
    ]
    tag = data.draw(st.sampled_from(tags))
    value = data.draw(
        st.text(max_size=25)
        | st.sampled_from(
            ["0", "-1", "1e309", "NaN", "PT0M", "PT15M", "9999-12-31T23:00Z", "2024-03-31T01:00"]
        )
    )
    pieces = raw.split(f"<{tag}>")
    i = data.draw(st.integers(1, len(pieces) - 1))
    head, _, tail = pieces[i].partition(f"</{tag}>")
    del head
    escaped = value.replace("&", "&amp;").replace("<", "&lt;")
    pieces[i] = f"{escaped}</{tag}>{tail}"
    only_ours(lambda: power.parse_entsoe_prices(f"<{tag}>".join(pieces), "DE"))
    cut = data.draw(st.integers(0, len(raw)))
    only_ours(lambda: power.parse_entsoe_prices(raw[:cut], "DE"))


@FUZZ
@given(
    text=st.text(max_size=300),
    rows=st.lists(
        st.tuples(st.text(max_size=12), st.text(max_size=6), st.text(max_size=8)), max_size=8
    ),
)
def test_caiso_csv_fuzz(text: str, rows: list[tuple[str, str, str]]) -> None:
    only_ours(lambda: power.parse_caiso_report(text, date(2024, 11, 3)))
    csv_text = "DATE,HOUR,CURTAILED MWH\n" + "\n".join(",".join(r) for r in rows)
    only_ours(lambda: power.parse_caiso_report(csv_text, date(2024, 3, 10)))


@FUZZ
@given(
    text=st.text(max_size=30)
    | st.from_regex(r"\d{4}-\d{2}-\d{2}T\d{2}([+-]\d{2})?", fullmatch=True)
)
def test_time_parsers(text: str) -> None:
    only_ours(lambda: power.eia_period_utc(text))
    only_ours(lambda: parse_utc(text, "fuzz", "time"))


# The client libraries' frames (gridstatus, entsoe-py) as our validators receive them: any
# cell values, times with or without a zone, any columns.
cells = (
    st.none()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(10**6), 10**6)
    | st.text(max_size=8)
)


@FUZZ
@given(
    values=st.lists(cells, min_size=1, max_size=6),
    aware=st.booleans(),
    step_h=st.integers(-2, 3),
    location=st.sampled_from(["HUB", "OTHER", 7]),
    drop=st.sampled_from([None, "LMP", "Location", "Interval End"]),
)
def test_library_frames_fuzz(
    values: list[Any], aware: bool, step_h: int, location: Any, drop: str | None
) -> None:
    import pandas as pd

    from orchestrator.signals.sources import isos

    start = pd.Timestamp("2024-03-10T08:00Z")
    times = pd.DatetimeIndex([start + pd.Timedelta(hours=step_h * i) for i in range(len(values))])
    if not aware:
        times = times.tz_localize(None)
    frame = pd.DataFrame(
        {
            "Interval Start": times,
            "Interval End": times + pd.Timedelta("1h"),
            "Location": location,
            "LMP": values,
            "Curtailment MWH": values,
        }
    )
    if drop:
        frame = frame.drop(columns=[drop])
    only_ours(lambda: isos.lmp_obs(frame, "HUB", "Z", "fuzz"))
    only_ours(lambda: isos.curtailment_obs(frame, date(2024, 3, 10), "US/Pacific"))
    generation = pd.DataFrame({"Solar": values, "Fossil Gas": values[::-1]}, index=times)
    only_ours(lambda: power.entsoe_intensity(generation, "DE"))
