"""`AzureProvider`: Spot and on-demand GPU VMs on Azure (azure-mgmt-compute, lazily imported).

How the contract (providers/base.py) is kept:

- Idempotent launch. A VM's name is a pure function of (subscription, resource group,
  cluster, request id) (`providers.gcp.naming`'s scheme: `hel-<20 hex>`, a gang of N is
  `<gang>-0 .. <gang>-<N-1>`). A launch first `GET`s each member by name and creates only the
  missing ones, with `If-None-Match: *`, so a PUT can never turn into an update of a VM that
  already exists (ARM answers 412); a retried launch, a restarted controller or two racing
  controllers buy one gang. A gang that fails half way has the members this request made
  deleted again (ARM keeps a VM whose allocation failed, in state `Failed`, until deleted).
- Failures are data: `errors.py` maps ARM error codes, from the HTTP call or from the
  long-running operation, to `ProviderFailure`s; throttling and 5xx are retried here
  (tenacity, the injected sleep) and azure-core's own retries are off (`retry_total=0`).
- Ownership. A VM is ours when its tag `heliotrope-cluster` is exactly our cluster, its tag
  `heliotrope-request` is set and its name is one we make. `list_instances` reads the
  resource group and keeps only those; `terminate` `GET`s every member first and deletes
  only what passes. A foreign VM in the same resource group is never listed, changed or
  deleted.
- Preemption. Spot VMs are created with `priority: Spot`, `evictionPolicy: Delete` and
  `billingProfile.maxPrice: -1` (pay up to the on-demand price, never evicted for price):
  an evicted VM goes away with its NIC and OS disk (all `deleteOption: Delete`) and stops
  billing. `poll_events` reports a gang of ours that disappeared (or is `Deleting`) without
  Heliotrope deleting it as PREEMPTED, once. Inside the VM, the training SDK reads the 30 s
  notice from Scheduled Events (`providers.azure.notices`, `HELIOTROPE_NOTICE_SOURCE=azure`).

VMs get no public IP: the NIC is created by Compute itself
(`networkProfile.networkInterfaceConfigurations`, `networkApiVersion`) in the subnet
configured for the region. The job's environment reaches the VM as `customData` (a shell
script cloud-init runs at first boot; never a credential).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from orchestrator import catalog
from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import HeliotropeError, InputError, TransientError
from orchestrator.model import InstanceId, Market, Offer, OfferId
from providers.azure import checks, errors, regions
from providers.azure.checks import CheckRow
from providers.azure.prices import (
    DEFAULT_TTL_S,
    RETAIL_PRICES_ENDPOINT,
    SOURCE_LIST_PRICE,
    SOURCE_RETAIL,
    PriceQuote,
    RetailPriceCatalog,
)
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
from providers.gcp import naming
from providers.gcp.naming import Gang

if TYPE_CHECKING:
    import requests
    from azure.core.credentials import TokenCredential
    from azure.core.pipeline.transport import HttpTransport
    from azure.core.polling import LROPoller
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.compute.models import VirtualMachine
    from tenacity import RetryCallState

logger = logging.getLogger(__name__)

CLOUD: Final = "azure"
# HELIOTROPE_NOTICE_SOURCE on Spot VMs: the training SDK's AzureScheduledEvents.name (not
# imported here: the SDK's package imports torch; tests/providers/test_registry.py keeps
# the two equal through the spec's notice_source).
NOTICE_SOURCE: Final = CLOUD
ARM_SCOPE: Final = "https://management.azure.com/.default"
TAG_CLUSTER: Final = "heliotrope-cluster"
TAG_JOB: Final = "heliotrope-job"
TAG_REQUEST: Final = "heliotrope-request"
TAG_GANG: Final = "heliotrope-gang"
TAG_STARTUP_S: Final = "heliotrope-startup-s"
TAG_VALUE_MAX: Final = 256  # Azure tag values
NETWORK_API_VERSION: Final = "2022-11-01"  # Microsoft.Network API Compute creates NICs with
# Ubuntu 22.04 with the NVIDIA driver, CUDA and InfiniBand drivers (Azure HPC images).
DEFAULT_IMAGE: Final = "microsoft-dsvm:ubuntu-hpc:2204:latest"
_BOOTING: Final = frozenset({"Creating", "Updating", "Migrating"})
_DOWN: Final = frozenset({"Deleting", "Failed", "Canceled"})

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AzureLaunchConfig:
    """How VMs are built.

    `subnet_ids` maps each region to the subnet its VMs' NICs join (a subnet is regional;
    a region without one cannot be launched in). `ssh_public_key` is the admin user's key
    (password login is off); `managed_identity` the resource id of a user-assigned identity
    to attach (the job's own identity for checkpoints; it needs
    `Microsoft.ManagedIdentity/userAssignedIdentities/assign/action` added to the role).
    `image` is a marketplace image URN `publisher:offer:sku:version`.
    """

    subnet_ids: Mapping[str, str] = field(default_factory=dict)
    ssh_public_key: str = ""
    admin_username: str = "heliotrope"
    image: str = DEFAULT_IMAGE
    os_disk_gb: int = 256
    os_disk_type: str = "Premium_LRS"
    accelerated_networking: bool = True
    managed_identity: str | None = None
    entrypoint: Sequence[str] = ()
    operation_timeout_s: float = 900.0
    poll_interval_s: float = 5.0


@dataclass(frozen=True, slots=True)
class _Target:
    region: str
    size: str
    market: Market


@dataclass(frozen=True, slots=True)
class _Known:
    gang: Gang
    job_id: str
    spot: bool


class AzureProvider:
    """Azure GPU VMs of one cluster, in one resource group, in a fixed set of regions."""

    name = CLOUD

    def __init__(
        self,
        *,
        cluster: str,
        subscription_id: str,
        resource_group: str,
        regions: Sequence[str],
        credential: TokenCredential | None = None,
        launch_config: AzureLaunchConfig | None = None,
        base_url: str | None = None,
        transport: HttpTransport[Any, Any] | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] | None = None,
        prices_endpoint: str = RETAIL_PRICES_ENDPOINT,
        prices_ttl_s: float = DEFAULT_TTL_S,
        prices_session: requests.Session | None = None,
        max_attempts: int = 5,
        offers_ttl_s: float = 3600.0,
    ) -> None:
        where = "AzureProvider"
        if not cluster or len(cluster) > TAG_VALUE_MAX:
            raise InputError(
                where,
                "cluster",
                f"1 to {TAG_VALUE_MAX} characters (an Azure tag)",
                got=repr(cluster),
            )
        if not subscription_id or not resource_group:
            raise InputError(
                where,
                "subscription_id, resource_group",
                "both set",
                got=f"{subscription_id!r}, {resource_group!r}",
            )
        if not regions:
            raise InputError(
                where,
                "regions",
                "at least one Azure region",
                got="none",
                fix='e.g. regions=["eastus"]',
            )
        self.cluster = cluster
        self.subscription_id = subscription_id
        self.resource_group = resource_group
        self.regions = tuple(dict.fromkeys(r.strip().lower() for r in regions))
        self._credential = credential
        self._config = launch_config or AzureLaunchConfig()
        self._base_url = base_url
        self._transport = transport
        self._clock: Clock = clock or SystemClock()
        self._sleep = sleep or self._clock.sleep
        self._max_attempts = max_attempts
        self._offers_ttl_s = offers_ttl_s
        self._prices = RetailPriceCatalog(
            clock=self._clock,
            endpoint=prices_endpoint,
            ttl_s=prices_ttl_s,
            session=prices_session,
        )
        self._client: ComputeManagementClient | None = None
        self._offers: tuple[Offer, ...] = ()
        self._offers_expire_s = float("-inf")
        self._known: dict[InstanceId, _Known] = {}
        self._ended: set[InstanceId] = set()  # gangs reported or terminated by us

    # -- contract ------------------------------------------------------------------------
    def capabilities(self) -> frozenset[Capability]:
        return frozenset(
            {Capability.SPOT, Capability.ON_DEMAND, Capability.PREEMPTION_NOTICE, Capability.PRICES}
        )

    def offers(self) -> Sequence[Offer]:
        """The GPU sizes the catalog knows that Resource SKUs says our subscription can
        deploy in each region, each on both markets. Cached for `offers_ttl_s`."""
        now_s = self._now_s()
        if now_s < self._offers_expire_s:
            return self._offers
        client = self._compute()
        found: list[Offer] = []
        for region in self.regions:
            try:
                skus = self._api(partial(_list_skus, client, region))
            except _call_errors() as exc:
                raise _as_error(exc) from exc
            for sku in skus:
                if (sku.resource_type or "").lower() != "virtualmachines" or not sku.name:
                    continue
                gpus = catalog.instance_gpus(CLOUD, sku.name)
                if gpus is None or _restricted(sku, region):
                    continue
                for market in (Market.SPOT, Market.ON_DEMAND):
                    found.append(
                        Offer(
                            id=Offer.make_id(CLOUD, region, sku.name, market),
                            cloud=CLOUD,
                            region=region,
                            zone=region,
                            instance_type=sku.name,
                            gpu_type=gpus[0],
                            gpu_count=gpus[1],
                            market=market,
                            grid_zone=regions.grid_zone(region) or "unknown",
                            power_kw=catalog.instance_power_kw(*gpus),
                            pue=catalog.pue(CLOUD),
                        )
                    )
        self._offers = tuple(sorted({o.id: o for o in found}.values(), key=lambda o: o.id))
        self._offers_expire_s = now_s + self._offers_ttl_s
        return self._offers

    def prices(self) -> dict[OfferId, PriceQuote]:
        """The hourly price of each offer: the Retail Prices API's Linux price where it has
        one, else the catalog's on-demand list price (for spot, an upper bound)."""
        offers = self.offers()
        rates = self._prices.rates(
            sorted({o.region for o in offers}), sorted({o.instance_type for o in offers})
        )
        quotes: dict[OfferId, PriceQuote] = {}
        for offer in offers:
            usd = rates.get(offer.region, offer.instance_type, offer.market) if rates else None
            if usd is not None:
                quotes[offer.id] = PriceQuote(usd, SOURCE_RETAIL)
                continue
            list_price = catalog.on_demand_usd_per_hour(CLOUD, offer.instance_type)
            if list_price is not None:
                quotes[offer.id] = PriceQuote(list_price, SOURCE_LIST_PRICE)
        return quotes

    def quotes(self) -> dict[OfferId, Quote]:
        """`prices()` as `Quote`s (`Capability.PRICES`)."""
        return {k: Quote(q.usd_per_hour, q.source) for k, q in self.prices().items()}

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]:
        """Our gangs, whatever their state; other clusters' VMs and foreign VMs are invisible."""
        if cluster != self.cluster:
            logger.warning(
                "list_instances for cluster %r: this provider serves %r only", cluster, self.cluster
            )
            return {}
        by_gang = self._list_ours()
        return {
            gang.instance_id: self._info(gang, members)
            for gang, members in sorted(by_gang.items(), key=lambda kv: kv[0].instance_id)
        }

    def launch(self, spec: LaunchSpec, *, request_id: str) -> LaunchOutcome:
        target = self._target(spec, request_id)
        if isinstance(target, ProviderFailure):
            return LaunchOutcome(None, error=target)
        gang = naming.gang_for(
            project=f"{self.subscription_id}/{self.resource_group}",
            cluster=self.cluster,
            request_id=request_id,
            zone=target.region,
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
        self._known[gang.instance_id] = _Known(gang, spec.job_id, target.market is Market.SPOT)
        now_s = self._now_s()
        return LaunchOutcome(gang.instance_id, ready_at_s=now_s + spec.startup_s)

    def terminate(self, ids: Sequence[InstanceId], *, request_id: str) -> None:
        """Delete our gangs among `ids` (with their NICs and disks); ids that are not ours,
        or VMs without our tags, are logged and skipped. Raises the first error after
        trying every VM."""
        from azure.core.exceptions import ResourceNotFoundError

        first_error: HeliotropeError | None = None
        pending: list[tuple[str, LROPoller[None]]] = []
        for instance_id in ids:
            gang = naming.parse_instance_id(instance_id)
            if gang is None or gang.zone not in self.regions:
                logger.warning(
                    "terminate: %r is not an Azure instance id of ours; skipped", instance_id
                )
                continue
            for member in gang.members:
                try:
                    vm = self._get(member)
                    if vm is None:
                        continue
                    if not self._owned(vm):
                        logger.warning(
                            "terminate: %s is not tagged for cluster %r; not deleting it",
                            member,
                            self.cluster,
                        )
                        continue
                    pending.append((member, self._api(partial(self._begin_delete, member))))
                except ResourceNotFoundError:
                    continue
                except _call_errors() as exc:
                    first_error = first_error or _as_error(exc)
            self._ended.add(gang.instance_id)  # what we end is not a preemption
        for member, poller in pending:
            try:
                self._wait(poller, member)
            except ResourceNotFoundError:
                pass
            except _call_errors() as exc:
                first_error = first_error or _as_error(exc)
                continue
            logger.info("deleted %s (request %s)", member, request_id)
        if first_error is not None:
            raise first_error

    def poll_events(self) -> list[ProviderEvent]:
        """PREEMPTED once per gang of ours that went away (or is being deleted) without
        Heliotrope deleting it: a Spot eviction (eviction policy Delete), or a VM deleted
        by someone else. Raises TransientError or PermanentError when ARM fails."""
        by_gang = self._list_ours()
        present = {gang.instance_id: members for gang, members in by_gang.items()}
        now_s = self._now_s()
        events: list[ProviderEvent] = []
        for gang_id, known in sorted(self._known.items()):
            if gang_id in self._ended:
                continue
            members = present.get(gang_id, [])
            states = {_provisioning_state(vm) for vm in members}
            if len(members) == known.gang.count and not states & {"Deleting"}:
                continue
            self._ended.add(gang_id)
            gone = known.gang.count - len(members)
            why = "spot VM evicted" if known.spot else "VM deleted outside Heliotrope"
            events.append(
                ProviderEvent(
                    EventType.PREEMPTED,
                    gang_id,
                    known.job_id,
                    now_s,
                    f"{why}: {gone} of {known.gang.count} gone"
                    + (", deleting" if "Deleting" in states else ""),
                )
            )
        for event in events:
            logger.info("preempted %s (job %s): %s", event.instance_id, event.job_id, event.detail)
        return events

    def check_permissions(self) -> list[CheckRow]:
        """Rows for `heliotrope providers check`: credentials, the reads the adapter makes,
        retail prices, and the caller's effective permissions at the resource group and the
        subscription against exactly the actions it needs. Buys and changes nothing."""
        rows: list[CheckRow] = []
        try:
            self._token_credential().get_token(ARM_SCOPE)
        except Exception as exc:  # azure-identity raises several types; report, never crash
            rows.append(("credentials", "fail", errors.failure_from_exception(exc).message))
            rows.append(("compute", "skip", "no usable Azure credentials (see above)"))
            return rows
        rows.append(
            (
                "credentials",
                "ok",
                f"a token for {ARM_SCOPE} ({type(self._token_credential()).__name__})",
            )
        )
        reads: list[tuple[str, Callable[[], str]]] = [
            (
                "Microsoft.Compute/skus/read",
                lambda: f"{len(self.offers())} offers in {', '.join(self.regions)}",
            ),
            (
                "Microsoft.Compute/virtualMachines/read",
                lambda: (
                    f"{len(self.list_instances(cluster=self.cluster))} instance(s) of cluster "
                    f"{self.cluster} in resource group {self.resource_group}"
                ),
            ),
        ]
        for check, run in reads:
            try:
                rows.append((check, "ok", run()))
            except HeliotropeError as exc:
                rows.append((check, "fail", str(exc)))
        group = f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
        for name, scope, required, role in (
            (
                f"permissions in resource group {self.resource_group}",
                group,
                checks.GROUP_ACTIONS,
                "infra/azure/role.json",
            ),
            (
                "permissions in the subscription",
                f"/subscriptions/{self.subscription_id}",
                checks.SUBSCRIPTION_ACTIONS,
                "infra/azure/role-subscription.json",
            ),
        ):
            try:
                absent = checks.missing(required, self._effective_permissions(scope))
            except _call_errors() as exc:
                rows.append((name, "fail", errors.failure_from_exception(exc).message))
                continue
            if absent:
                rows.append((name, "fail", f"missing {', '.join(absent)} (assign {role})"))
            else:
                rows.append((name, "ok", f"all {len(required)} actions of {role} granted"))
        try:
            sources = {q.source for q in self.prices().values()}
        except HeliotropeError as exc:
            rows.append(("retail prices", "fail", str(exc)))
        else:
            if SOURCE_RETAIL in sources:
                rows.append(("retail prices", "ok", "prices from the Azure Retail Prices API"))
            else:
                rows.append(
                    (
                        "retail prices",
                        "fail",
                        "the Retail Prices API gave no price (see the log): list prices are used",
                    )
                )
        return rows

    def _effective_permissions(self, scope: str) -> list[dict[str, Any]]:
        from azure.core.exceptions import HttpResponseError
        from azure.core.rest import HttpRequest

        request = HttpRequest(
            "GET",
            f"{scope}/providers/Microsoft.Authorization/permissions"
            f"?api-version={checks.PERMISSIONS_API}",
        )

        def call() -> list[dict[str, Any]]:
            response = self._compute().send_request(request)
            if response.status_code != 200:
                raise HttpResponseError(response=response)
            entries = response.json().get("value") or []
            return [e for e in entries if isinstance(e, dict)]

        return self._api(call)

    # -- launch --------------------------------------------------------------------------
    def _target(self, spec: LaunchSpec, request_id: str) -> _Target | ProviderFailure:
        def invalid(why: str) -> ProviderFailure:
            return invalid_offer(spec, why)

        parsed = offer_parts(
            spec,
            cloud=CLOUD,
            cluster=self.cluster,
            form="azure:<region>:<VM size>:<spot|on_demand>",
        )
        if isinstance(parsed, ProviderFailure):
            return parsed
        region, size, market = parsed
        if region not in self.regions:
            return invalid(f"region {region} is not one of {', '.join(self.regions)}")
        if catalog.instance_gpus(CLOUD, size) is None:
            return invalid(f"{size} is not a GPU VM size Heliotrope knows")
        if region not in self._config.subnet_ids:
            return invalid(f"no subnet for {region}: set AzureLaunchConfig.subnet_ids[{region!r}]")
        if not self._config.ssh_public_key.strip():
            return invalid("set AzureLaunchConfig.ssh_public_key (password login is off)")
        if len(_image_parts(self._config.image)) != 4:
            return invalid(f"image {self._config.image!r}: expected publisher:offer:sku:version")
        for what, value in (("job id", spec.job_id), ("request id", request_id)):
            if not value or len(value) > TAG_VALUE_MAX:
                return invalid(f"{what} must be 1 to {TAG_VALUE_MAX} characters (an Azure tag)")
        refused = naming.refused_env_names(spec.env)
        if refused:
            return ProviderFailure(
                FailureKind.INVALID,
                f"environment {', '.join(refused)}: looks like a credential or is not a shell "
                "name; Heliotrope never writes secrets into customData (give the job a managed "
                "identity or read the secret from Key Vault)",
            )
        return _Target(region, size, market)

    def _launch_gang(
        self, gang: Gang, target: _Target, spec: LaunchSpec, request_id: str
    ) -> ProviderFailure | None:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceExistsError

        client = self._compute()
        started: list[tuple[str, LROPoller[VirtualMachine]]] = []
        for rank, member in enumerate(gang.members):
            existing = self._get(member)
            if existing is not None:
                failure = self._check_existing(existing, member, request_id)
                if failure is not None:
                    return failure
                if _provisioning_state(existing) in _BOOTING:
                    logger.info(
                        "launch: %s is still being created (retried request %s)", member, request_id
                    )
                continue
            body = self._vm_body(gang, member, rank, target, spec, request_id)
            try:
                poller = self._api(
                    partial(
                        client.virtual_machines.begin_create_or_update,
                        self.resource_group,
                        member,
                        body,
                        match_condition=MatchConditions.IfMissing,
                        polling_interval=self._config.poll_interval_s,
                    )
                )
            except ResourceExistsError:  # made by a racing attempt of the same request
                again = self._get(member)
                if again is None:
                    raise
                failure = self._check_existing(again, member, request_id)
                if failure is not None:
                    return failure
                continue
            started.append((member, poller))
        first_error: BaseException | None = None
        for member, poller in started:  # wait for every create, so a rollback meets no
            try:  # VM still being made
                self._wait(poller, member)
            except _call_errors() as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error  # launch maps it
        return None

    def _check_existing(
        self, vm: VirtualMachine, member: str, request_id: str
    ) -> ProviderFailure | None:
        if not self._made_by(vm, request_id):
            return foreign_member(f"VM {member}", request_id, self.cluster)
        state = _provisioning_state(vm)
        if state in _DOWN:
            return member_going(f"VM {member}", state, errors.TRANSIENT_RETRY_AFTER_S)
        logger.info("launch: %s already exists (retried request %s)", member, request_id)
        return None

    def _vm_body(
        self,
        gang: Gang,
        member: str,
        rank: int,
        target: _Target,
        spec: LaunchSpec,
        request_id: str,
    ) -> dict[str, Any]:
        """The VM in the shape of the REST reference ("Virtual Machines - Create Or Update")."""
        cfg = self._config
        spot = target.market is Market.SPOT
        shape = catalog.instance_gpus(CLOUD, target.size)
        node = Node(
            gang.instance_id,
            rank,
            gang.count,
            shape[1] if shape is not None else 1,
            gang.members[0],  # Azure DNS: VM names resolve in a VNet
        )
        env = environment(
            spec,
            node,
            cluster=self.cluster,
            request_id=request_id,
            region=target.region,
            zone=target.region,
            # the job watches Scheduled Events
            extra={"HELIOTROPE_NOTICE_SOURCE": NOTICE_SOURCE} if spot else None,
        )
        script = naming.startup_script(
            env,
            command(
                tuple(spec.entrypoint) or tuple(cfg.entrypoint),
                node,
                spec.launcher,
                request_id=request_id,
            ),
        )
        publisher, offer, sku, version = _image_parts(cfg.image)
        properties: dict[str, Any] = {
            "hardwareProfile": {"vmSize": target.size},
            "storageProfile": {
                "imageReference": {
                    "publisher": publisher,
                    "offer": offer,
                    "sku": sku,
                    "version": version,
                },
                "osDisk": {
                    "createOption": "FromImage",
                    "deleteOption": "Delete",
                    "diskSizeGB": cfg.os_disk_gb,
                    "managedDisk": {"storageAccountType": cfg.os_disk_type},
                },
            },
            "osProfile": {
                "computerName": member,
                "adminUsername": cfg.admin_username,
                "customData": base64.b64encode(script.encode()).decode(),
                "linuxConfiguration": {
                    "disablePasswordAuthentication": True,
                    "ssh": {
                        "publicKeys": [
                            {
                                "path": f"/home/{cfg.admin_username}/.ssh/authorized_keys",
                                "keyData": cfg.ssh_public_key.strip(),
                            }
                        ]
                    },
                },
            },
            "networkProfile": {
                "networkApiVersion": NETWORK_API_VERSION,
                "networkInterfaceConfigurations": [
                    {
                        "name": f"{member}-nic",
                        "properties": {
                            "primary": True,
                            "deleteOption": "Delete",
                            "enableAcceleratedNetworking": cfg.accelerated_networking,
                            "ipConfigurations": [
                                {
                                    "name": "ipconfig1",
                                    "properties": {
                                        "primary": True,
                                        "subnet": {"id": cfg.subnet_ids[target.region]},
                                    },
                                }
                            ],
                        },
                    }
                ],
            },
            "priority": "Spot" if spot else "Regular",
        }
        if spot:
            properties["evictionPolicy"] = "Delete"
            properties["billingProfile"] = {"maxPrice": -1}
        body: dict[str, Any] = {
            "location": target.region,
            "tags": {
                TAG_CLUSTER: self.cluster,
                TAG_JOB: spec.job_id,
                TAG_REQUEST: request_id,
                TAG_GANG: gang.name,
                TAG_STARTUP_S: repr(float(spec.startup_s)),
            },
            "properties": properties,
        }
        if cfg.managed_identity:
            body["identity"] = {
                "type": "UserAssigned",
                "userAssignedIdentities": {cfg.managed_identity: {}},
            }
        return body

    def _roll_back(self, gang: Gang, request_id: str) -> None:
        """Delete the members of a failed gang that this request made, waiting for each
        (best effort: what is left is ours, tagged, and shows up in list_instances)."""

        def made_here(member: str) -> bool:
            vm = self._get(member)
            return vm is not None and self._made_by(vm, request_id)

        roll_back(
            gang.members,
            request_id=request_id,
            made_here=made_here,
            delete=lambda member: self._api(partial(self._begin_delete, member)),
            wait=lambda member, poller: self._wait(poller, member),
            call_errors=_call_errors(),
            reason=lambda exc: errors.failure_from_exception(exc).message,
        )

    def _made_by(self, vm: VirtualMachine, request_id: str) -> bool:
        return self._owned(vm) and (vm.tags or {}).get(TAG_REQUEST) == request_id

    # -- reading -------------------------------------------------------------------------
    def _list_ours(self) -> dict[Gang, list[VirtualMachine]]:
        client = self._compute()
        try:
            vms = self._api(lambda: list(client.virtual_machines.list(self.resource_group)))
        except _call_errors() as exc:
            raise _as_error(exc) from exc
        by_gang: dict[Gang, list[VirtualMachine]] = {}
        for vm in vms:
            if not self._owned(vm):
                continue
            gang = naming.gang_of_member((vm.location or "").lower(), vm.name or "")
            if gang is None:
                continue
            by_gang.setdefault(gang, []).append(vm)
        for gang, members in by_gang.items():
            first = members[0]
            spot = first.properties is not None and first.properties.priority == "Spot"
            self._known.setdefault(gang.instance_id, _Known(gang, _tag(first, TAG_JOB), spot))
        return by_gang

    def _info(self, gang: Gang, members: list[VirtualMachine]) -> InstanceInfo:
        first = members[0]
        props = first.properties
        spot = props is not None and props.priority == "Spot"
        size = ""
        if props is not None and props.hardware_profile is not None:
            size = str(props.hardware_profile.vm_size or "")
        states = {_provisioning_state(m) for m in members}
        if len(members) < gang.count or states & _DOWN:
            state = InstanceState.PREEMPTED if spot else InstanceState.TERMINATED
        elif states == {"Succeeded"}:
            state = InstanceState.RUNNING
        else:
            state = InstanceState.BOOTING
        created = [
            m.properties.time_created
            for m in members
            if m.properties is not None and m.properties.time_created is not None
        ]
        launched_s = min(_epoch_s(c) for c in created) if created else self._now_s()
        try:
            startup_s = float(_tag(first, TAG_STARTUP_S) or "0")
        except ValueError:
            startup_s = 0.0
        return InstanceInfo(
            id=gang.instance_id,
            offer_id=Offer.make_id(
                CLOUD, gang.zone, size, Market.SPOT if spot else Market.ON_DEMAND
            ),
            job_id=_tag(first, TAG_JOB),
            state=state,
            launched_at_s=launched_s,
            ready_at_s=launched_s + startup_s,
        )

    def _owned(self, vm: VirtualMachine) -> bool:
        tags = vm.tags or {}
        region = (vm.location or "").lower()
        return (
            tags.get(TAG_CLUSTER) == self.cluster
            and bool(tags.get(TAG_REQUEST))
            and naming.gang_of_member(region, vm.name or "") is not None
        )

    def _get(self, name: str) -> VirtualMachine | None:
        from azure.core.exceptions import ResourceNotFoundError

        client = self._compute()
        try:
            return self._api(lambda: client.virtual_machines.get(self.resource_group, name))
        except ResourceNotFoundError:
            return None

    def _begin_delete(self, name: str) -> LROPoller[None]:
        return self._compute().virtual_machines.begin_delete(
            self.resource_group, name, polling_interval=self._config.poll_interval_s
        )

    def _wait(self, poller: LROPoller[T], what: str) -> T:
        """The result of a long-running operation, or TransientError after
        `operation_timeout_s` (the operation goes on; a retried request finds its VM)."""
        result = poller.result(timeout=self._config.operation_timeout_s)
        if not poller.done():
            raise TransientError(
                f"operation on {what} not done after {self._config.operation_timeout_s:g} s",
                retry_after_s=errors.TRANSIENT_RETRY_AFTER_S,
            )
        return result

    # -- plumbing ------------------------------------------------------------------------
    def _api(self, call: Callable[[], T]) -> T:
        """One ARM call, repeated on throttling and 5xx (tenacity, exponential backoff, the
        injected sleep, the last error re-raised)."""
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

        retrying = Retrying(
            stop=stop_after_attempt(self._max_attempts),
            wait=wait_exponential(multiplier=1.0, min=1.0, max=30.0),
            retry=retry_if_exception(errors.is_retryable),
            sleep=self._sleep,
            reraise=True,
            before_sleep=_log_retry,
        )
        return retrying(call)

    def _token_credential(self) -> TokenCredential:
        if self._credential is None:
            from azure.identity import DefaultAzureCredential

            self._credential = DefaultAzureCredential()
        return self._credential

    def _compute(self) -> ComputeManagementClient:
        if self._client is None:
            from azure.mgmt.compute import ComputeManagementClient

            credential = self._token_credential()
            kwargs: dict[str, Any] = {"retry_total": 0}
            if self._transport is not None:
                kwargs["transport"] = self._transport
            self._client = ComputeManagementClient(
                credential, self.subscription_id, base_url=self._base_url, **kwargs
            )
        return self._client

    def _now_s(self) -> float:
        return self._clock.now().timestamp()


def _list_skus(client: ComputeManagementClient, region: str) -> list[Any]:
    return list(client.resource_skus.list(filter=f"location eq '{region}'"))


def _restricted(sku: Any, region: str) -> bool:
    """True when Resource SKUs says the subscription cannot deploy the size in the region
    (a `Location` restriction, e.g. `NotAvailableForSubscription`)."""
    for restriction in sku.restrictions or []:
        values = [v.lower() for v in restriction.values_property or []]
        kind = getattr(restriction.type, "value", restriction.type)
        if str(kind or "").lower() == "location" and region in values:
            return True
    return False


def _image_parts(urn: str) -> list[str]:
    return [p for p in urn.split(":") if p]


def _provisioning_state(vm: VirtualMachine) -> str:
    return str(vm.properties.provisioning_state or "") if vm.properties is not None else ""


def _tag(vm: VirtualMachine, key: str) -> str:
    return str((vm.tags or {}).get(key, ""))


def _epoch_s(value: datetime | str) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.timestamp()


def _call_errors() -> tuple[type[BaseException], ...]:
    from azure.core.exceptions import AzureError

    return (HeliotropeError, AzureError)


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    why = errors.failure_from_exception(exc).message if exc is not None else "?"
    logger.info("azure call failed (attempt %s), retrying: %s", state.attempt_number, why)


def _as_error(exc: BaseException) -> HeliotropeError:
    if isinstance(exc, HeliotropeError):
        return exc
    return errors.as_error(errors.failure_from_exception(exc))
