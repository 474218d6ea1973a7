"""`GcpProvider`: spot and on-demand GPU instances on Compute Engine.

How the contract (providers/base.py) is kept:

- Idempotent launch. Everything a launch sends derives from (project, cluster, request id)
  (see `naming`): the instance name, the insert `requestId` (uuid5) and the labels. A launch
  first `get`s each instance by its name and inserts only the missing ones, so a retried
  launch, a controller restarted mid-launch, or two controllers racing buy one gang. A gang
  that fails half way is deleted again (only the members it made), so a failed launch
  leaves nothing that bills.
- Failures are data. HTTP errors and zone operations that finish with `error.errors[]`
  become `LaunchOutcome(error=...)` via `errors.py`; throttling and 5xx are retried here
  (tenacity, `reraise=True`, the injected sleep) and nowhere else.
- Ownership. An instance is ours when its label `heliotrope-cluster` is our cluster's label
  value, its metadata `heliotrope-cluster` is exactly our cluster and its name is one we
  make. `list_instances` asks Compute Engine for that label only and checks all three again;
  `terminate` `get`s every instance first and deletes only what passes the check, and so
  does `console_output` before it reads a serial port. Nothing else is ever stopped,
  deleted, relabelled or read.
- Events. `poll_events` reads `compute.instances.preempted` operations in our zones and
  reports each preempted gang once, as PREEMPTED (a gang goes down together: when one
  member is preempted, the gang's job has lost its instance). The provider remembers the
  instances it launched or listed; after a restart it learns them again from
  `aggregatedList`, so a preemption of an instance it has never seen (launched and deleted
  while it was down) is not reported — the job's missing instance is, by `list_instances`.

Spot instances are launched with `provisioningModel=SPOT` and
`instanceTerminationAction=DELETE` (a preempted VM is deleted, its boot disk with it, so it
stops billing); on-demand ones with `STANDARD`. GPU machines cannot live-migrate, so both
use `onHostMaintenance=TERMINATE`. The job receives its environment through the
`startup-script` metadata (never a credential: see `naming.refused_env_names`).

Times (`launched_at_s`, events) come from Compute Engine's timestamps; waiting uses the
injected clock and sleep, so tests never sleep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from orchestrator import catalog
from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import HeliotropeError, InputError, TransientError
from orchestrator.model import InstanceId, Market, Offer, OfferId
from providers.base import (
    Capability,
    EventType,
    FailureKind,
    InstanceInfo,
    InstanceState,
    LaunchOutcome,
    LaunchSpec,
    ProviderEvent,
    ProviderFailure,
    Quote,
)
from providers.gang import (
    Node,
    all_or_none,
    command,
    environment,
    foreign_member,
    invalid_offer,
    member_going,
    offer_parts,
    roll_back,
)
from providers.gcp import errors, naming
from providers.gcp.billing import (
    BILLING_ENDPOINT,
    DEFAULT_TTL_S,
    SOURCE_BILLING,
    SOURCE_LIST_PRICE,
    BillingCatalog,
    PriceQuote,
)
from providers.gcp.naming import Gang

if TYPE_CHECKING:
    import requests
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import Credentials
    from google.cloud import compute_v1
    from tenacity import RetryCallState

logger = logging.getLogger(__name__)

CLOUD: Final = "gcp"
# Accelerator-optimized series we buy: A2 (A100), A3 (H100/H200), G2 (L4). RE2 syntax,
# matched against the whole name (Compute Engine list filters, `eq` form).
MACHINE_TYPE_FILTER: Final = 'name eq "(a2|a3|g2)-.*"'
PREEMPTED_OPERATION: Final = "compute.instances.preempted"
DEFAULT_IMAGE: Final = (
    "projects/deeplearning-platform-release/global/images/family/"
    "common-cu128-ubuntu-2204-nvidia-570"
)
CLOUD_PLATFORM_SCOPE: Final = "https://www.googleapis.com/auth/cloud-platform"
_BOOTING: Final = frozenset({"PROVISIONING", "STAGING", "REPAIRING"})
_DOWN: Final = frozenset({"STOPPING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED"})

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GcpLaunchConfig:
    """How instances are built; everything a person may want to change per deployment.

    `external_ip=False` (the default) gives instances no public address: they reach Google
    APIs (Cloud Storage checkpoints) through Private Google Access and the internet through
    Cloud NAT, and the adapter needs no `compute.subnetworks.useExternalIp`.
    `service_account` attaches a service account to the instance (the job's own identity
    for gs:// checkpoints); it needs `iam.serviceAccounts.actAs` on that account and
    `compute.instances.setServiceAccount` added to the role (see docs/providers.md).
    `entrypoint` is the command started when a launch spec gives none.
    """

    boot_image: str = DEFAULT_IMAGE
    boot_disk_gb: int = 200
    boot_disk_type: str = "pd-balanced"
    network: str = "global/networks/default"
    subnetwork: str | None = None  # "regions/<region>/subnetworks/<name>"; None: the network's
    external_ip: bool = False
    service_account: str | None = None
    entrypoint: Sequence[str] = ()
    operation_timeout_s: float = 600.0
    poll_interval_s: float = 2.0


@dataclass(frozen=True, slots=True)
class _MachineType:
    vcpus: int
    memory_mb: int


@dataclass(frozen=True, slots=True)
class _Target:
    zone: str
    region: str
    machine_type: str
    market: Market


@dataclass(frozen=True, slots=True)
class _Known:
    gang: Gang
    job_id: str


class GcpProvider:
    """Compute Engine GPU instances for one cluster, in a fixed set of zones of one project."""

    name = CLOUD

    def __init__(
        self,
        *,
        cluster: str,
        project: str,
        zones: Sequence[str],
        credentials: Credentials | None = None,
        client_options: ClientOptions | Mapping[str, Any] | None = None,
        transport: str = "rest",
        clock: Clock | None = None,
        billing_api_key: str | None = None,
        launch_config: GcpLaunchConfig | None = None,
        billing_endpoint: str = BILLING_ENDPOINT,
        billing_ttl_s: float = DEFAULT_TTL_S,
        billing_session: requests.Session | None = None,
        sleep: Callable[[float], None] | None = None,
        max_attempts: int = 5,
        offers_ttl_s: float = 3600.0,
    ) -> None:
        if not cluster:
            raise ValueError("cluster must not be empty")
        if not zones:
            raise ValueError("give at least one zone")
        self.cluster = cluster
        self.project = project
        self.zones = tuple(dict.fromkeys(zones))
        self._credentials = credentials
        self._client_options = client_options
        self._transport = transport
        self._clock: Clock = clock or SystemClock()
        self._sleep = sleep or self._clock.sleep
        self._config = launch_config or GcpLaunchConfig()
        self._max_attempts = max_attempts
        self._offers_ttl_s = offers_ttl_s
        self._billing = BillingCatalog(
            billing_api_key,
            clock=self._clock,
            endpoint=billing_endpoint,
            ttl_s=billing_ttl_s,
            session=billing_session,
        )
        self._cluster_label = naming.label_value(cluster)
        self._instances_client: compute_v1.InstancesClient | None = None
        self._operations_client: compute_v1.ZoneOperationsClient | None = None
        self._machine_types_client: compute_v1.MachineTypesClient | None = None
        self._offers: tuple[Offer, ...] = ()
        self._offers_expire_s = float("-inf")
        self._shapes: dict[tuple[str, str], _MachineType] = {}
        self._known: dict[tuple[str, str], _Known] = {}  # (zone, member) -> its gang
        self._reported_gangs: set[InstanceId] = set()
        self._seen_operations: set[str] = set()

    # -- contract ------------------------------------------------------------------------
    def capabilities(self) -> frozenset[Capability]:
        return frozenset(
            {
                Capability.SPOT,
                Capability.ON_DEMAND,
                Capability.PREEMPTION_NOTICE,
                Capability.PRICES,
                Capability.LOGS,
            }
        )

    def offers(self) -> Sequence[Offer]:
        """A2, A3 and G2 machine types sold in our zones, each on both markets. Cached for
        `offers_ttl_s`. Raises TransientError or PermanentError when Compute Engine fails."""
        now_s = self._now_s()
        if now_s < self._offers_expire_s:
            return self._offers
        from google.cloud import compute_v1

        client = self._machine_types()
        found: list[Offer] = []
        for zone in self.zones:
            request = compute_v1.ListMachineTypesRequest(
                project=self.project, zone=zone, filter=MACHINE_TYPE_FILTER
            )
            try:
                machine_types = self._api_list(partial(client.list, request=request, retry=None))
            except _call_errors() as exc:
                raise _as_error(exc) from exc
            region = catalog.region_of_zone(CLOUD, zone)
            for mt in machine_types:
                gpus = catalog.instance_gpus(CLOUD, mt.name)
                if gpus is None or mt.deprecated.state in ("DEPRECATED", "OBSOLETE", "DELETED"):
                    continue
                self._shapes[(zone, mt.name)] = _MachineType(mt.guest_cpus, mt.memory_mb)
                for market in (Market.SPOT, Market.ON_DEMAND):
                    found.append(
                        Offer(
                            id=Offer.make_id(CLOUD, zone, mt.name, market),
                            cloud=CLOUD,
                            region=region,
                            zone=zone,
                            instance_type=mt.name,
                            gpu_type=gpus[0],
                            gpu_count=gpus[1],
                            market=market,
                            grid_zone=catalog.grid_zone(CLOUD, region) or "unknown",
                            power_kw=catalog.instance_power_kw(*gpus),
                            pue=catalog.pue(CLOUD),
                        )
                    )
        self._offers = tuple(sorted(found, key=lambda o: o.id))
        self._offers_expire_s = now_s + self._offers_ttl_s
        return self._offers

    def prices(self) -> dict[OfferId, PriceQuote]:
        """The hourly price of each offer: Cloud Billing Catalog rates where the key works
        and all parts are priced, else the catalog's on-demand list price (for spot offers,
        an upper bound). Offers with neither are left out."""
        rates = self._billing.rates()
        quotes: dict[OfferId, PriceQuote] = {}
        for offer in self.offers():
            shape = self._shapes.get((offer.zone, offer.instance_type))
            usd = None
            if rates is not None and shape is not None:
                usd = rates.machine_usd_per_hour(
                    offer.instance_type,
                    offer.region,
                    offer.market,
                    gpu_count=offer.gpu_count,
                    vcpus=shape.vcpus,
                    memory_gib=shape.memory_mb / 1024.0,
                )
            if usd is not None:
                quotes[offer.id] = PriceQuote(round(usd, 6), SOURCE_BILLING)
                continue
            list_price = catalog.on_demand_usd_per_hour(CLOUD, offer.instance_type)
            if list_price is not None:
                quotes[offer.id] = PriceQuote(list_price, SOURCE_LIST_PRICE)
        return quotes

    def quotes(self) -> dict[OfferId, Quote]:
        """`prices()` as `Quote`s (`Capability.PRICES`)."""
        return {k: Quote(q.usd_per_hour, q.source) for k, q in self.prices().items()}

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]:
        """Our gangs, whatever their state (a broken gang is listed so it can be cleaned
        up). Another cluster's instances are invisible: this provider serves one cluster."""
        if cluster != self.cluster:
            logger.warning(
                "list_instances for cluster %r: this provider serves %r only", cluster, self.cluster
            )
            return {}
        by_gang: dict[Gang, list[compute_v1.Instance]] = {}
        for zone, instance in self._list_ours():
            gang = naming.gang_of_member(zone, instance.name)
            if gang is not None:
                by_gang.setdefault(gang, []).append(instance)
        return {
            gang.instance_id: self._info(gang, members)
            for gang, members in sorted(by_gang.items(), key=lambda kv: kv[0].instance_id)
        }

    def launch(self, spec: LaunchSpec, *, request_id: str) -> LaunchOutcome:
        target = self._target(spec)
        if isinstance(target, ProviderFailure):
            return LaunchOutcome(None, error=target)
        refused = naming.refused_env_names(spec.env)
        if refused:
            return LaunchOutcome(
                None,
                error=ProviderFailure(
                    FailureKind.INVALID,
                    f"environment {', '.join(refused)}: looks like a credential or is not a shell "
                    "name; Heliotrope never writes secrets into instance metadata (give the job a "
                    "service account or read the secret from Secret Manager)",
                ),
            )
        gang = naming.gang_for(
            project=self.project,
            cluster=self.cluster,
            request_id=request_id,
            zone=target.zone,
            count=spec.count,
        )
        failure = all_or_none(
            gang_id=gang.instance_id,
            spec=spec,
            request_id=request_id,
            start=lambda: self._launch_gang(gang, target, spec, request_id),
            roll_back=lambda: self._roll_back(gang, request_id),
            call_errors=_call_errors(),
            failure_of=errors.failure_from_exception,
        )
        if failure is not None:
            return LaunchOutcome(None, error=failure)
        for member in gang.members:
            self._known[(gang.zone, member)] = _Known(gang, spec.job_id)
        return LaunchOutcome(gang.instance_id, ready_at_s=self._now_s() + spec.startup_s)

    def terminate(self, ids: Sequence[InstanceId], *, request_id: str) -> None:
        """Delete the gangs named by `ids`, member by member, each only after a `get` shows
        it is ours. Unknown ids and instances already gone are skipped (idempotent). Waits
        for the deletions; raises TransientError or PermanentError if one fails."""
        from google.api_core import exceptions as api_exceptions
        from google.cloud import compute_v1

        client = self._instances()
        pending: list[tuple[str, str, compute_v1.Operation]] = []
        first_error: HeliotropeError | None = None
        for instance_id in ids:
            gang = naming.parse_instance_id(instance_id)
            if gang is None:
                logger.warning(
                    "terminate: %r is not a GCP instance id of ours; skipped", instance_id
                )
                continue
            for member in gang.members:
                try:
                    instance = self._get(gang.zone, member)
                    if instance is None:
                        continue
                    if not self._owned(instance):
                        logger.warning(
                            "terminate: %s/%s is not labelled for cluster %r; not deleting it",
                            gang.zone,
                            member,
                            self.cluster,
                        )
                        continue
                    request = compute_v1.DeleteInstanceRequest(
                        project=self.project,
                        zone=gang.zone,
                        instance=member,
                        request_id=naming.request_uuid(request_id, gang.zone, member, "delete"),
                    )
                    op = self._api(partial(client.delete_unary, request=request, retry=None))
                    pending.append((gang.zone, member, op))
                except api_exceptions.NotFound:
                    continue
                except _call_errors() as exc:
                    first_error = first_error or _as_error(exc)
            self._reported_gangs.add(gang.instance_id)  # what we end is not a preemption
        for zone, member, op in pending:
            try:
                done = self._wait(zone, op)
            except _call_errors() as exc:
                first_error = first_error or _as_error(exc)
                continue
            failure = self._operation_failure(done)
            if failure is not None and failure.kind is not FailureKind.INVALID:
                first_error = first_error or errors.as_error(failure)
            else:
                self._known.pop((zone, member), None)
                logger.info("deleted %s/%s (request %s)", zone, member, request_id)
        if first_error is not None:
            raise first_error

    def poll_events(self) -> list[ProviderEvent]:
        """PREEMPTED once per preempted gang of ours, from `compute.instances.preempted`
        operations, in time order. Raises TransientError or PermanentError when Compute
        Engine fails (nothing is lost: unreported operations are read again next time)."""
        from google.cloud import compute_v1

        self._list_ours()  # learn instances launched before a restart
        client = self._operations()
        zones = dict.fromkeys([*self.zones, *(zone for zone, _ in self._known)])
        events: list[ProviderEvent] = []
        for zone in zones:
            request = compute_v1.ListZoneOperationsRequest(
                project=self.project, zone=zone, filter=f'operationType = "{PREEMPTED_OPERATION}"'
            )
            try:
                operations = self._api_list(partial(client.list, request=request, retry=None))
            except _call_errors() as exc:
                raise _as_error(exc) from exc
            for op in operations:
                key = str(op.id) if op.id else op.name
                if key in self._seen_operations or op.operation_type != PREEMPTED_OPERATION:
                    continue
                member = op.target_link.rsplit("/", 1)[-1]
                known = self._known.get((zone, member))
                if known is None:
                    continue  # not ours, or never seen: leave it
                self._seen_operations.add(key)
                gang_id = known.gang.instance_id
                if gang_id in self._reported_gangs:
                    continue
                self._reported_gangs.add(gang_id)
                when = op.insert_time or op.start_time or op.end_time
                events.append(
                    ProviderEvent(
                        EventType.PREEMPTED,
                        gang_id,
                        known.job_id,
                        _timestamp_s(when) if when else self._now_s(),
                        f"{zone}/{member}: {op.status_message or 'preempted'}",
                    )
                )
        events.sort(key=lambda e: e.time_s)
        for event in events:
            logger.info("preempted %s (job %s): %s", event.instance_id, event.job_id, event.detail)
        return events

    def console_output(self, instance_id: InstanceId) -> str:
        """`Capability.LOGS`: what the gang's first node (rank 0) wrote to serial port 1
        so far (`instances.getSerialPortOutput`; Compute Engine keeps the newest 1 MB), ""
        while there is none. Read only after a `get` shows the instance is ours (label,
        metadata and name, as `terminate` checks); any other id, or one whose instance is
        gone (its console went with it), raises `InputError`."""
        from google.api_core import exceptions as api_exceptions

        gang = naming.parse_instance_id(instance_id)
        try:
            first = self._get(gang.zone, gang.members[0]) if gang is not None else None
            if gang is None or first is None or not self._owned(first):
                raise InputError(
                    "gcp provider",
                    "instance",
                    f"a live instance of cluster {self.cluster} in project {self.project}",
                    got=f"{instance_id} (not ours, or deleted: its console went with it)",
                    fix="`heliotrope events JOB` names the instances Heliotrope launched",
                )
            from google.cloud import compute_v1

            client = self._instances()
            request = compute_v1.GetSerialPortOutputInstanceRequest(
                project=self.project, zone=gang.zone, instance=gang.members[0], port=1
            )
            out = self._api(partial(client.get_serial_port_output, request=request, retry=None))
        except api_exceptions.NotFound as exc:  # deleted between the get and the read
            raise InputError(
                "gcp provider", "instance", "a live instance", got=f"{instance_id} (deleted)"
            ) from exc
        except _call_errors() as exc:
            if isinstance(exc, HeliotropeError):
                raise
            raise _as_error(exc) from exc
        return str(out.contents or "")

    # -- launch --------------------------------------------------------------------------
    def _target(self, spec: LaunchSpec) -> _Target | ProviderFailure:
        parsed = offer_parts(
            spec,
            cloud=CLOUD,
            cluster=self.cluster,
            form="gcp:<zone>:<machine type>:<spot|on_demand>",
        )
        if isinstance(parsed, ProviderFailure):
            return parsed
        zone, machine_type, market = parsed
        if zone not in self.zones:
            return invalid_offer(spec, f"zone {zone} is not one of {', '.join(self.zones)}")
        if catalog.instance_gpus(CLOUD, machine_type) is None:
            return invalid_offer(spec, f"{machine_type} is not a GPU machine type Heliotrope knows")
        return _Target(zone, catalog.region_of_zone(CLOUD, zone), machine_type, market)

    def _launch_gang(
        self, gang: Gang, target: _Target, spec: LaunchSpec, request_id: str
    ) -> ProviderFailure | None:
        from google.api_core import exceptions as api_exceptions
        from google.cloud import compute_v1

        client = self._instances()
        for rank, member in enumerate(gang.members):
            existing = self._get(gang.zone, member)
            if existing is not None:
                what = f"instance {gang.zone}/{member}"
                if not self._made_by(existing, request_id):
                    return foreign_member(what, request_id, self.cluster)
                if existing.status in _DOWN:
                    return member_going(what, existing.status, errors.TRANSIENT_RETRY_AFTER_S)
                logger.info(
                    "launch: %s/%s already exists (retried request %s)",
                    gang.zone,
                    member,
                    request_id,
                )
                continue
            request = compute_v1.InsertInstanceRequest(
                project=self.project,
                zone=gang.zone,
                instance_resource=self._instance_body(gang, member, rank, target, spec, request_id),
                request_id=naming.request_uuid(self.project, gang.zone, member, "insert"),
            )
            try:
                op = self._api(partial(client.insert_unary, request=request, retry=None))
            except api_exceptions.Conflict:  # made by a racing attempt of the same request
                again = self._get(gang.zone, member)
                if again is None or not self._owned(again):
                    raise
                continue
            failure = self._operation_failure(self._wait(gang.zone, op))
            if failure is not None:
                return failure
        return None

    def _instance_body(
        self,
        gang: Gang,
        member: str,
        rank: int,
        target: _Target,
        spec: LaunchSpec,
        request_id: str,
    ) -> compute_v1.Instance:
        from google.cloud import compute_v1

        cfg = self._config
        spot = target.market is Market.SPOT
        shape = catalog.instance_gpus(CLOUD, target.machine_type)
        # Rank 0's zonal internal DNS name (Compute Engine "Internal DNS").
        node = Node(
            gang.instance_id,
            rank,
            gang.count,
            shape[1] if shape is not None else 1,
            f"{gang.members[0]}.{target.zone}.c.{self.project}.internal",
        )
        env = environment(
            spec,
            node,
            cluster=self.cluster,
            request_id=request_id,
            region=target.region,
            zone=target.zone,
            # the job watches instance/preempted
            extra={"HELIOTROPE_NOTICE_SOURCE": "gcp"} if spot else None,
        )
        entrypoint = command(
            tuple(spec.entrypoint) or tuple(cfg.entrypoint),
            node,
            spec.launcher,
            request_id=request_id,
        )
        metadata = {
            naming.META_STARTUP_SCRIPT: naming.startup_script(env, entrypoint),
            naming.META_CLUSTER: self.cluster,
            naming.META_JOB: spec.job_id,
            naming.META_REQUEST: request_id,
            naming.META_STARTUP_S: repr(float(spec.startup_s)),
        }
        interface = compute_v1.NetworkInterface(network=cfg.network)
        if cfg.subnetwork:
            interface.subnetwork = cfg.subnetwork
        if cfg.external_ip:
            interface.access_configs = [
                compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")
            ]
        body = compute_v1.Instance(
            name=member,
            machine_type=f"zones/{target.zone}/machineTypes/{target.machine_type}",
            labels={
                naming.LABEL_CLUSTER: self._cluster_label,
                naming.LABEL_JOB: naming.label_value(spec.job_id),
                naming.LABEL_REQUEST: naming.label_value(request_id),
                naming.LABEL_GANG: gang.name,
            },
            metadata=compute_v1.Metadata(
                items=[compute_v1.Items(key=k, value=v) for k, v in metadata.items()]
            ),
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=cfg.boot_image,
                        disk_size_gb=cfg.boot_disk_gb,
                        disk_type=f"zones/{target.zone}/diskTypes/{cfg.boot_disk_type}",
                    ),
                )
            ],
            network_interfaces=[interface],
            scheduling=compute_v1.Scheduling(
                provisioning_model="SPOT" if spot else "STANDARD",
                on_host_maintenance="TERMINATE",  # GPU machines cannot live-migrate
                automatic_restart=not spot,
            ),
        )
        if spot:
            body.scheduling.instance_termination_action = "DELETE"
        if cfg.service_account:
            body.service_accounts = [
                compute_v1.ServiceAccount(email=cfg.service_account, scopes=[CLOUD_PLATFORM_SCOPE])
            ]
        return body

    def _roll_back(self, gang: Gang, request_id: str) -> None:
        """Delete the members of a failed gang that this request made (best effort: what
        is left is ours, labelled, and shows up in list_instances)."""
        from google.cloud import compute_v1

        client = self._instances()

        def delete(name: str) -> None:
            request = compute_v1.DeleteInstanceRequest(
                project=self.project,
                zone=gang.zone,
                instance=name,
                request_id=naming.request_uuid(request_id, gang.zone, name, "rollback"),
            )
            self._api(partial(client.delete_unary, request=request, retry=None))

        def made_here(name: str) -> bool:
            instance = self._get(gang.zone, name)
            return instance is not None and self._made_by(instance, request_id)

        roll_back(
            gang.members,
            request_id=request_id,
            made_here=made_here,
            delete=delete,
            name=lambda name: f"{gang.zone}/{name}",
            call_errors=_call_errors(),
            reason=lambda exc: errors.failure_from_exception(exc).message,
        )

    def _made_by(self, instance: compute_v1.Instance, request_id: str) -> bool:
        return self._owned(instance) and _metadata(instance).get(naming.META_REQUEST) == request_id

    # -- reading -------------------------------------------------------------------------
    def _list_ours(self) -> list[tuple[str, compute_v1.Instance]]:
        """(zone, instance) for every instance that passes `_owned`, across all zones."""
        from google.cloud import compute_v1

        client = self._instances()
        request = compute_v1.AggregatedListInstancesRequest(
            project=self.project,
            filter=f'labels.{naming.LABEL_CLUSTER} = "{self._cluster_label}"',
        )
        try:
            scopes = self._api_list(partial(client.aggregated_list, request=request, retry=None))
        except _call_errors() as exc:
            raise _as_error(exc) from exc
        ours: list[tuple[str, compute_v1.Instance]] = []
        for _, scoped in scopes:
            for instance in scoped.instances:
                zone = instance.zone.rsplit("/", 1)[-1]
                if not self._owned(instance):
                    continue
                gang = naming.gang_of_member(zone, instance.name)
                if gang is None:
                    continue
                ours.append((zone, instance))
                self._known.setdefault((zone, instance.name), _Known(gang, _job_id(instance)))
        return ours

    def _info(self, gang: Gang, members: list[compute_v1.Instance]) -> InstanceInfo:
        first = members[0]
        spot = first.scheduling.provisioning_model == "SPOT"
        machine_type = first.machine_type.rsplit("/", 1)[-1]
        statuses = {m.status for m in members}
        if len(members) < gang.count or statuses & _DOWN:
            state = InstanceState.PREEMPTED if spot else InstanceState.TERMINATED
        elif statuses == {"RUNNING"}:
            state = InstanceState.RUNNING
        else:
            state = InstanceState.BOOTING
        launched_s = min(_timestamp_s(m.creation_timestamp) for m in members)
        try:
            startup_s = float(_metadata(first).get(naming.META_STARTUP_S, "0"))
        except ValueError:
            startup_s = 0.0
        return InstanceInfo(
            id=gang.instance_id,
            offer_id=Offer.make_id(
                CLOUD, gang.zone, machine_type, Market.SPOT if spot else Market.ON_DEMAND
            ),
            job_id=_job_id(first),
            state=state,
            launched_at_s=launched_s,
            ready_at_s=launched_s + startup_s,
        )

    def _owned(self, instance: compute_v1.Instance) -> bool:
        zone = instance.zone.rsplit("/", 1)[-1] if instance.zone else ""
        return (
            instance.labels.get(naming.LABEL_CLUSTER) == self._cluster_label
            and _metadata(instance).get(naming.META_CLUSTER) == self.cluster
            and naming.gang_of_member(zone, instance.name) is not None
        )

    def _get(self, zone: str, name: str) -> compute_v1.Instance | None:
        from google.api_core import exceptions as api_exceptions

        client = self._instances()
        try:
            return self._api(
                partial(client.get, project=self.project, zone=zone, instance=name, retry=None)
            )
        except api_exceptions.NotFound:
            return None

    # -- operations ------------------------------------------------------------------------
    def _wait(self, zone: str, op: compute_v1.Operation) -> compute_v1.Operation:
        """Wait for a zone operation (`zoneOperations.wait` returns when it is done or after
        about two minutes), up to `operation_timeout_s`."""
        from google.cloud import compute_v1

        client = self._operations()
        deadline_s = self._now_s() + self._config.operation_timeout_s
        while op.status != compute_v1.Operation.Status.DONE:
            if self._now_s() >= deadline_s:
                raise TransientError(
                    f"operation {op.name} in {zone} not done after "
                    f"{self._config.operation_timeout_s:g} s",
                    retry_after_s=errors.TRANSIENT_RETRY_AFTER_S,
                )
            op = self._api(
                partial(client.wait, project=self.project, zone=zone, operation=op.name, retry=None)
            )
            if op.status != compute_v1.Operation.Status.DONE:
                self._sleep(self._config.poll_interval_s)
        return op

    @staticmethod
    def _operation_failure(op: compute_v1.Operation) -> ProviderFailure | None:
        errs = [(e.code, e.message) for e in op.error.errors]
        return errors.failure_from_operation(
            errs, http_status=op.http_error_status_code or None, operation=op.name
        )

    # -- plumbing ------------------------------------------------------------------------
    def _api(self, call: Callable[[], T]) -> T:
        """One Compute Engine call, repeated on throttling and 5xx (tenacity, exponential
        backoff, the injected sleep, the last error re-raised)."""
        from tenacity import (
            Retrying,
            retry_if_exception,
            stop_after_attempt,
            wait_exponential,
        )

        retrying = Retrying(
            stop=stop_after_attempt(self._max_attempts),
            wait=wait_exponential(multiplier=1.0, min=1.0, max=30.0),
            retry=retry_if_exception(errors.is_retryable),
            sleep=self._sleep,
            reraise=True,
            before_sleep=_log_retry,
        )
        return retrying(call)

    def _api_list(self, call: Callable[[], Iterable[T]]) -> list[T]:
        """A list call, all pages read inside the retry (a pager fetches lazily)."""
        return self._api(lambda: list(call()))

    def _client_kwargs(self) -> dict[str, Any]:
        return {
            "credentials": self._credentials,
            "client_options": self._client_options,
            "transport": self._transport,
        }

    def _instances(self) -> compute_v1.InstancesClient:
        if self._instances_client is None:
            from google.cloud import compute_v1

            self._instances_client = compute_v1.InstancesClient(**self._client_kwargs())
        return self._instances_client

    def _operations(self) -> compute_v1.ZoneOperationsClient:
        if self._operations_client is None:
            from google.cloud import compute_v1

            self._operations_client = compute_v1.ZoneOperationsClient(**self._client_kwargs())
        return self._operations_client

    def _machine_types(self) -> compute_v1.MachineTypesClient:
        if self._machine_types_client is None:
            from google.cloud import compute_v1

            self._machine_types_client = compute_v1.MachineTypesClient(**self._client_kwargs())
        return self._machine_types_client

    def _now_s(self) -> float:
        return self._clock.now().timestamp()


def _call_errors() -> tuple[type[BaseException], ...]:
    """What a Compute Engine call may raise: HTTP, credential and connection errors, and
    our own (an operation that timed out)."""
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions
    from requests import exceptions as requests_exceptions

    return (
        HeliotropeError,
        api_exceptions.GoogleAPIError,
        auth_exceptions.GoogleAuthError,
        requests_exceptions.RequestException,
    )


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    why = errors.failure_from_exception(exc).message if exc is not None else "?"
    logger.info("compute engine call failed (attempt %s), retrying: %s", state.attempt_number, why)


def _as_error(exc: BaseException) -> HeliotropeError:
    if isinstance(exc, HeliotropeError):
        return exc
    return errors.as_error(errors.failure_from_exception(exc))


def _metadata(instance: compute_v1.Instance) -> dict[str, str]:
    return {item.key: item.value for item in instance.metadata.items}


def _job_id(instance: compute_v1.Instance) -> str:
    return _metadata(instance).get(naming.META_JOB) or instance.labels.get(naming.LABEL_JOB, "")


def _timestamp_s(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp as Compute Engine writes them."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
