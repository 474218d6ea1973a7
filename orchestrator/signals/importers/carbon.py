"""Grid carbon intensity: hourly series and yearly averages per Electricity Maps zone.

Hourly (metric ``carbon_avg_g_per_kwh``, location-based average), in order of preference:

1. Electricity Maps 16 zones 2021-2024 (source ``electricitymaps``): ``ci_direct`` (direct,
   consumption-based operational intensity) is used as the average; the life-cycle column
   is not imported.
2. EIA-930 8 US balancing areas 2022 (source ``eia930``): production-based average computed
   by the SustainDC authors. Used only where Electricity Maps has no sample for the same
   zone and hour (in practice BPAT, MISO, AZPS, SOCO).
3. Let's Wait Awhile DE/GB/FR 2020 (source ``letswaitawhile``): ENTSO-E based, 15/30-min
   steps; naive timestamps taken as UTC. Used where Electricity Maps does not cover the time.

The preference is applied by `import_shared_data` (`_common.drop_covered`).

Yearly (metric ``carbon_avg_yearly_g_per_kwh``, one sample at Jan 1 00:00 UTC of the year):
Electricity Maps yearly zone averages (life-cycle) first, then GCP region-carbon-info grid
intensity mapped to the region's grid zone through the catalog (mean over the GCP regions
of one zone).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pandas as pd

from orchestrator import catalog
from orchestrator.signals.importers._common import (
    Part,
    read_csv,
    source_entry,
    table,
    to_number,
    to_text,
    to_utc,
)

EM_HOURLY: Final = Path("carbon/electricitymaps_hourly_ci_16zones_2021_2024.csv.gz")
EIA930: Final = Path("carbon/eia930_hourly_genmix_ci_8BAs_2022.csv.gz")
LETSWAITAWHILE: Final = Path("carbon/letswaitawhile_ci_DE_GB_FR_2020.csv.gz")
EM_YEARLY: Final = Path("carbon/electricitymaps_yearly_zone_averages_2021_2025.csv")
GCP_YEARLY: Final = Path("carbon/gcp_region_cfe_and_grid_ci_yearly_2019_2024.csv")

HOURLY: Final = "carbon_avg_g_per_kwh"
YEARLY: Final = "carbon_avg_yearly_g_per_kwh"
_ODBL: Final = (
    "ODbL (Electricity Maps data portal; attribution and share-alike: credit "
    "Electricity Maps, keep derived databases under ODbL)"
)


def _hourly(
    path: Path,
    raw: pd.DataFrame,
    *,
    time_col: str,
    zone_col: str,
    value_col: str,
    source: str,
    fmt: str = "ISO8601",
) -> tuple[pd.DataFrame, int]:
    value = to_number(path, raw, value_col)
    keep = value.notna().to_numpy()
    frame = table(
        "grid",
        time=to_utc(path, raw, time_col, fmt)[keep],
        grid_zone=to_text(path, raw, zone_col)[keep],
        metric=HOURLY,
        value=value[keep],
        source=source,
    )
    return frame.reset_index(drop=True), int((~keep).sum())


def import_electricitymaps_hourly(data_dir: Path) -> Part:
    path = data_dir / EM_HOURLY
    raw = read_csv(path, ["datetime_utc", "zone_id", "ci_direct_gco2_per_kwh"])
    part = Part(name="electricitymaps_hourly")
    part.grid, empty = _hourly(
        path,
        raw,
        time_col="datetime_utc",
        zone_col="zone_id",
        value_col="ci_direct_gco2_per_kwh",
        source="electricitymaps",
    )
    part.notes.append(
        "Electricity Maps hourly: ci_direct (direct operational, consumption-based) is the "
        f"location-based average carbon_avg_g_per_kwh; {empty} empty values skipped. Data "
        "(c) Electricity Maps, ODbL."
    )
    part.sources.append(
        source_entry(
            "electricitymaps_hourly_ci_16zones",
            data_dir,
            path,
            _ODBL,
            rows=len(raw),
            origin="HewlettPackard/green-dcc data/carbon_intensity @3f6ea95 (MIT repo)",
        )
    )
    return part


def import_eia930(data_dir: Path) -> Part:
    path = data_dir / EIA930
    raw = read_csv(path, ["datetime_utc", "em_zone_id_equiv", "avg_ci_gco2_per_kwh"])
    part = Part(name="eia930")
    part.grid, empty = _hourly(
        path,
        raw,
        time_col="datetime_utc",
        zone_col="em_zone_id_equiv",
        value_col="avg_ci_gco2_per_kwh",
        source="eia930",
    )
    part.notes.append(
        "EIA-930 2022: production-based average intensity (emission factors of the SustainDC "
        "authors, undocumented) as carbon_avg_g_per_kwh, only for zone-hours Electricity Maps "
        f"does not cover; {empty} empty hours skipped."
    )
    part.sources.append(
        source_entry(
            "eia930_hourly_genmix_ci_8BAs_2022",
            data_dir,
            path,
            "public domain (EIA-930, US government); repo MIT",
            rows=len(raw),
            origin="HewlettPackard/dc-rl data/CarbonIntensity @a92b475",
        )
    )
    return part


def import_letswaitawhile(data_dir: Path) -> Part:
    path = data_dir / LETSWAITAWHILE
    raw = read_csv(path, ["time", "zone", "ci_gco2_per_kwh"])
    part = Part(name="letswaitawhile")
    part.grid, empty = _hourly(
        path,
        raw,
        time_col="time",
        zone_col="zone",
        value_col="ci_gco2_per_kwh",
        source="letswaitawhile",
        fmt="%Y-%m-%d %H:%M:%S",
    )
    part.notes.append(
        "Let's Wait Awhile DE/GB/FR 2020: intensity from ENTSO-E production with IPCC factors "
        "(DE 15 min, GB 30 min, FR hourly interpolated to 30 min); timestamps have no zone and "
        "are taken as UTC; used only where Electricity Maps hourly does not cover the time"
        f"{f'; {empty} empty values skipped' if empty else ''}."
    )
    part.sources.append(
        source_entry(
            "letswaitawhile_ci_DE_GB_FR_2020",
            data_dir,
            path,
            "no LICENSE file; the README asks for a citation of Wiesner et al., Middleware'21",
            rows=len(raw),
            origin="dos-group/lets-wait-awhile data/ @5e0d155",
        )
    )
    return part


def _jan1(path: Path, raw: pd.DataFrame) -> pd.Series:
    year = to_number(path, raw, "year", allow_missing=False).astype("int64")
    return pd.to_datetime(year.astype("str") + "-01-01T00:00:00Z", utc=True)


def import_electricitymaps_yearly(data_dir: Path) -> Part:
    path = data_dir / EM_YEARLY
    raw = read_csv(path, ["year", "zone_id", "ci_lca_gco2eq_per_kwh"])
    part = Part(name="electricitymaps_yearly")
    value = to_number(path, raw, "ci_lca_gco2eq_per_kwh")
    keep = value.notna().to_numpy()
    part.grid = table(
        "grid",
        time=_jan1(path, raw)[keep],
        grid_zone=to_text(path, raw, "zone_id")[keep],
        metric=YEARLY,
        value=value[keep],
        source="electricitymaps",
    ).reset_index(drop=True)
    part.notes.append(
        "Electricity Maps yearly averages are life-cycle intensities (the file has no direct "
        "column), written at Jan 1 00:00 UTC of their year as carbon_avg_yearly_g_per_kwh."
    )
    part.sources.append(
        source_entry(
            "electricitymaps_yearly_zone_averages",
            data_dir,
            path,
            _ODBL,
            rows=len(raw),
            origin="thegreenwebfoundation/co2.js data/output/electricity-maps @27cbe83 "
            "(code Apache-2.0)",
        )
    )
    return part


def import_gcp_yearly(data_dir: Path) -> Part:
    path = data_dir / GCP_YEARLY
    raw = read_csv(path, ["year", "gcp_region", "grid_ci_gco2eq_per_kwh"])
    part = Part(name="gcp_region_yearly")
    region = to_text(path, raw, "gcp_region")
    zones = {r: catalog.grid_zone("gcp", r) for r in region.unique()}
    frame = pd.DataFrame(
        {
            "time": _jan1(path, raw),
            "grid_zone": region.map(zones),
            "value": to_number(path, raw, "grid_ci_gco2eq_per_kwh"),
        }
    )
    unmapped = sorted(r for r, z in zones.items() if not z)
    if unmapped:
        part.notes.append(
            f"GCP yearly: regions without a known grid zone skipped: {', '.join(unmapped)}."
        )
    frame = frame.dropna(subset=["grid_zone", "value"])
    means = frame.groupby(["time", "grid_zone"], as_index=False)["value"].mean()
    part.grid = table(
        "grid",
        time=means["time"],
        grid_zone=means["grid_zone"],
        metric=YEARLY,
        value=means["value"],
        source="gcp_region_carbon_info",
    )
    part.notes.append(
        "GCP region-carbon-info yearly grid intensity (2019 life-cycle, later years direct) "
        "mapped to the region's grid zone via the catalog, averaged over the GCP regions of a "
        "zone; used only for (zone, year) pairs the Electricity Maps yearly file lacks."
    )
    part.sources.append(
        source_entry(
            "gcp_region_cfe_and_grid_ci_yearly",
            data_dir,
            path,
            "Apache-2.0",
            rows=len(raw),
            origin="GoogleCloudPlatform/region-carbon-info data/yearly @49f3f26",
        )
    )
    return part
