"""`clouds_world`: the configured clouds as the live world (`orchestrator.live.world.World`).

Their offers, the quotes read when it is built as the price prior only; what the policy
decides on each tick is what the signals poller stored
(`orchestrator.signals.view.StoreSignalView`). Live jobs on clouds run code the controller
cannot see, so progress is modelled from throughput (`progress_from_provider=False`).
"""

from __future__ import annotations

import logging

from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import InputError
from orchestrator.live.clouds.adapters import make_providers
from orchestrator.live.clouds.settings import CloudSettings
from orchestrator.live.world import LiveSettings, World
from orchestrator.model import Offer
from providers.multi import MultiProvider
from providers.registry import CloudAccess

logger = logging.getLogger(__name__)


def clouds_world(
    live: LiveSettings,
    settings: CloudSettings,
    *,
    clock: Clock | None = None,
    access: CloudAccess | None = None,
) -> World:
    """The configured clouds as a live world: their offers (those in a region with a
    checkpoint store and a quoted price), on the wall clock, deciding on the state store's
    polled signals with the quotes as the price prior. Progress is modelled from throughput
    (the controller cannot see inside a cloud job)."""
    from orchestrator.signals.view import list_priors

    clock = clock or SystemClock()
    providers = make_providers(settings, clock=clock, access=access)
    multi = MultiProvider(list(providers.values()))
    offers = multi.offers()
    quotes = multi.quotes()
    no_store = sorted(
        {f"{o.cloud}:{o.region}" for o in offers if settings.store_uri(o.cloud, o.region) is None}
    )
    if no_store:
        logger.warning(
            "no checkpoint store for %s: their offers are left out (add them to `checkpoints:`)",
            ", ".join(no_store),
        )
    usable = tuple(
        o for o in offers if settings.store_uri(o.cloud, o.region) is not None and o.id in quotes
    )
    if not usable:
        raise InputError(
            "clouds settings",
            "providers",
            "at least one offer with a price and a checkpoint store",
            got="none",
            fix="run `heliotrope providers check` and fill `checkpoints:`",
        )
    priors = list_priors(usable, live.spot_capacity, {k: q.usd_per_hour for k, q in quotes.items()})

    def store_uri(offer: Offer) -> str:
        uri = settings.store_uri(offer.cloud, offer.region)
        if uri is None:  # only offers with a store are in the world: a bug if it happens
            raise InputError(
                "clouds settings",
                "checkpoints",
                f"a store for {offer.cloud}:{offer.region}",
                got="none",
            )
        return uri

    return World(
        live,
        multi,
        usable,
        clock,
        priors,
        store_uri=store_uri,
        progress_from_provider=False,
        entrypoint=tuple(settings.entrypoint),
        extra={"cluster": settings.cluster, "quotes": quotes},
    )
