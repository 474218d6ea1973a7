"""`heliotrope providers check`: each configured cloud's credentials and permissions, one
row per check of its registry spec (`CloudSpec.check`), secrets redacted."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import HeliotropeError
from orchestrator.live.clouds.adapters import build_context
from orchestrator.live.clouds.settings import CloudSettings
from orchestrator.signals.sources.redact import Redactor
from providers import registry
from providers.registry import CheckRow, CloudAccess, Result

MAX_REASON_CHARS = 400


@dataclass(frozen=True, slots=True)
class CheckResult:
    provider: str
    check: str
    result: Result
    reason: str

    def row(self) -> dict[str, str]:
        return {
            "provider": self.provider,
            "check": self.check,
            "result": self.result,
            "reason": self.reason,
        }


def check_redactor(settings: CloudSettings) -> Redactor:
    """What a check row must never show: every registered cloud's secret environment
    values, the secrets its configured section points at, and its credentials' shapes."""
    secrets: list[str | None] = []
    for spec in registry.specs():
        secrets += [os.environ.get(n) for n in spec.secret_env]
        if spec.name in settings.providers:
            secrets += spec.secrets(settings.section(spec.name))
    return Redactor(secrets, [p for s in registry.specs() for p in s.secret_patterns])


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MAX_REASON_CHARS]


def _check_one(
    spec: registry.CloudSpec, settings: CloudSettings, clock: Clock, access: CloudAccess
) -> list[CheckRow]:
    """The rows of one cloud's check; one failed `settings` row where its settings or SDK
    are missing."""
    section = settings.section(spec.name)
    ctx = build_context(settings, spec.name, clock, access)
    try:
        return spec.check(spec.build(section, ctx), section, ctx)
    except HeliotropeError as exc:
        return [("settings", "fail", str(exc))]
    except ImportError as exc:
        return [
            (
                "settings",
                "fail",
                f"the {spec.title} SDK is not installed ({exc.name}): "
                f"pip install -e '.[{spec.name}]'",
            )
        ]


def check_providers(
    settings: CloudSettings,
    *,
    clouds: Sequence[str] | None = None,
    clock: Clock | None = None,
    access: CloudAccess | None = None,
) -> list[CheckResult]:
    """Credentials and permissions of each configured cloud, one row per check (its
    registry spec's `check`). A cloud whose settings or SDK are missing gets one failed
    `settings` row; the others are checked all the same."""
    clock = clock or SystemClock()
    access = access or CloudAccess()
    redact = check_redactor(settings)
    return [
        CheckResult(name, check, result, _one_line(redact(reason)))
        for name in clouds or settings.providers
        for check, result, reason in _check_one(registry.spec(name), settings, clock, access)
    ]
