"""The suites by name, and the policy names a suite run checks before any work."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

from orchestrator.errors import UnknownNameError
from orchestrator.replay.suites.base import ORACLE, SuiteFactory
from orchestrator.replay.suites.carbon_year import carbon_year
from orchestrator.replay.suites.cbl_v100 import cbl_v100
from orchestrator.replay.suites.skynomad_h100 import skynomad_h100
from policies.registry import make_policy

SUITES: Final[Mapping[str, SuiteFactory]] = MappingProxyType(
    {
        "skynomad-h100": skynomad_h100,
        "cbl-v100": cbl_v100,
        "carbon-year": carbon_year,
    }
)


def suite_factory(name: str) -> SuiteFactory:
    factory = SUITES.get(name)
    if factory is None:
        raise UnknownNameError("suite", name, list(SUITES))
    return factory


def policy_names(policies: Sequence[str]) -> tuple[str, ...]:
    """The oracle, then `policies` (registry names, blanks dropped, each once); an unknown
    name fails here, before any work."""
    names = tuple(dict.fromkeys([ORACLE, *(p.strip() for p in policies if p.strip())]))
    for n in names:
        if n != ORACLE:
            make_policy(n)
    return names
