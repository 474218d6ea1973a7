"""Live signal sources (DESIGN.md §3 `SignalSource`): prices, spot capacity, carbon and
curtailment read from their real APIs, validated, with observed_at and valid_until.

- `base`: the frame every source returns, `SourceContext` (HTTP, clock, credentials, base
  URLs), validation helpers; `http`: timeouts, retries, redaction; `errors`: what can fail;
- `clouds`: AWS spot price history, placement scores, Spot Advisor, on-demand (Pricing
  API); GCP Cloud Billing Catalog;
- `carbon`: Electricity Maps v3, WattTime v3, UK Carbon Intensity API;
- `power`: ENTSO-E day-ahead prices, EIA-930 generation mix, CAISO curtailment;
- `tracemap`: samples -> trace tables; `keys`: price and spot keys.

`orchestrator.signals.poll` runs them (`poll`, `freshness`, `download`); docs/signals.md
lists each source, the keys it needs, its cadence and units.
"""

from orchestrator.signals.sources.base import (
    FRAME_COLUMNS,
    UNITS,
    FixedClock,
    SignalSource,
    SourceContext,
)
from orchestrator.signals.sources.errors import (
    AuthFailed,
    MalformedResponse,
    MissingCredential,
    RequestRejected,
    SourceUnavailable,
)
from orchestrator.signals.sources.http import HttpClient

__all__ = [
    "FRAME_COLUMNS",
    "UNITS",
    "AuthFailed",
    "FixedClock",
    "HttpClient",
    "MalformedResponse",
    "MissingCredential",
    "RequestRejected",
    "SignalSource",
    "SourceContext",
    "SourceUnavailable",
]
