"""The importer skeleton (`importers._common.importer`): a dataset's files are read strictly,
the body fills a fresh part, and every file read is cited in the manifest after it. Runs on
small files of its own, without the shared data."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from orchestrator.errors import InputError
from orchestrator.signals.importers._common import (
    Loaded,
    Part,
    SourceFile,
    grid_values,
    importer,
)

DATA = SourceFile(
    Path("carbon/tiny.csv"),
    "tiny_hourly",
    "CC0",
    "a test",
    ("time", "zone", "g"),
    optional=("note",),
)
SIDE = SourceFile(Path("carbon/side.csv"), "tiny_side", "CC0", "a test", ("zone",))


@importer("tiny", DATA)
def import_tiny(part: Part, data_dir: Path, f: Loaded) -> None:
    if (data_dir / SIDE.path).is_file():
        part.cite(data_dir, SIDE.read(data_dir))  # a side file, cited before the main one
    part.grid, empty = grid_values(
        f.utc("time"), f.text("zone"), "carbon_avg_g_per_kwh", f.number("g"), "tiny"
    )
    part.notes.append(f"{empty} empty values skipped")


def _write(data_dir: Path, rel: Path, text: str) -> None:
    (data_dir / rel).parent.mkdir(parents=True, exist_ok=True)
    (data_dir / rel).write_text(text)


def test_the_body_fills_the_part_and_each_file_is_cited(tmp_path: Path) -> None:
    _write(
        tmp_path,
        DATA.path,
        "time,zone,g,extra\n2024-01-01T00:00Z,NA,100,x\n2024-01-01T01:00Z,NA,,y\n",
    )
    _write(tmp_path, SIDE.path, "zone\nNA\n")
    part = import_tiny(tmp_path)
    assert part.name == "tiny" and import_tiny.files == (DATA,)
    assert list(part.grid["grid_zone"]) == ["NA"]  # Namibia's id stays a string
    assert part.grid["value"].tolist() == [100.0]
    assert part.grid["time"].iloc[0] == pd.Timestamp("2024-01-01T00:00Z")
    assert part.notes == ["1 empty values skipped"]
    assert part.sources == [
        {
            "name": "tiny_side",
            "path": "carbon/side.csv",
            "license": "CC0",
            "rows": 1,
            "origin": "a test",
        },
        {
            "name": "tiny_hourly",
            "path": "carbon/tiny.csv",
            "license": "CC0",
            "rows": 2,
            "origin": "a test",
        },
    ]


def test_a_missing_column_names_the_file_the_column_and_the_fix(tmp_path: Path) -> None:
    _write(tmp_path, DATA.path, "time,zone\n2024-01-01T00:00Z,DE\n")
    with pytest.raises(InputError, match=r"tiny\.csv.*'g'.*restore the 'g' column"):
        import_tiny(tmp_path)


def test_a_bad_value_names_its_line(tmp_path: Path) -> None:
    _write(tmp_path, DATA.path, "time,zone,g\n2024-01-01T00:00Z,DE,1\n2024-01-01T01:00Z,DE,lots\n")
    with pytest.raises(InputError, match=r"line 3, column 'g'.*a number.*'lots'"):
        import_tiny(tmp_path)
