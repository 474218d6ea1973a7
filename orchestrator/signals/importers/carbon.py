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
    Loaded,
    Part,
    SourceFile,
    grid_values,
    importer,
    table,
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

# The hourly files' columns are (time, zone, value), in that order (`_hourly`).
_EM_HOURLY: Final = SourceFile(
    EM_HOURLY,
    "electricitymaps_hourly_ci_16zones",
    _ODBL,
    "HewlettPackard/green-dcc data/carbon_intensity @3f6ea95 (MIT repo)",
    ("datetime_utc", "zone_id", "ci_direct_gco2_per_kwh"),
)
_EIA930: Final = SourceFile(
    EIA930,
    "eia930_hourly_genmix_ci_8BAs_2022",
    "public domain (EIA-930, US government); repo MIT",
    "HewlettPackard/dc-rl data/CarbonIntensity @a92b475",
    ("datetime_utc", "em_zone_id_equiv", "avg_ci_gco2_per_kwh"),
)
_LETSWAITAWHILE: Final = SourceFile(
    LETSWAITAWHILE,
    "letswaitawhile_ci_DE_GB_FR_2020",
    "no LICENSE file; the README asks for a citation of Wiesner et al., Middleware'21",
    "dos-group/lets-wait-awhile data/ @5e0d155",
    ("time", "zone", "ci_gco2_per_kwh"),
)
_EM_YEARLY: Final = SourceFile(
    EM_YEARLY,
    "electricitymaps_yearly_zone_averages",
    _ODBL,
    "thegreenwebfoundation/co2.js data/output/electricity-maps @27cbe83 (code Apache-2.0)",
    ("year", "zone_id", "ci_lca_gco2eq_per_kwh"),
)
_GCP_YEARLY: Final = SourceFile(
    GCP_YEARLY,
    "gcp_region_cfe_and_grid_ci_yearly",
    "Apache-2.0",
    "GoogleCloudPlatform/region-carbon-info data/yearly @49f3f26",
    ("year", "gcp_region", "grid_ci_gco2eq_per_kwh"),
)


def _hourly(f: Loaded, source: str, fmt: str = "ISO8601") -> tuple[pd.DataFrame, int]:
    """The grid rows of an hourly file (columns time, zone, value) and how many empty values
    were skipped."""
    time_col, zone_col, value_col = f.file.columns
    value = f.number(value_col)
    return grid_values(f.utc(time_col, fmt), f.text(zone_col), HOURLY, value, source)


@importer("electricitymaps_hourly", _EM_HOURLY)
def import_electricitymaps_hourly(part: Part, data_dir: Path, f: Loaded) -> None:
    part.grid, empty = _hourly(f, "electricitymaps")
    part.notes.append(
        "Electricity Maps hourly: ci_direct (direct operational, consumption-based) is the "
        f"location-based average carbon_avg_g_per_kwh; {empty} empty values skipped. Data "
        "(c) Electricity Maps, ODbL."
    )


@importer("eia930", _EIA930)
def import_eia930(part: Part, data_dir: Path, f: Loaded) -> None:
    part.grid, empty = _hourly(f, "eia930")
    part.notes.append(
        "EIA-930 2022: production-based average intensity (emission factors of the SustainDC "
        "authors, undocumented) as carbon_avg_g_per_kwh, only for zone-hours Electricity Maps "
        f"does not cover; {empty} empty hours skipped."
    )


@importer("letswaitawhile", _LETSWAITAWHILE)
def import_letswaitawhile(part: Part, data_dir: Path, f: Loaded) -> None:
    part.grid, empty = _hourly(f, "letswaitawhile", fmt="%Y-%m-%d %H:%M:%S")
    part.notes.append(
        "Let's Wait Awhile DE/GB/FR 2020: intensity from ENTSO-E production with IPCC factors "
        "(DE 15 min, GB 30 min, FR hourly interpolated to 30 min); timestamps have no zone and "
        "are taken as UTC; used only where Electricity Maps hourly does not cover the time"
        f"{f'; {empty} empty values skipped' if empty else ''}."
    )


def _jan1(f: Loaded) -> pd.Series:
    year = f.number("year", allow_missing=False).astype("int64")
    return pd.to_datetime(year.astype("str") + "-01-01T00:00:00Z", utc=True)


@importer("electricitymaps_yearly", _EM_YEARLY)
def import_electricitymaps_yearly(part: Part, data_dir: Path, f: Loaded) -> None:
    value = f.number("ci_lca_gco2eq_per_kwh")
    part.grid, _ = grid_values(_jan1(f), f.text("zone_id"), YEARLY, value, "electricitymaps")
    part.notes.append(
        "Electricity Maps yearly averages are life-cycle intensities (the file has no direct "
        "column), written at Jan 1 00:00 UTC of their year as carbon_avg_yearly_g_per_kwh."
    )


@importer("gcp_region_yearly", _GCP_YEARLY)
def import_gcp_yearly(part: Part, data_dir: Path, f: Loaded) -> None:
    region = f.text("gcp_region")
    zones = {r: catalog.grid_zone("gcp", r) for r in region.unique()}
    frame = pd.DataFrame(
        {
            "time": _jan1(f),
            "grid_zone": region.map(zones),
            "value": f.number("grid_ci_gco2eq_per_kwh"),
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
