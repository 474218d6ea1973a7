"""`KubernetesProvider`: training jobs as pods on the GPU nodes of Kubernetes clusters.

A kubeconfig context is a region: each `KubeRegion` names a context (an on-premises GPU
pool, or a GPU cloud that sells capacity as Kubernetes), the namespace Heliotrope works in,
the grid zone it draws from and what a GPU-hour costs there (amortized hardware and power
for an on-premises pool, the contract price of a GPU cloud).

- Offers. Nodes are read once per region (`GET /api/v1/nodes`); a node with allocatable
  `nvidia.com/gpu` and a GPU type label (`nvidia.com/gpu.product`, from NVIDIA GPU feature
  discovery, or the configured label) belongs to the pool of its GPU type and market: spot
  when one of `spot_labels` says so (Karpenter, EKS, GKE and AKS spot node labels by
  default), on-demand otherwise. A pool offers pods of 1, 2, 4 and 8 GPUs up to its largest
  node; `capacity()` is how many such pods fit on its ready, schedulable nodes now
  (allocatable GPUs less those our pods hold). Prices come from the configuration, per GPU-hour.
- Launch. A job runs as one pod per gang member, named from (context, namespace, cluster,
  request id) as the other adapters name VMs, so a retried launch meets `409 AlreadyExists`
  and takes the pod it made (if the pod is ours and of that request). Pods ask for their
  GPUs as `nvidia.com/gpu` limits, go to the pool's nodes by node affinity on the GPU label
  and the spot label, `restartPolicy: Never`. A gang gets a headless Service named like it,
  so rank 0 is `<gang>-0.<gang>.<namespace>.svc` (the rendezvous address). If the pool
  cannot hold the gang, the launch is refused as CAPACITY before anything is made.
- Ownership. Pods are ours when the label `heliotrope-cluster` is our cluster's label value,
  the annotation `heliotrope.io/cluster` is exactly our cluster and the name is one we make.
  Listing asks for the label only and checks all three; `terminate` reads every pod first.
- Preemption is an eviction or a `DisruptionTarget` condition (preemption by the scheduler,
  the taint manager, the eviction API, node shutdown): the kubelet sends the job SIGTERM with
  the pod's grace period (`termination_grace_s`), which the training SDK takes as the notice
  to checkpoint. `poll_events` reports a `DisruptionTarget` on a live pod as
  PREEMPTION_NOTICE, and a gang whose pod failed by disruption, was evicted, or is gone or
  being deleted without Heliotrope deleting it as PREEMPTED; each once. A gang that stays
  unschedulable for `unschedulable_timeout_s` is deleted and reported PREEMPTED too, so the
  job is placed elsewhere. Pods that ran to the end are COMPLETED or FAILED.

Checkpoints: a PersistentVolumeClaim mounted at /checkpoints (`checkpoint_pvc`,
`HELIOTROPE_CHECKPOINT_DIR`), or an object store the job reaches with its own identity.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Final, Literal, TypeVar

from orchestrator import catalog
from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import HeliotropeError, InputError
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
    MASTER_PORT,
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
from providers.kubernetes import errors

logger = logging.getLogger(__name__)

CLOUD: Final = "k8s"
GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery
# Labels that mark spot (preemptible) nodes on the common platforms.
SPOT_LABELS: Final[Mapping[str, str]] = {
    "karpenter.sh/capacity-type": "spot",
    "eks.amazonaws.com/capacityType": "SPOT",
    "cloud.google.com/gke-spot": "true",
    "kubernetes.azure.com/scalesetpriority": "spot",
}
LABEL_CLUSTER: Final = naming.LABEL_CLUSTER  # "heliotrope-cluster", a label value
LABEL_GANG: Final = naming.LABEL_GANG
LABEL_REQUEST: Final = naming.LABEL_REQUEST
ANNOTATION_CLUSTER: Final = "heliotrope.io/cluster"  # exact values
ANNOTATION_JOB: Final = "heliotrope.io/job-id"
ANNOTATION_REQUEST: Final = "heliotrope.io/request-id"
ANNOTATION_STARTUP_S: Final = "heliotrope.io/startup-s"
ANNOTATION_OFFER: Final = "heliotrope.io/offer-id"
POD_SIZES: Final = (1, 2, 4, 8)
CHECKPOINT_MOUNT: Final = "/checkpoints"
RENDEZVOUS_PORT: Final = MASTER_PORT  # opened by the gang's headless Service
PRICE_LABEL: Final = "heliotrope.io/usd-per-gpu-hour"  # optional, on nodes
SOURCE_CONFIG: Final = "k8s-config"  # a price from `KubeRegion` (the settings)
SOURCE_NODE_LABEL: Final = "k8s-node-label"  # a price from PRICE_LABEL on the pool's nodes
# DisruptionTarget reasons (Kubernetes "Pod disruption conditions").
DISRUPTION_REASONS: Final = frozenset(
    {
        "PreemptionByScheduler",
        "DeletionByTaintManager",
        "EvictionByEvictionAPI",
        "DeletionByPodGC",
        "TerminationByKubelet",
    }
)
_EVENT_REASONS: Final = frozenset(
    {
        "Evicted",
        "Preempted",
        "Preempting",
        "FailedScheduling",
        "TaintManagerEviction",
        "NodeNotReady",
        "Killing",
    }
)

# What the adapter does, as RBAC (resource, verb): exactly infra/k8s/rbac.yaml's rules
# (tests/providers/kubernetes/test_k8s_rbac.py keeps them equal).
NAMESPACED_VERBS: Final = frozenset(
    {
        ("pods", "create"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "delete"),
        ("services", "create"),
        ("services", "get"),
        ("services", "delete"),
        ("events", "list"),
    }
)
CLUSTER_VERBS: Final = frozenset({("nodes", "list")})

Result = Literal["ok", "fail", "skip"]
CheckRow = tuple[str, Result, str]  # (check, result, reason), a row of `providers check`

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class KubeRegion:
    """One kubeconfig context, as a region.

    `usd_per_gpu_hour` is the on-demand price of one GPU-hour per GPU type (canonical names,
    "H100", "A100-80GB"); `spot_usd_per_gpu_hour` the price on spot nodes (defaults to the
    on-demand price). A GPU type with no price has no priced offer.
    """

    context: str
    namespace: str = "heliotrope"
    grid_zone: str | None = None
    pue: float | None = None  # None: the catalog's figure for an on-premises data centre
    usd_per_gpu_hour: Mapping[str, float] = field(default_factory=dict)
    spot_usd_per_gpu_hour: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class KubeLaunchConfig:
    image: str = "nvcr.io/nvidia/pytorch:25.01-py3"
    entrypoint: Sequence[str] = ()
    gpu_label: str = GPU_PRODUCT_LABEL
    spot_labels: Mapping[str, str] = field(default_factory=lambda: dict(SPOT_LABELS))
    termination_grace_s: int = 120  # SIGTERM, then this long to checkpoint, then SIGKILL
    cpu_per_gpu: str = "8"
    memory_per_gpu: str = "64Gi"
    checkpoint_pvc: str | None = None
    service_account: str | None = None  # the pod's own identity (e.g. for object stores)
    unschedulable_timeout_s: float = 600.0
    request_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class _Pool:
    region: str
    gpu_type: str
    market: Market
    max_gpus: int
    free_gpus: tuple[int, ...]  # per ready, schedulable node
    product_values: tuple[str, ...]  # GPU label values of its nodes
    label_usd_per_gpu_hour: float | None = None  # the highest PRICE_LABEL of its nodes


@dataclass(frozen=True, slots=True)
class _Target:
    region: KubeRegion
    pool: _Pool
    gpus: int
    instance_type: str
    fits: int  # pods of this shape the pool's nodes can take now


@dataclass(slots=True)
class _Known:
    gang: Gang
    job_id: str
    spot: bool
    noticed: bool = False
    unschedulable_since_s: float | None = None


def pod_shape(gpu_type: str, gpus: int) -> str:
    """The instance-type name of a pod of `gpus` GPUs of `gpu_type` ("h100x8")."""
    return f"{gpu_type.lower()}x{gpus}"


class KubernetesProvider:
    """GPU pods of one cluster in a fixed set of kubeconfig contexts (regions)."""

    name = CLOUD

    def __init__(
        self,
        *,
        cluster: str,
        regions: Sequence[KubeRegion],
        kubeconfig: str | None = None,
        launch_config: KubeLaunchConfig | None = None,
        api_clients: Mapping[str, Any] | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] | None = None,
        max_attempts: int = 4,
    ) -> None:
        where = "KubernetesProvider"
        if not cluster:
            raise InputError(where, "cluster", "a name", got=repr(cluster))
        if not regions:
            raise InputError(where, "regions", "at least one kubeconfig context", got="none")
        contexts = [r.context for r in regions]
        if len(set(contexts)) != len(contexts) or not all(contexts):
            raise InputError(
                where,
                "regions",
                "each kubeconfig context once, by name",
                got=", ".join(map(repr, contexts)),
            )
        for r in regions:
            if not r.namespace:
                raise InputError(
                    where,
                    f"regions[{r.context}].namespace",
                    "a namespace",
                    got=repr(r.namespace),
                    fix="the default is heliotrope",
                )
            bad = {
                k: v
                for k, v in {**r.usd_per_gpu_hour, **r.spot_usd_per_gpu_hour}.items()
                if not v >= 0
            }
            if bad:
                raise InputError(
                    where, f"regions[{r.context}] prices", "USD per GPU-hour >= 0", got=bad
                )
        self.cluster = cluster
        self.regions = {r.context: r for r in regions}
        self._kubeconfig = kubeconfig
        self._config = launch_config or KubeLaunchConfig()
        self._api_clients = dict(api_clients or {})
        self._core: dict[str, Any] = {}
        self._clock: Clock = clock or SystemClock()
        self._sleep = sleep or self._clock.sleep
        self._max_attempts = max_attempts
        self._cluster_label = naming.label_value(cluster)
        self._known: dict[InstanceId, _Known] = {}
        self._ended: set[InstanceId] = set()
        self._pools: dict[str, list[_Pool]] = {}

    # -- contract ------------------------------------------------------------------------
    def capabilities(self) -> frozenset[Capability]:
        caps = {
            Capability.ON_DEMAND,
            Capability.PREEMPTION_NOTICE,
            Capability.PRICES,
            Capability.CAPACITY,
        }
        if self._config.spot_labels:
            caps.add(Capability.SPOT)
        if self._config.checkpoint_pvc:
            caps.add(Capability.CHECKPOINT_STORE)
        return frozenset(caps)

    def offers(self) -> Sequence[Offer]:
        """One offer per (context, GPU type, pod size, market) the nodes can hold now."""
        found: list[Offer] = []
        for context, region in self.regions.items():
            try:
                pools = self._read_pools(context)
            except errors.call_errors() as exc:
                raise errors.as_error(exc) from exc
            for pool in pools:
                for gpus in POD_SIZES:
                    if gpus > pool.max_gpus:
                        continue
                    shape = pod_shape(pool.gpu_type, gpus)
                    found.append(
                        Offer(
                            id=Offer.make_id(CLOUD, context, shape, pool.market),
                            cloud=CLOUD,
                            region=context,
                            zone=context,
                            instance_type=shape,
                            gpu_type=pool.gpu_type,
                            gpu_count=gpus,
                            market=pool.market,
                            grid_zone=region.grid_zone or "unknown",
                            power_kw=catalog.instance_power_kw(pool.gpu_type, gpus),
                            pue=region.pue if region.pue is not None else catalog.pue("local"),
                        )
                    )
        return tuple(sorted(found, key=lambda o: o.id))

    def prices(self) -> dict[OfferId, float]:
        """USD per hour of each offer: its GPUs at the region's configured GPU-hour price,
        else at the price its nodes carry in the `heliotrope.io/usd-per-gpu-hour` label
        (a GPU cloud or a cluster operator may publish it there)."""
        return {k: q.usd_per_hour for k, q in self.quotes().items()}

    def quotes(self) -> dict[OfferId, Quote]:
        """`prices()` with their sources: `SOURCE_CONFIG` or `SOURCE_NODE_LABEL`."""
        offers = self.offers()
        by_pool = {
            (p.region, p.gpu_type, p.market): p.label_usd_per_gpu_hour
            for pools in self._pools.values()
            for p in pools
        }
        quotes: dict[OfferId, Quote] = {}
        for offer in offers:
            region = self.regions[offer.region]
            per_gpu = region.usd_per_gpu_hour.get(offer.gpu_type)
            if offer.market is Market.SPOT:
                per_gpu = region.spot_usd_per_gpu_hour.get(offer.gpu_type, per_gpu)
            source = SOURCE_CONFIG
            if per_gpu is None:
                per_gpu = by_pool.get((offer.region, offer.gpu_type, offer.market))
                source = SOURCE_NODE_LABEL
            if per_gpu is not None:
                quotes[offer.id] = Quote(round(per_gpu * offer.gpu_count, 6), source)
        return quotes

    def capacity(self) -> dict[OfferId, int]:
        """How many pods of each offer fit on the ready, schedulable nodes now, as of the
        last `offers()` (allocatable GPUs less what our pods hold; other tenants' pods are
        the scheduler's to weigh)."""
        counts: dict[OfferId, int] = {}
        for context, pools in self._pools.items():
            for pool in pools:
                for gpus in POD_SIZES:
                    if gpus <= pool.max_gpus:
                        offer_id = Offer.make_id(
                            CLOUD, context, pod_shape(pool.gpu_type, gpus), pool.market
                        )
                        counts[offer_id] = sum(free // gpus for free in pool.free_gpus)
        return counts

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]:
        if cluster != self.cluster:
            logger.warning(
                "list_instances for cluster %r: this provider serves %r only", cluster, self.cluster
            )
            return {}
        infos: dict[InstanceId, InstanceInfo] = {}
        for context in self.regions:
            for gang, pods in self._list_ours(context).items():
                infos[gang.instance_id] = self._info(gang, pods)
        return dict(sorted(infos.items()))

    def launch(self, spec: LaunchSpec, *, request_id: str) -> LaunchOutcome:
        target = self._target(spec)
        if isinstance(target, ProviderFailure):
            return LaunchOutcome(None, error=target)
        context = target.region.context
        gang = naming.gang_for(
            project=f"{context}/{target.region.namespace}",
            cluster=self.cluster,
            request_id=request_id,
            zone=context,
            count=spec.count,
        )
        try:
            retried = self._read_pod(target.region, gang.members[0]) is not None
        except errors.call_errors() as exc:
            return LaunchOutcome(None, error=errors.failure_from_exception(exc))
        if not retried and target.fits < spec.count:  # refused before anything is made
            return LaunchOutcome(
                None,
                error=ProviderFailure(
                    FailureKind.CAPACITY,
                    f"{context}: room for {target.fits} pod(s) of {target.instance_type} on "
                    f"{target.pool.market.value} nodes now, the gang needs {spec.count}",
                ),
            )
        failure = all_or_none(
            gang_id=gang.instance_id,
            spec=spec,
            request_id=request_id,
            start=lambda: self._launch_gang(gang, target, spec, request_id),
            roll_back=lambda: self._roll_back(gang, target.region, request_id),
            call_errors=errors.call_errors(),
            failure_of=errors.failure_from_exception,
        )
        if failure is not None:
            return LaunchOutcome(None, error=failure)
        self._known[gang.instance_id] = _Known(gang, spec.job_id, target.pool.market is Market.SPOT)
        return LaunchOutcome(gang.instance_id, ready_at_s=self._now_s() + spec.startup_s)

    def terminate(self, ids: Sequence[InstanceId], *, request_id: str) -> None:
        """Delete our gangs among `ids` (SIGTERM, then the grace period); anything else is
        logged and skipped. Raises the first error after trying every pod."""
        first_error: HeliotropeError | None = None
        for instance_id in ids:
            gang = naming.parse_instance_id(instance_id)
            region = self.regions.get(gang.zone) if gang is not None else None
            if gang is None or region is None:
                logger.warning(
                    "terminate: %r is not a Kubernetes instance id of ours; skipped", instance_id
                )
                continue
            self._ended.add(gang.instance_id)  # what we end is not a preemption
            error = self._delete_gang(gang, region, request_id)
            first_error = first_error or error
        if first_error is not None:
            raise first_error

    def poll_events(self) -> list[ProviderEvent]:
        """Notices, preemptions, completions and failures of our gangs, each once."""
        now_s = self._now_s()
        events: list[ProviderEvent] = []
        for context, region in self.regions.items():
            by_gang = self._list_ours(context)
            present = {gang.instance_id: pods for gang, pods in by_gang.items()}
            why_by_pod: dict[str, str] | None = None
            for gang_id, known in sorted(self._known.items()):
                if known.gang.zone != context or gang_id in self._ended:
                    continue
                pods = present.get(gang_id, [])
                found = self._gang_event(known, pods, now_s)
                if found is None:
                    continue
                kind, detail = found
                if kind in (EventType.PREEMPTED, EventType.PREEMPTION_NOTICE):
                    if why_by_pod is None:
                        why_by_pod = self._event_reasons(context, region)
                    said = [why_by_pod[m] for m in known.gang.members if m in why_by_pod]
                    if said:
                        detail = f"{detail}; {said[0]}"
                if kind is EventType.PREEMPTION_NOTICE:
                    known.noticed = True
                else:
                    self._ended.add(gang_id)
                if kind is EventType.PREEMPTED and known.unschedulable_since_s is not None:
                    self._delete_gang(known.gang, region, "unschedulable")
                events.append(ProviderEvent(kind, gang_id, known.job_id, now_s, detail))
        for event in events:
            logger.info(
                "%s %s (job %s): %s",
                event.type.value,
                event.instance_id,
                event.job_id,
                event.detail,
            )
        return events

    def check_permissions(self) -> list[CheckRow]:
        """Rows for `heliotrope providers check`, per context: the API server and
        credentials (reading nodes), our pods, and SelfSubjectAccessReviews for exactly the
        verbs of infra/k8s/rbac.yaml (any authenticated user may ask). Changes nothing."""
        rows: list[CheckRow] = []
        for context, region in self.regions.items():
            try:
                pools = self._read_pools(context)
            except Exception as exc:  # a bad kubeconfig raises the config loader's errors
                rows.append(
                    (f"{context}: nodes", "fail", errors.failure_from_exception(exc).message)
                )
                rows.append((f"{context}: rbac", "skip", "cannot reach the API server"))
                continue
            gpus = sum(sum(p.free_gpus) for p in pools)
            rows.append(
                (f"{context}: nodes", "ok", f"{len(pools)} GPU pool(s), {gpus} free GPU(s)")
            )
            try:
                denied = [
                    f"{resource} {verb}"
                    for resource, verb, namespace in sorted(
                        [(r, v, region.namespace) for r, v in NAMESPACED_VERBS]
                        + [(r, v, None) for r, v in CLUSTER_VERBS]
                    )
                    if not self._allowed(context, resource, verb, namespace)
                ]
            except errors.call_errors() as exc:
                rows.append(
                    (f"{context}: rbac", "fail", errors.failure_from_exception(exc).message)
                )
                continue
            if denied:
                rows.append(
                    (
                        f"{context}: rbac",
                        "fail",
                        f"not allowed: {', '.join(denied)} "
                        f"(apply infra/k8s/rbac.yaml in namespace {region.namespace})",
                    )
                )
            else:
                count = len(NAMESPACED_VERBS) + len(CLUSTER_VERBS)
                rows.append(
                    (
                        f"{context}: rbac",
                        "ok",
                        f"all {count} verbs of "
                        f"infra/k8s/rbac.yaml allowed (namespace {region.namespace})",
                    )
                )
        return rows

    def _allowed(self, context: str, resource: str, verb: str, namespace: str | None) -> bool:
        from kubernetes import client  # type: ignore[import-untyped]

        attributes: dict[str, str] = {"group": "", "resource": resource, "verb": verb}
        if namespace is not None:
            attributes["namespace"] = namespace
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        api = client.AuthorizationV1Api(self._core_api(context).api_client)
        review = self._api(
            partial(
                api.create_self_subject_access_review,
                body,
                _request_timeout=self._config.request_timeout_s,
            )
        )
        return bool(review.status is not None and review.status.allowed)

    # -- offers ----------------------------------------------------------------------------
    def _read_pools(self, context: str) -> list[_Pool]:
        """The GPU pools of a context from its nodes; raises what the API raised."""
        core = self._core_api(context)
        cfg = self._config
        nodes = self._api(
            partial(
                core.list_node, label_selector=cfg.gpu_label, _request_timeout=cfg.request_timeout_s
            )
        ).items
        ours = self._fetch_ours(context)
        held: dict[str, int] = {}
        for pods in ours.values():
            for pod in pods:
                if pod.spec.node_name and pod.status.phase in ("Pending", "Running"):
                    held[pod.spec.node_name] = held.get(pod.spec.node_name, 0) + _pod_gpus(pod)
        grouped: dict[tuple[str, Market], list[tuple[int, int, str]]] = {}
        labelled: dict[tuple[str, Market], float] = {}
        for node in nodes:
            labels = node.metadata.labels or {}
            product = labels.get(cfg.gpu_label, "")
            gpu_type = catalog.canonical_gpu_name(product)
            allocatable = _int((node.status.allocatable or {}).get(GPU_RESOURCE))
            if gpu_type is None or allocatable < 1 or not _ready(node):
                continue  # not a GPU we know, or cordoned / not ready: nothing to offer
            market = Market.SPOT if self._is_spot(labels) else Market.ON_DEMAND
            free = max(allocatable - held.get(node.metadata.name, 0), 0)
            grouped.setdefault((gpu_type, market), []).append((allocatable, free, product))
            price = _price(labels.get(PRICE_LABEL))
            if price is not None:  # an estimate of cost should not err low: the highest
                labelled[(gpu_type, market)] = max(price, labelled.get((gpu_type, market), 0.0))
        pools = [
            _Pool(
                region=context,
                gpu_type=gpu_type,
                market=market,
                max_gpus=max(a for a, _, _ in rows),
                free_gpus=tuple(f for _, f, _ in rows),
                product_values=tuple(sorted({p for _, _, p in rows})),
                label_usd_per_gpu_hour=labelled.get((gpu_type, market)),
            )
            for (gpu_type, market), rows in sorted(grouped.items())
        ]
        self._pools[context] = pools
        return pools

    def _is_spot(self, labels: Mapping[str, str]) -> bool:
        return any(labels.get(k) == v for k, v in self._config.spot_labels.items())

    # -- launch ----------------------------------------------------------------------------
    def _target(self, spec: LaunchSpec) -> _Target | ProviderFailure:
        def invalid(why: str) -> ProviderFailure:
            return invalid_offer(spec, why)

        parsed = offer_parts(
            spec,
            cloud=CLOUD,
            cluster=self.cluster,
            form="k8s:<context>:<gpu>x<count>:<spot|on_demand>",
        )
        if isinstance(parsed, ProviderFailure):
            return parsed
        context, shape, market = parsed
        region = self.regions.get(context)
        if region is None:
            return invalid(f"context {context!r} is not one of {', '.join(self.regions)}")
        refused = naming.refused_env_names(spec.env)
        if refused:
            return ProviderFailure(
                FailureKind.INVALID,
                f"environment {', '.join(refused)}: looks like a credential or is not a shell "
                "name; Heliotrope never puts secrets into a pod spec (mount a Secret through "
                "the pod's service account instead)",
            )
        try:
            pools = self._read_pools(context)
        except errors.call_errors() as exc:
            return errors.failure_from_exception(exc)
        for pool in pools:
            for gpus in POD_SIZES:
                if pool.market is market and pod_shape(pool.gpu_type, gpus) == shape:
                    if gpus > pool.max_gpus:
                        break
                    fits = sum(free // gpus for free in pool.free_gpus)
                    return _Target(region, pool, gpus, shape, fits)
        return invalid(f"no {market.value} nodes with {shape} in context {context!r}")

    def _launch_gang(
        self, gang: Gang, target: _Target, spec: LaunchSpec, request_id: str
    ) -> ProviderFailure | None:
        from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]

        namespace = target.region.namespace
        core = self._core_api(target.region.context)
        timeout = self._config.request_timeout_s
        if gang.count > 1:
            try:
                self._api(
                    partial(
                        core.create_namespaced_service,
                        namespace,
                        self._service_body(gang, spec, request_id),
                        _request_timeout=timeout,
                    )
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise
        for rank, member in enumerate(gang.members):
            body = self._pod_body(gang, member, rank, target, spec, request_id)
            try:
                self._api(
                    partial(core.create_namespaced_pod, namespace, body, _request_timeout=timeout)
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise
                existing = self._read_pod(target.region, member)
                what = f"pod {namespace}/{member}"
                if (
                    existing is None
                    or not self._owned(existing)
                    or _annotation(existing, ANNOTATION_REQUEST) != request_id
                ):
                    return foreign_member(what, request_id, self.cluster)
                if existing.metadata.deletion_timestamp is not None:
                    return member_going(what, "being deleted", errors.TRANSIENT_RETRY_AFTER_S)
                logger.info(
                    "launch: pod %s already exists (retried request %s)", member, request_id
                )
        return None

    def _labels(self, gang: Gang, spec: LaunchSpec, request_id: str) -> dict[str, str]:
        return {
            LABEL_CLUSTER: self._cluster_label,
            LABEL_GANG: gang.name,
            LABEL_REQUEST: naming.label_value(request_id),
            naming.LABEL_JOB: naming.label_value(spec.job_id),
        }

    def _annotations(self, spec: LaunchSpec, request_id: str) -> dict[str, str]:
        return {
            ANNOTATION_CLUSTER: self.cluster,
            ANNOTATION_JOB: spec.job_id,
            ANNOTATION_REQUEST: request_id,
            ANNOTATION_STARTUP_S: repr(float(spec.startup_s)),
            ANNOTATION_OFFER: spec.offer_id,
        }

    def _service_body(self, gang: Gang, spec: LaunchSpec, request_id: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": gang.name,
                "labels": self._labels(gang, spec, request_id),
                "annotations": self._annotations(spec, request_id),
            },
            "spec": {
                "clusterIP": "None",  # headless: DNS names for the gang's pods
                "selector": {LABEL_CLUSTER: self._cluster_label, LABEL_GANG: gang.name},
                "publishNotReadyAddresses": True,
                "ports": [
                    {"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}
                ],
            },
        }

    def _pod_body(
        self,
        gang: Gang,
        member: str,
        rank: int,
        target: _Target,
        spec: LaunchSpec,
        request_id: str,
    ) -> dict[str, Any]:
        cfg = self._config
        namespace = target.region.namespace
        master = member if gang.count == 1 else f"{gang.members[0]}.{gang.name}.{namespace}.svc"
        node = Node(gang.instance_id, rank, gang.count, target.gpus, master, RENDEZVOUS_PORT)
        env = environment(
            spec,
            node,
            cluster=self.cluster,
            request_id=request_id,
            region=target.region.context,
            zone=target.region.context,
            extra={"HELIOTROPE_CHECKPOINT_DIR": CHECKPOINT_MOUNT} if cfg.checkpoint_pvc else None,
        )
        gpus = str(target.gpus)
        container: dict[str, Any] = {
            "name": "job",
            "image": cfg.image,
            "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
            "resources": {
                "limits": {GPU_RESOURCE: gpus},
                "requests": {
                    GPU_RESOURCE: gpus,
                    "cpu": str(int(cfg.cpu_per_gpu) * target.gpus),
                    "memory": _times(cfg.memory_per_gpu, target.gpus),
                },
            },
        }
        entrypoint = command(
            tuple(spec.entrypoint) or tuple(cfg.entrypoint),
            node,
            spec.launcher,
            request_id=request_id,
        )
        if entrypoint:
            container["command"] = list(entrypoint)
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": cfg.termination_grace_s,
            "automountServiceAccountToken": cfg.service_account is not None,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": self._node_terms(target.pool),
                    }
                }
            },
            "tolerations": self._tolerations(target.pool),
            "containers": [container],
        }
        if gang.count > 1:
            pod_spec["hostname"] = member
            pod_spec["subdomain"] = gang.name
        if cfg.service_account:
            pod_spec["serviceAccountName"] = cfg.service_account
        if cfg.checkpoint_pvc:
            pod_spec["volumes"] = [
                {"name": "checkpoints", "persistentVolumeClaim": {"claimName": cfg.checkpoint_pvc}}
            ]
            container["volumeMounts"] = [{"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT}]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": member,
                "labels": self._labels(gang, spec, request_id),
                "annotations": self._annotations(spec, request_id),
            },
            "spec": pod_spec,
        }

    def _node_terms(self, pool: _Pool) -> list[dict[str, Any]]:
        gpu = {"key": self._config.gpu_label, "operator": "In", "values": list(pool.product_values)}
        spot = self._config.spot_labels
        if pool.market is Market.SPOT:  # terms are ORed: any spot label
            return [
                {"matchExpressions": [gpu, {"key": k, "operator": "In", "values": [v]}]}
                for k, v in sorted(spot.items())
            ]
        not_spot = [{"key": k, "operator": "NotIn", "values": [v]} for k, v in sorted(spot.items())]
        return [{"matchExpressions": [gpu, *not_spot]}]

    def _tolerations(self, pool: _Pool) -> list[dict[str, Any]]:
        tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
        if pool.market is Market.SPOT:  # GKE and AKS taint spot nodes with their label
            tolerations += [
                {"key": k, "operator": "Equal", "value": v, "effect": "NoSchedule"}
                for k, v in sorted(self._config.spot_labels.items())
            ]
        return tolerations

    def _roll_back(self, gang: Gang, region: KubeRegion, request_id: str) -> None:
        """Delete the pods (and the Service) of a failed gang that this request made."""
        from kubernetes.client.exceptions import ApiException

        core = self._core_api(region.context)
        timeout = self._config.request_timeout_s
        service = gang.name if gang.count > 1 else None

        def read(name: str) -> Any:
            if name != service:
                return self._read_pod(region, name)
            try:
                return self._api(
                    partial(
                        core.read_namespaced_service,
                        name,
                        region.namespace,
                        _request_timeout=timeout,
                    )
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        def made_here(name: str) -> bool:
            obj = read(name)
            return (
                obj is not None
                and self._owned(obj, service=name == service)
                and _annotation(obj, ANNOTATION_REQUEST) == request_id
            )

        def delete(name: str) -> None:
            if name == service:
                call = partial(
                    core.delete_namespaced_service, name, region.namespace, _request_timeout=timeout
                )
            else:
                call = partial(
                    core.delete_namespaced_pod,
                    name,
                    region.namespace,
                    grace_period_seconds=self._config.termination_grace_s,
                    _request_timeout=timeout,
                )
            try:
                self._api(call)
            except ApiException as exc:
                if exc.status != 404:  # gone already: rolled back
                    raise

        roll_back(
            [*gang.members, *([service] if service else [])],
            request_id=request_id,
            made_here=made_here,
            delete=delete,
            name=lambda name: f"{region.namespace}/{name}",
            call_errors=errors.call_errors(),
            reason=lambda exc: errors.failure_from_exception(exc).message,
        )

    def _delete_gang(
        self, gang: Gang, region: KubeRegion, request_id: str
    ) -> HeliotropeError | None:
        """Delete the gang's pods (and Service) that are ours; the first error, or None."""
        from kubernetes.client.exceptions import ApiException

        core = self._core_api(region.context)
        timeout = self._config.request_timeout_s
        first_error: HeliotropeError | None = None
        owned_any = False
        for member in gang.members:
            try:
                pod = self._read_pod(region, member)
                if pod is None:
                    continue
                if not self._owned(pod):
                    logger.warning(
                        "pod %s/%s is not ours to delete; not deleting it", region.namespace, member
                    )
                    continue
                owned_any = True
                self._api(
                    partial(
                        core.delete_namespaced_pod,
                        member,
                        region.namespace,
                        grace_period_seconds=self._config.termination_grace_s,
                        _request_timeout=timeout,
                    )
                )
                logger.info("deleted pod %s/%s (request %s)", region.namespace, member, request_id)
            except ApiException as exc:
                if exc.status != 404:
                    first_error = first_error or errors.as_error(exc)
            except errors.call_errors() as exc:
                first_error = first_error or errors.as_error(exc)
        if gang.count > 1:
            try:
                service = self._api(
                    partial(
                        core.read_namespaced_service,
                        gang.name,
                        region.namespace,
                        _request_timeout=timeout,
                    )
                )
                if self._owned(service, service=True):
                    self._api(
                        partial(
                            core.delete_namespaced_service,
                            gang.name,
                            region.namespace,
                            _request_timeout=timeout,
                        )
                    )
            except ApiException as exc:
                if exc.status != 404:
                    first_error = first_error or errors.as_error(exc)
            except errors.call_errors() as exc:
                first_error = first_error or errors.as_error(exc)
        if not owned_any:
            logger.debug("no pods of %s to delete", gang.instance_id)
        return first_error

    # -- reading ---------------------------------------------------------------------------
    def _list_ours(self, context: str) -> dict[Gang, list[Any]]:
        """Our pods in a context by gang; raises TransientError or PermanentError."""
        try:
            return self._fetch_ours(context)
        except errors.call_errors() as exc:
            raise errors.as_error(exc) from exc

    def _fetch_ours(self, context: str) -> dict[Gang, list[Any]]:
        region = self.regions[context]
        core = self._core_api(context)
        pods = self._api(
            partial(
                core.list_namespaced_pod,
                region.namespace,
                label_selector=f"{LABEL_CLUSTER}={self._cluster_label}",
                _request_timeout=self._config.request_timeout_s,
            )
        ).items
        by_gang: dict[Gang, list[Any]] = {}
        for pod in pods:
            if not self._owned(pod):
                continue
            gang = naming.gang_of_member(context, pod.metadata.name)
            if gang is None:
                continue
            by_gang.setdefault(gang, []).append(pod)
        for gang, members in by_gang.items():
            first = members[0]
            spot = _pod_market(first) is Market.SPOT
            self._known.setdefault(
                gang.instance_id, _Known(gang, _annotation(first, ANNOTATION_JOB), spot)
            )
        return by_gang

    def _info(self, gang: Gang, pods: list[Any]) -> InstanceInfo:
        first = pods[0]
        phases = {p.status.phase for p in pods}
        disrupted = any(_disruption(p) is not None for p in pods)
        deleting = any(p.metadata.deletion_timestamp is not None for p in pods)
        lost = disrupted or deleting or len(pods) < gang.count or any(_evicted(p) for p in pods)
        if lost:
            state = InstanceState.PREEMPTED
        elif "Failed" in phases or phases == {"Succeeded"}:
            state = InstanceState.TERMINATED
        elif phases == {"Running"}:
            state = InstanceState.RUNNING
        else:
            state = InstanceState.BOOTING
        created = [p.metadata.creation_timestamp for p in pods if p.metadata.creation_timestamp]
        launched_s = min(_epoch_s(c) for c in created) if created else self._now_s()
        try:
            startup_s = float(_annotation(first, ANNOTATION_STARTUP_S) or "0")
        except ValueError:
            startup_s = 0.0
        return InstanceInfo(
            id=gang.instance_id,
            offer_id=_annotation(first, ANNOTATION_OFFER),
            job_id=_annotation(first, ANNOTATION_JOB),
            state=state,
            launched_at_s=launched_s,
            ready_at_s=launched_s + startup_s,
        )

    def _gang_event(
        self, known: _Known, pods: list[Any], now_s: float
    ) -> tuple[EventType, str] | None:
        count = known.gang.count
        if len(pods) < count:
            return EventType.PREEMPTED, f"{count - len(pods)} of {count} pod(s) gone"
        for pod in pods:
            reason = _disruption(pod)
            if reason is not None and pod.status.phase in ("Failed", "Succeeded"):
                return EventType.PREEMPTED, f"{pod.metadata.name}: {reason}"
            if _evicted(pod):
                return EventType.PREEMPTED, f"{pod.metadata.name}: evicted"
        for pod in pods:
            reason = _disruption(pod)
            if reason is not None or pod.metadata.deletion_timestamp is not None:
                if known.noticed:
                    return None
                return EventType.PREEMPTION_NOTICE, (
                    f"{pod.metadata.name}: {reason or 'being deleted'}; SIGTERM, "
                    f"{self._config.termination_grace_s} s to checkpoint"
                )
        phases = [p.status.phase for p in pods]
        if all(ph == "Succeeded" for ph in phases):
            return EventType.COMPLETED, "all pods succeeded"
        failed = [p for p in pods if p.status.phase == "Failed"]
        if failed:
            return EventType.FAILED, f"{failed[0].metadata.name}: {_exit_detail(failed[0])}"
        if any(_unschedulable(p) for p in pods):
            if known.unschedulable_since_s is None:
                known.unschedulable_since_s = now_s
            waited = now_s - known.unschedulable_since_s
            if waited >= self._config.unschedulable_timeout_s:
                return EventType.PREEMPTED, f"unschedulable for {waited:.0f} s"
        else:
            known.unschedulable_since_s = None
        return None

    def _event_reasons(self, context: str, region: KubeRegion) -> dict[str, str]:
        """The newest telling Event (eviction, preemption, scheduling) per pod name."""
        core = self._core_api(context)
        try:
            found = self._api(
                partial(
                    core.list_namespaced_event,
                    region.namespace,
                    field_selector="involvedObject.kind=Pod",
                    _request_timeout=self._config.request_timeout_s,
                )
            ).items
        except errors.call_errors() as exc:
            logger.warning(
                "cannot read events in %s: %s", context, errors.failure_from_exception(exc).message
            )
            return {}
        newest: dict[str, tuple[float, str]] = {}
        for event in found:
            if event.reason not in _EVENT_REASONS or event.involved_object is None:
                continue
            when = event.last_timestamp or event.event_time or event.first_timestamp
            when_s = _epoch_s(when) if when else 0.0
            name = event.involved_object.name
            if name not in newest or when_s >= newest[name][0]:
                newest[name] = (when_s, f"{event.reason}: {event.message or ''}".strip())
        return {name: text for name, (_, text) in newest.items()}

    def _owned(self, obj: Any, *, service: bool = False) -> bool:
        """A pod (or a gang's Service) is ours: our cluster's label value, our exact
        cluster annotation and a name we make."""
        labels = obj.metadata.labels or {}
        name = obj.metadata.name or ""
        named = (
            naming.parse_instance_id(f"-/{name}") is not None
            if service
            else naming.gang_of_member("-", name) is not None
        )
        return (
            labels.get(LABEL_CLUSTER) == self._cluster_label
            and _annotation(obj, ANNOTATION_CLUSTER) == self.cluster
            and named
        )

    def _read_pod(self, region: KubeRegion, name: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        core = self._core_api(region.context)
        try:
            return self._api(
                partial(
                    core.read_namespaced_pod,
                    name,
                    region.namespace,
                    _request_timeout=self._config.request_timeout_s,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # -- plumbing ------------------------------------------------------------------------
    def _api(self, call: Callable[[], T]) -> T:
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

        retrying = Retrying(
            stop=stop_after_attempt(self._max_attempts),
            wait=wait_exponential(multiplier=1.0, min=1.0, max=30.0),
            retry=retry_if_exception(errors.is_retryable),
            sleep=self._sleep,
            reraise=True,
        )
        return retrying(call)

    def _core_api(self, context: str) -> Any:
        core = self._core.get(context)
        if core is None:
            from kubernetes import client, config

            api_client = self._api_clients.get(context)
            if api_client is None:
                api_client = config.new_client_from_config(
                    config_file=self._kubeconfig, context=context
                )
            core = client.CoreV1Api(api_client)
            self._core[context] = core
        return core

    def _now_s(self) -> float:
        return self._clock.now().timestamp()


def _annotation(obj: Any, key: str) -> str:
    return str((obj.metadata.annotations or {}).get(key, ""))


def _int(text: object) -> int:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return 0


def _price(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 else None


def _times(quantity: str, n: int) -> str:
    """`n` times a Kubernetes quantity such as "64Gi"."""
    digits = "".join(c for c in quantity if c.isdigit())
    unit = quantity[len(digits) :]
    return f"{int(digits or 0) * n}{unit}"


def _ready(node: Any) -> bool:
    if node.spec is not None and node.spec.unschedulable:
        return False
    for condition in node.status.conditions or []:
        if condition.type == "Ready":
            return bool(condition.status == "True")
    return False


def _pod_gpus(pod: Any) -> int:
    total = 0
    for container in pod.spec.containers or []:
        limits = (container.resources.limits or {}) if container.resources else {}
        total += _int(limits.get(GPU_RESOURCE))
    return total


def _pod_market(pod: Any) -> Market:
    return (
        Market.SPOT if _annotation(pod, ANNOTATION_OFFER).endswith(":spot") else (Market.ON_DEMAND)
    )


def _disruption(pod: Any) -> str | None:
    for condition in pod.status.conditions or []:
        if condition.type == "DisruptionTarget" and condition.status == "True":
            return str(condition.reason or "DisruptionTarget")
    return None


def _evicted(pod: Any) -> bool:
    return pod.status.phase == "Failed" and pod.status.reason in (
        "Evicted",
        "Preempting",
        "Terminated",
        "Shutdown",
    )


def _unschedulable(pod: Any) -> bool:
    for condition in pod.status.conditions or []:
        if (
            condition.type == "PodScheduled"
            and condition.status == "False"
            and condition.reason == "Unschedulable"
        ):
            return True
    return False


def _exit_detail(pod: Any) -> str:
    for status in pod.status.container_statuses or []:
        terminated = status.state.terminated if status.state is not None else None
        if terminated is not None:
            return f"exit code {terminated.exit_code} ({terminated.reason or 'Error'})"
    return str(pod.status.reason or "failed")


def _epoch_s(value: datetime | str) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.timestamp()
