"""`MultiProvider`: several clouds behind one `ComputeProvider`.

The controller talks to one provider; this one routes every call to the adapter that owns
what the call is about, and never hands an adapter something another adapter reported:

- offers are the union of the adapters' offers. An offer belongs to the adapter whose
  `name` is the offer's `cloud` (`aws`, `gcp`, ...); an offer an adapter reports under
  another cloud's name is left out (logged).
- `launch` goes to the adapter of the offer's cloud (the offer as last listed, else the
  `<cloud>:` prefix of its id). An offer of a cloud no adapter serves is refused as data
  (`INVALID`), like any other bad launch.
- Instance ids are remembered with the adapter that reported them: from its launches, its
  `list_instances` and its `poll_events`. `terminate` hands each id to that adapter only.
  An id nobody has reported yet (a controller restarted from its store) is first looked
  for with each adapter's `list_instances` of the cluster it serves; an id still unclaimed,
  or claimed by two adapters, is logged and skipped: no adapter is ever asked to end an
  instance it did not report. (Each adapter checks ownership again by its own tags or
  labels.)
- `list_instances` and `poll_events` are merged; events in time order.
- `console_output` (`Capability.LOGS`, listed when one adapter has it) goes to the adapter
  that reported the id, found as for `terminate`. An id still unclaimed (an instance gone
  since) is asked of each adapter that reads consoles: reading ends nothing, and each
  adapter reads only instances of its own cluster.

Failures: a failing adapter must not blind the controller to the others where that is
safe. `offers` and `poll_events` skip an adapter that raises a `HeliotropeError` (logged;
the adapters lose no event by a failed poll: they report it next time) and raise only when
every adapter failed. `list_instances` raises on any failure: a partial list would make live
instances look gone. `terminate` tries every adapter, then raises the first error.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping, Sequence

from orchestrator.errors import HeliotropeError, InputError
from orchestrator.model import InstanceId, Offer, OfferId
from providers.base import (
    Capability,
    ComputeProvider,
    FailureKind,
    InstanceInfo,
    LaunchOutcome,
    LaunchSpec,
    ProviderEvent,
    ProviderFailure,
    Quote,
    priced,
    with_capacity,
    with_logs,
)

logger = logging.getLogger(__name__)

__all__ = ["MultiProvider", "Quote", "cloud_of_offer_id", "quotes_of"]


def quotes_of(provider: ComputeProvider) -> dict[OfferId, Quote]:
    """The prices an adapter knows, as `Quote`s: its `quotes()` when it lists
    `Capability.PRICES`, else none. Each quote says where it came from (AWS:
    `DescribeSpotPriceHistory`, `pricing:GetProducts`, `catalog`; GCP: `billing-catalog`,
    `list-price`; ...). A NaN price is left out."""
    p = priced(provider)
    if p is None:
        return {}
    return {
        k: Quote(float(q.usd_per_hour), q.source)
        for k, q in p.quotes().items()
        if not math.isnan(q.usd_per_hour)
    }


def cloud_of_offer_id(offer_id: OfferId) -> str:
    """The cloud an offer id names (`aws:us-east-1a:g6.xlarge:spot` -> `aws`)."""
    return offer_id.split(":", 1)[0]


class MultiProvider:
    """One `ComputeProvider` over several adapters, one per cloud (see the module doc)."""

    def __init__(self, providers: Sequence[ComputeProvider]) -> None:
        if not providers:
            raise InputError("providers", "", "at least one provider", got="none")
        by_cloud: dict[str, ComputeProvider] = {}
        for p in providers:
            if p.name in by_cloud:
                raise InputError(
                    "providers",
                    p.name,
                    "one provider per cloud",
                    got=f"two named {p.name!r}",
                    fix="list each cloud once",
                )
            by_cloud[p.name] = p
        self._by_cloud = by_cloud
        self.name = "+".join(by_cloud)
        self._lock = threading.RLock()
        self._offer_cloud: dict[OfferId, str] = {}
        self._owner: dict[InstanceId, str] = {}  # instance id -> cloud that reported it
        self._ambiguous: set[InstanceId] = set()  # reported by two clouds: never touched
        self._cluster: str | None = None

    @property
    def providers(self) -> Mapping[str, ComputeProvider]:
        """The adapters, by cloud name."""
        return dict(self._by_cloud)

    def provider_for_offer(self, offer_id: OfferId) -> ComputeProvider | None:
        with self._lock:
            cloud = self._offer_cloud.get(offer_id) or cloud_of_offer_id(offer_id)
        return self._by_cloud.get(cloud)

    def owner_of(self, instance_id: InstanceId) -> str | None:
        """The cloud whose adapter reported `instance_id` (None: unknown or ambiguous)."""
        with self._lock:
            if instance_id in self._ambiguous:
                return None
            return self._owner.get(instance_id)

    # -- contract -------------------------------------------------------------------------
    def capabilities(self) -> frozenset[Capability]:
        """What at least one adapter can do (each offer is served by its own cloud's)."""
        caps: frozenset[Capability] = frozenset({Capability.PRICES, Capability.CAPACITY})
        for p in self._by_cloud.values():
            caps |= p.capabilities()
        return caps - {Capability.PREEMPT}  # `preempt` is an adapter's own, never routed

    def offers(self) -> Sequence[Offer]:
        found: list[Offer] = []
        seen: dict[OfferId, str] = {}
        first_error: HeliotropeError | None = None
        failed = 0
        for cloud, p in self._by_cloud.items():
            try:
                offers = p.offers()
            except HeliotropeError as exc:
                logger.error("offers of %s unavailable: %s", cloud, exc)
                first_error = first_error or exc
                failed += 1
                continue
            for offer in offers:
                if offer.cloud != cloud:
                    logger.warning(
                        "provider %s reported offer %s of cloud %s; left out",
                        cloud,
                        offer.id,
                        offer.cloud,
                    )
                    continue
                if offer.id in seen:
                    continue
                seen[offer.id] = cloud
                found.append(offer)
        if failed == len(self._by_cloud) and first_error is not None:
            raise first_error
        with self._lock:
            self._offer_cloud.update(seen)
        return tuple(sorted(found, key=lambda o: o.id))

    def quotes(self) -> dict[OfferId, Quote]:
        """Prices of every adapter that prices its offers, with their sources."""
        out: dict[OfferId, Quote] = {}
        for cloud, p in self._by_cloud.items():
            try:
                quotes = quotes_of(p)
            except HeliotropeError as exc:
                logger.error("prices of %s unavailable: %s", cloud, exc)
                continue
            out.update({k: q for k, q in quotes.items() if cloud_of_offer_id(k) == cloud})
        return out

    def prices(self) -> dict[OfferId, float]:
        """USD per hour (whole instance) of every offer with a known price."""
        return {k: q.usd_per_hour for k, q in self.quotes().items()}

    def capacity(self) -> dict[OfferId, int]:
        """Instances obtainable now, of the offers of adapters that say
        (`Capability.CAPACITY`); offers of the others are absent (unknown)."""
        out: dict[OfferId, int] = {}
        for cloud, p in self._by_cloud.items():
            counting = with_capacity(p)
            if counting is None:
                continue
            try:
                counts = counting.capacity()
            except HeliotropeError as exc:
                logger.error("capacity of %s unavailable: %s", cloud, exc)
                continue
            out.update({k: n for k, n in counts.items() if cloud_of_offer_id(k) == cloud})
        return out

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]:
        merged: dict[InstanceId, InstanceInfo] = {}
        with self._lock:
            self._cluster = cluster
        for cloud, p in self._by_cloud.items():
            listed = p.list_instances(cluster=cluster)
            self._claim(cloud, listed)
            for instance_id, info in listed.items():
                if self.owner_of(instance_id) == cloud:
                    merged[instance_id] = info
        return merged

    def launch(self, spec: LaunchSpec, *, request_id: str) -> LaunchOutcome:
        provider = self.provider_for_offer(spec.offer_id)
        if provider is None:
            why = (
                f"offer {spec.offer_id!r}: no provider for cloud "
                f"{cloud_of_offer_id(spec.offer_id)!r} (configured: "
                f"{', '.join(self._by_cloud)})"
            )
            logger.warning("launch %s refused: %s", request_id, why)
            return LaunchOutcome(None, error=ProviderFailure(FailureKind.INVALID, why))
        with self._lock:
            self._cluster = spec.cluster
        outcome = provider.launch(spec, request_id=request_id)
        if outcome.instance_id is not None:
            self._claim(provider.name, [outcome.instance_id])
        return outcome

    def terminate(self, ids: Sequence[InstanceId], *, request_id: str) -> None:
        wanted = [i for i in dict.fromkeys(ids) if i]
        with self._lock:
            unknown = [i for i in wanted if i not in self._owner and i not in self._ambiguous]
        if unknown:
            self._learn()
        by_cloud: dict[str, list[InstanceId]] = {}
        for instance_id in wanted:
            cloud = self.owner_of(instance_id)
            if cloud is None:
                logger.warning(
                    "terminate %s (request %s): no provider reported this instance%s; skipped",
                    instance_id,
                    request_id,
                    " (two did)" if instance_id in self._ambiguous else "",
                )
                continue
            by_cloud.setdefault(cloud, []).append(instance_id)
        first_error: HeliotropeError | None = None
        for cloud, chunk in by_cloud.items():
            try:
                self._by_cloud[cloud].terminate(chunk, request_id=request_id)
            except HeliotropeError as exc:
                logger.error("terminate on %s failed: %s", cloud, exc)
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def poll_events(self) -> list[ProviderEvent]:
        events: list[ProviderEvent] = []
        first_error: HeliotropeError | None = None
        failed = 0
        for cloud, p in self._by_cloud.items():
            try:
                polled = p.poll_events()
            except HeliotropeError as exc:
                logger.error("events of %s unavailable this time: %s", cloud, exc)
                first_error = first_error or exc
                failed += 1
                continue
            self._claim(cloud, [e.instance_id for e in polled])
            events.extend(e for e in polled if self.owner_of(e.instance_id) == cloud)
        if failed == len(self._by_cloud) and first_error is not None:
            raise first_error
        events.sort(key=lambda e: e.time_s)  # stable: each adapter's order is kept
        return events

    def console_output(self, instance_id: InstanceId) -> str:
        """The console text of `instance_id`, from the adapter that reported it. An id no
        adapter reported (a gone instance is no longer listed) is asked of each adapter
        that reads consoles: each reads only its own cluster's instances and refuses the
        rest (`InputError`), so at most one answers; reading changes nothing."""
        with self._lock:
            known = instance_id in self._owner or instance_id in self._ambiguous
        if not known:
            self._learn()
        if instance_id in self._ambiguous:
            raise InputError(
                "providers",
                "instance",
                "an id one provider reported",
                got=f"{instance_id} (two did)",
            )
        cloud = self.owner_of(instance_id)
        if cloud is not None:
            reading = with_logs(self._by_cloud[cloud])
            if reading is None:
                raise InputError(
                    "providers",
                    cloud,
                    "a provider that reads instance consoles (aws, gcp)",
                    got=f"{cloud}, which does not",
                    fix=f"read {instance_id}'s output with {cloud}'s own tools",
                )
            return reading.console_output(instance_id)
        refusals: list[str] = []
        for name, p in self._by_cloud.items():
            reading = with_logs(p)
            if reading is None:
                continue
            try:
                return reading.console_output(instance_id)
            except InputError as exc:
                refusals.append(f"{name}: {exc}")
        raise InputError(
            "providers",
            "instance",
            f"an instance of this cluster on {', '.join(self._by_cloud)}",
            got=f"{instance_id}" + (f" ({'; '.join(refusals)})" if refusals else ""),
            fix="`heliotrope events JOB` names the instances Heliotrope launched",
        )

    # -- internals ------------------------------------------------------------------------
    def _learn(self) -> None:
        """Ask every adapter for its cluster's instances (ids reported before a restart).
        Each adapter is asked for the cluster it serves (`cluster` attribute), else for the
        cluster of the last launch or listing; one that fails is skipped (logged)."""
        for cloud, p in self._by_cloud.items():
            cluster = getattr(p, "cluster", None) or self._cluster
            if not isinstance(cluster, str) or not cluster:
                continue
            try:
                self._claim(cloud, p.list_instances(cluster=cluster))
            except HeliotropeError as exc:
                logger.warning("cannot list instances of %s to route a terminate: %s", cloud, exc)

    def _claim(self, cloud: str, ids: Iterable[InstanceId]) -> None:
        with self._lock:
            for instance_id in ids:
                if not instance_id or instance_id in self._ambiguous:
                    continue
                owner = self._owner.setdefault(instance_id, cloud)
                if owner != cloud:
                    logger.error(
                        "instance id %s reported by both %s and %s; neither will be "
                        "asked to touch it",
                        instance_id,
                        owner,
                        cloud,
                    )
                    self._ambiguous.add(instance_id)
                    del self._owner[instance_id]
