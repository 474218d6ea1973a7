"""poll's source registry: each source class states its name, kind and the terms of its
data itself (a new source is its module plus one line in `poll._SOURCE_CLASSES`)."""

from __future__ import annotations

from orchestrator.model import SignalKind
from orchestrator.signals import poll


def test_every_source_names_its_kind_and_terms() -> None:
    assert len(poll.SOURCE_NAMES) == len(poll._SOURCE_CLASSES)  # no name taken twice
    for name in poll.SOURCE_NAMES:
        cls = poll._CLASSES[name]
        assert isinstance(cls.kind, SignalKind), name
        assert poll.TERMS[name].strip(), f"{name}: no terms for the trace manifest"


def test_the_grid_priority_names_only_registered_sources() -> None:
    assert set(poll.GRID_PRIORITY) <= set(poll.SOURCE_NAMES)
