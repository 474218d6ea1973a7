"""docs/signals.md stays in step with the code: every source listed, and the region -> grid
zone table is the one generated from the catalog."""

from __future__ import annotations

from orchestrator.signals.poll import SOURCE_NAMES, region_zone_markdown, zone_sources
from tests.conftest import REPO

DOC = REPO / "docs" / "signals.md"


def test_every_source_is_documented() -> None:
    text = DOC.read_text()
    for name in SOURCE_NAMES:
        assert f"| `{name}` |" in text, name


def test_region_zone_table_is_generated_from_the_catalog() -> None:
    assert region_zone_markdown() in DOC.read_text(), (
        "regenerate the table: python -c 'from orchestrator.signals.poll import "
        "region_zone_markdown as m; print(m())'"
    )


def test_zone_sources() -> None:
    assert zone_sources("GB") == ["electricitymaps", "uk-carbon"]
    assert "caiso-curtailment" in zone_sources("US-CAL-CISO")
    assert "entsoe-prices" in zone_sources("DE")
