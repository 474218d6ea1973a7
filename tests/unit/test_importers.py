"""Importers on slices of the real shared datasets (``../shared/data``).

Each test copies a few rows of the real files, under their real names, into a temporary data
directory and runs the importer on it; the assertions are facts of those rows. The shared data
path is ``$HELIOTROPE_TRACES`` or ``/work/main/../shared/data``; without it the tests skip.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.errors import InputError
from orchestrator.signals.importers import DATASETS, carbon, import_shared_data, power, prices, spot
from orchestrator.signals.traces import GRID_METRICS, read_trace, write_trace

SHARED = Path(
    os.environ.get(
        "HELIOTROPE_TRACES", str(Path(__file__).resolve().parents[2] / ".." / "shared" / "data")
    )
).resolve()

pytestmark = [
    pytest.mark.traces,
    pytest.mark.skipif(
        not (SHARED / "SOURCES.md").is_file(),
        reason=f"shared datasets not found at {SHARED} (set HELIOTROPE_TRACES to ../shared/data)",
    ),
]

Filter = Callable[[pd.DataFrame], pd.Series]


def real(rel: Path) -> pd.DataFrame:
    """A real dataset file, every value as text (written back unchanged)."""
    return pd.read_csv(SHARED / rel, dtype=str, keep_default_na=False)


def mini(
    data_dir: Path, rel: Path, *, head: int | None = None, where: Filter | None = None
) -> pd.DataFrame:
    """Copy rows of the real file `rel` (the first `head`, or those `where` selects) to
    `data_dir / rel` and return them."""
    frame = real(rel)
    if where is not None:
        frame = frame[where(frame)]
    if head is not None:
        frame = frame.head(head)
    out = data_dir / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)  # gzip when the name ends in .gz
    return frame


def utc(text: str) -> pd.Timestamp:
    return (
        pd.Timestamp(text).tz_convert("UTC")
        if "+" in text or text.endswith("Z")
        else pd.Timestamp(text, tz="UTC")
    )


def rows(frame: pd.DataFrame, **eq: object) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    for col, value in eq.items():
        mask &= (frame[col] == value).to_numpy()
    return frame[mask].sort_values("time").reset_index(drop=True)


# --- prices -------------------------------------------------------------------------------


def test_gcp_history_skips_spot_before_it_existed_and_ends_withdrawn_types(tmp_path: Path) -> None:
    mini(
        tmp_path,
        prices.GCP_HISTORY,
        where=lambda f: (
            ((f.instance_type == "a2-highgpu-1g") & (f.region == "us-central1"))
            | ((f.instance_type == "a3-megagpu-8g") & (f.region == "africa-south1"))
        ),
    )
    mini(tmp_path, prices.GCP_SNAPSHOTS)
    part = prices.import_gcp_prices(tmp_path)
    p = part.prices
    od = rows(p, instance_type="a2-highgpu-1g", market="on_demand")
    # 3.558986 on 2022-02-09, then 3.673385 from 2022-02-16 on (repeats are not written).
    assert list(od["time"]) == [utc("2022-02-09T23:07:12Z"), utc("2022-02-16T22:20:20Z")]
    assert list(od["usd_per_hour"]) == [3.558986, 3.673385]
    assert (od["zone"] == "").all() and (od["region"] == "us-central1").all()
    sp = rows(p, instance_type="a2-highgpu-1g", market="spot")
    assert sp["time"].iloc[0] == utc("2023-05-08T06:42:48Z")  # first snapshot with spot
    assert sp["usd_per_hour"].iloc[0] == 1.1020155
    assert sp["usd_per_hour"].notna().all()  # no NaN written for "no spot yet"
    # a3-megagpu-8g in africa-south1 was seen once (2024-08-17T10:14:16Z): both markets end
    # with NaN at the next snapshot, 2024-08-17T12:36:16Z.
    for market in ("on_demand", "spot"):
        m = rows(p, instance_type="a3-megagpu-8g", market=market)
        assert list(m["time"]) == [utc("2024-08-17T10:14:16Z"), utc("2024-08-17T12:36:16Z")]
        assert np.isnan(m["usd_per_hour"].iloc[1])
    offers = part.offers
    assert set(offers["zone"]) == {"us-central1", "africa-south1"}  # region-level, never "-a"
    assert (offers["zone"] == offers["region"]).all()


def test_aws_snapshot_prices_from_the_start_per_zone_id(tmp_path: Path) -> None:
    head = mini(tmp_path, prices.AWS_SNAPSHOT, head=6)
    part = prices.import_aws_prices(tmp_path)
    assert (part.prices["time"] == utc("2020-01-01T00:00:00Z")).all()
    first = head.iloc[0]  # g5.12xlarge, ap-east-1, ape1-az1
    spot_row = rows(
        part.prices,
        zone=first["availability_zone_id"],
        instance_type=first["instance_type"],
        market="spot",
    )
    assert spot_row["usd_per_hour"].tolist() == [float(first["spot_usd_per_hour"])]
    od = rows(
        part.prices,
        region=first["region"],
        zone="",
        instance_type=first["instance_type"],
        market="on_demand",
    )
    assert od["usd_per_hour"].tolist() == [float(first["ondemand_usd_per_hour"])]
    assert set(part.offers["zone"]) == set(head["availability_zone_id"])
    assert any("single undated catalog snapshot" in n for n in part.notes)


# --- spot ----------------------------------------------------------------------------------

CBL_1A = "cbl/availability/1-node/aws-02-15-2023/us-east-1a_v100_1"


def test_cbl_segments_become_a_utc_change_log_ending_in_nan(tmp_path: Path) -> None:
    mini(tmp_path, spot.SEGMENTS_META)
    seg = mini(tmp_path, spot.SEGMENTS, where=lambda f: f.trace_id == CBL_1A, head=4)
    part = spot.import_spot_segments(tmp_path)
    s = rows(part.spot, zone="us-east-1a", instance_type="p3.2xlarge")
    start = utc("2023-02-15T00:00:00Z")  # start date at 00:00 UTC
    # Segments 0-47970 s: 0, 47970-48555: 1, 48555-49725: 0, 49725-51090: 1; then unknown.
    assert list(s["time"]) == [
        start,
        start + pd.Timedelta(seconds=47970),  # 13:19:30Z
        start + pd.Timedelta(seconds=48555),
        start + pd.Timedelta(seconds=49725),
        start + pd.Timedelta(seconds=int(seg["end_offset_s"].iloc[-1])),
    ]
    assert s["capacity"].tolist()[:4] == [0.0, 1.0, 0.0, 1.0]
    assert np.isnan(s["capacity"].iloc[4])
    assert (s["cloud"] == "aws").all()
    # Only availability traces give offers; SpotHedge (no start date) is skipped with a note.
    offers = part.offers
    assert ((offers["zone"] == "us-east-1a") & (offers["instance_type"] == "p3.2xlarge")).any()
    assert not offers["instance_type"].str.startswith("r5").any()
    assert any("no start date" in n and "spothedge/GCP1" in n for n in part.notes)


def test_bamboo_counts_with_a_zone_become_capacity_rows(tmp_path: Path) -> None:
    mini(tmp_path, spot.COUNTS_META)
    mini(tmp_path, spot.COUNTS, head=4)  # g4dn.xlarge in us-east-1c from 2020-11-20 19:30
    part = spot.import_instance_counts(tmp_path)
    s = rows(part.spot, zone="us-east-1c", instance_type="g4dn.xlarge")
    start = utc("2020-11-20T19:30:00Z")
    # 0 at t=0; 0 then 4 at 21529 s (the last count at a repeated time wins); NaN at the
    # end named in the trace (2020-11-21 22:00).
    assert list(s["time"]) == [
        start,
        start + pd.Timedelta(seconds=21529),
        utc("2020-11-21T22:00:00Z"),
    ]
    assert s["capacity"].tolist()[:2] == [0.0, 4.0]
    assert np.isnan(s["capacity"].iloc[2])
    assert any("parcae/p3trace" in n for n in part.notes)


def test_skynomad_gcp_availability_and_zone_prices(tmp_path: Path) -> None:
    got = mini(tmp_path, spot.SKYNOMAD_GCP, where=lambda f: f.zone == "us-west1-b", head=300)
    part = spot.import_skynomad_gcp(tmp_path)
    s = rows(part.spot, zone="us-west1-b", instance_type="a3-highgpu-8g")
    avail = got["available"].astype(float).to_numpy()
    changes = np.flatnonzero(np.r_[True, avail[1:] != avail[:-1]])
    assert list(s["time"][:-1]) == [utc(t) for t in got["time_utc"].iloc[changes]]
    assert s["capacity"].tolist()[:-1] == avail[changes].tolist()
    assert s["time"].iloc[-1] == utc(got["time_utc"].iloc[-1]) + pd.Timedelta(minutes=10)
    assert np.isnan(s["capacity"].iloc[-1])
    spot_price = rows(part.prices, zone="us-west1-b", market="spot")
    assert spot_price["usd_per_hour"].iloc[0] == pytest.approx(18.979008)
    assert spot_price["time"].iloc[0] == utc("2025-10-04T00:10:00Z")
    assert np.isnan(spot_price["usd_per_hour"].iloc[-1])  # the zone override ends
    assert part.offers[["zone", "region", "instance_type"]].values.tolist() == [
        ["us-west1-b", "us-west1", "a3-highgpu-8g"]
    ]


def test_skynomad_aws_spot_price_on_cbl_ticks_only_when_it_changes(tmp_path: Path) -> None:
    got = mini(tmp_path, spot.SKYNOMAD_AWS, where=lambda f: f.zone == "us-east-1a", head=2000)
    part = spot.import_skynomad_aws_prices(tmp_path)
    p = rows(part.prices, zone="us-east-1a", instance_type="p3.2xlarge", market="spot")
    price = got["spot_usd_per_hour"].astype(float).to_numpy()
    changes = np.flatnonzero(np.r_[True, price[1:] != price[:-1]])
    ticks = got["tick"].astype(int).to_numpy()[changes]
    start = utc("2023-02-15T00:00:00Z")
    assert list(p["time"][:-1]) == [start + pd.Timedelta(seconds=195 * int(k)) for k in ticks]
    assert p["usd_per_hour"].iloc[0] == 1.6703
    assert p["time"].iloc[-1] == start + pd.Timedelta(seconds=195 * 2000)
    assert np.isnan(p["usd_per_hour"].iloc[-1])
    assert (p["region"] == "us-east-1").all()


# --- carbon --------------------------------------------------------------------------------


def test_eia930_only_for_zone_hours_electricity_maps_lacks(tmp_path: Path) -> None:
    hours = {"2022-01-01T00:00:00Z", "2022-01-01T01:00:00Z", "2022-01-01T02:00:00Z"}
    mini(tmp_path, carbon.EM_HOURLY, where=lambda f: f.datetime_utc.isin(hours))
    mini(tmp_path, carbon.EIA930, where=lambda f: f.datetime_utc.isin(hours))
    trace = import_shared_data(tmp_path)
    g = trace.grid[trace.grid["metric"] == "carbon_avg_g_per_kwh"]
    eia = g[g["source"] == "eia930"]
    assert set(eia["grid_zone"]) == {"US-SW-AZPS", "US-NW-BPAT", "US-MIDW-MISO", "US-SE-SOCO"}
    assert len(eia) == 4 * 3
    ciso = rows(g, grid_zone="US-CAL-CISO")
    assert set(ciso["source"]) == {"electricitymaps"} and len(ciso) == 3
    assert not g.duplicated(["time", "grid_zone"]).any()


def test_letswaitawhile_is_utc_and_yields_to_electricity_maps(tmp_path: Path) -> None:
    mini(
        tmp_path,
        carbon.LETSWAITAWHILE,
        where=lambda f: f.time.str.startswith(("2019-12-20 00:", "2021-01-09 10:")),
    )
    mini(
        tmp_path,
        carbon.EM_HOURLY,
        where=lambda f: f.datetime_utc.str.startswith("2021-01-09T10") & (f.zone_id == "DE"),
    )
    trace = import_shared_data(tmp_path)
    g = trace.grid
    lwa = g[g["source"] == "letswaitawhile"]
    first_de = rows(lwa, grid_zone="DE").iloc[0]
    assert first_de["time"] == utc("2019-12-20T00:00:00Z") and first_de["value"] == 218.29
    # On 2021-01-09 10:xx Electricity Maps covers DE, so Let's Wait Awhile's DE samples go;
    # FR has no Electricity Maps series and keeps its samples.
    late = lwa[lwa["time"] >= utc("2021-01-09T00:00:00Z")]
    assert "DE" not in set(late["grid_zone"]) and "FR" in set(late["grid_zone"])


def test_yearly_values_at_jan_1_with_electricity_maps_preferred(tmp_path: Path) -> None:
    mini(tmp_path, carbon.EM_YEARLY, where=lambda f: f.zone_id.isin(["NA", "BE", "FI"]))
    mini(
        tmp_path,
        carbon.GCP_YEARLY,
        where=lambda f: f.gcp_region.isin(["europe-west1", "europe-north1"]),
    )
    trace = import_shared_data(tmp_path)
    y = trace.grid[trace.grid["metric"] == "carbon_avg_yearly_g_per_kwh"]
    assert set(y["grid_zone"]) == {"NA", "BE", "FI"}  # "NA" is Namibia, not a missing value
    be = rows(y, grid_zone="BE")
    assert be["time"].iloc[0] == utc("2019-01-01T00:00:00Z")
    by_year = dict(zip(be["time"].dt.year, be["source"], strict=True))
    assert by_year[2019] == by_year[2020] == "gcp_region_carbon_info"
    assert {by_year[y_] for y_ in range(2021, 2026)} == {"electricitymaps"}
    assert rows(be, source="electricitymaps")["value"].iloc[0] == 179.0  # 2021, life-cycle


# --- curtailment and power prices ------------------------------------------------------------


def test_caiso_hour_ending_pacific_to_utc_with_zeros_on_report_days(tmp_path: Path) -> None:
    mini(
        tmp_path,
        power.CAISO,
        where=lambda f: f.report_date.isin(["2016-07-04", "2016-11-06", "2017-03-12"]),
    )
    part = power.import_caiso_curtailment(tmp_path)
    g = part.grid
    assert (g["grid_zone"] == "US-CAL-CISO").all() and (g["metric"] == "curtailment_mw").all()
    day = g[(g["time"] >= utc("2016-07-04T07:00:00Z")) & (g["time"] < utc("2016-07-05T07:00:00Z"))]
    assert len(day) == 24
    value = dict(zip(day["time"], day["value"], strict=True))
    assert value[utc("2016-07-04T07:00:00Z")] == 0.0  # HE 1 (PDT): no curtailment row
    assert value[utc("2016-07-04T10:00:00Z")] == 11.0  # HE 4: wind 11 MWh
    assert value[utc("2016-07-04T14:00:00Z")] == 241.0  # HE 8: solar 214 + wind 27
    # DST days: 25 hours on 2016-11-06, 23 on 2017-03-12; nothing for days without report.
    assert (
        (g["time"] >= utc("2016-11-06T07:00:00Z")) & (g["time"] < utc("2016-11-07T08:00:00Z"))
    ).sum() == 25
    assert (
        (g["time"] >= utc("2017-03-12T08:00:00Z")) & (g["time"] < utc("2017-03-13T07:00:00Z"))
    ).sum() == 23
    assert len(g) == 24 + 25 + 23


def test_caiso_winter_hour_ending_one_is_eight_utc() -> None:
    got = power.caiso_hour_start_utc(
        pd.Series(pd.to_datetime(["2016-12-01", "2016-07-01"])), pd.Series([1, 1])
    )
    assert list(got) == [utc("2016-12-01T08:00:00Z"), utc("2016-07-01T07:00:00Z")]


def test_wholesale_negative_de_price_kept_and_zones_mapped(tmp_path: Path) -> None:
    mini(tmp_path, power.WHOLESALE_USD, where=lambda f: f.datetime_utc.eq("2023-07-02T13:00:00Z"))
    mini(tmp_path, power.ZONE_LIST)
    part = power.import_wholesale_usd(tmp_path)
    g = part.grid.set_index("grid_zone")["value"]
    assert g["DE"] == -484.399  # DE-LU -> DE, negative price kept
    assert {"BR-CS", "CL-SEN"} <= set(g.index) and not {"DE-LU", "BR-SP", "CL-SIC"} & set(g.index)
    raw = real(power.WHOLESALE_USD)
    au = float(
        raw[(raw.datetime_utc == "2023-07-02T13:00:00Z") & (raw.zone == "AU-NSW")][
            "price_usd_per_mwh"
        ].iloc[0]
    )
    assert g["AU-NSW"] == pytest.approx(au * power.AUD_TO_USD)  # AUD labelled USD


def test_gb_prices_from_eur_file(tmp_path: Path) -> None:
    mini(
        tmp_path,
        power.WHOLESALE_LOCAL,
        where=lambda f: (
            f.zone.isin(["GB", "GB_incompleted", "DE-LU"])
            & f.datetime_as_published.str.startswith(("2020-01-01", "2020-03-29", "2020-10-25"))
        ),
    )
    part = power.import_gb_prices(tmp_path)
    g = part.grid.sort_values("time")
    assert set(g["grid_zone"]) == {"GB"}
    # 2020-01-01 00:00 French local time (CET) is 2019-12-31 23:00 UTC; 46.94 EUR/MWh.
    assert g["time"].iloc[0] == utc("2019-12-31T23:00:00Z")
    assert g["value"].iloc[0] == pytest.approx(46.94 * power.EUR_TO_USD)
    assert not g["time"].duplicated().any()


# --- errors and the whole import ----------------------------------------------------------------


def test_missing_column_names_file_and_column(tmp_path: Path) -> None:
    frame = mini(tmp_path, carbon.EIA930, head=5).drop(columns=["avg_ci_gco2_per_kwh"])
    frame.to_csv(tmp_path / carbon.EIA930, index=False)
    with pytest.raises(InputError) as err:
        import_shared_data(tmp_path)
    assert "eia930_hourly_genmix_ci_8BAs_2022.csv.gz" in str(err.value)
    assert "'avg_ci_gco2_per_kwh'" in str(err.value)


def test_unparsable_value_names_line_and_column(tmp_path: Path) -> None:
    frame = mini(tmp_path, power.CAISO, head=5)
    frame.loc[frame.index[2], "curtailed_mwh"] = "lots"
    frame.to_csv(tmp_path / power.CAISO, index=False)
    with pytest.raises(
        InputError, match=r"caiso_wind_solar.*line 4, column 'curtailed_mwh'.*'lots'"
    ):
        power.import_caiso_curtailment(tmp_path)


def test_missing_dir_raises_and_missing_dataset_is_a_note(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such directory"):
        import_shared_data(tmp_path / "absent")
    with pytest.raises(InputError, match="at least one dataset"):
        import_shared_data(tmp_path)
    mini(tmp_path, power.CAISO, head=3)
    labels: list[str] = []
    trace = import_shared_data(tmp_path, progress=labels.append)
    assert labels == [d.label for d in DATASETS] + ["Merging"]
    notes = trace.manifest["notes"]
    assert any(n.startswith("GCP price history: skipped, missing") for n in notes)
    assert [s["name"] for s in trace.manifest["sources"]] == ["caiso_wind_solar_curtailment_hourly"]


def test_full_import_round_trips(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    trace = import_shared_data(SHARED)
    elapsed = time.perf_counter() - t0
    out = write_trace(trace, tmp_path / "trace")
    back = read_trace(out)
    assert elapsed < 60.0
    assert len(back.grid) == len(trace.grid) > 1_500_000
    assert set(back.grid["metric"]) == set(GRID_METRICS) - {"carbon_marginal_g_per_kwh"}
    manifest = back.manifest
    assert manifest["generator"] == "import"
    names = {s["name"] for s in manifest["sources"]}
    assert {
        "gcp_gpu_vm_price_history",
        "electricitymaps_hourly_ci_16zones",
        "spot_traces_segments",
        "caiso_wind_solar_curtailment_hourly",
    } <= names
    assert all(s["license"] and s["rows"] > 0 for s in manifest["sources"])
    assert not any("skipped, missing" in n for n in manifest["notes"])
    offers = back.offers
    h100 = offers[
        (offers["instance_type"] == "a3-highgpu-8g") & (offers["region"] == "us-central1")
    ]
    assert set(h100["zone"]) == {"us-central1-a", "us-central1-b", "us-central1-c"}
    assert set(h100["gpu_type"]) == {"H100"} and set(h100["gpu_count"]) == {8}
    assert not (offers["zone"].str.len() == 0).any()
    assert (
        offers["zone"].str.match(r"^[a-z]+-[a-z]+\d+$") == (offers["zone"] == offers["region"])
    ).all()
