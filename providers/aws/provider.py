"""`AwsProvider`: EC2 GPU instances, spot and on-demand, for one Heliotrope cluster.

Safety rules (each has a test in tests/providers/aws/):
- Idempotent launch: a request id is looked up first (an instance tagged
  `heliotrope:request=<id>` in the cluster), and `RunInstances` carries it as its
  `ClientToken`, so a retried or repeated launch never buys a second instance.
- Ownership: list, terminate, poll and console output see only instances tagged
  `heliotrope:cluster=<cluster>`. `terminate` first describes the ids it is given, filtered
  by that tag, and terminates only what comes back; anything else is logged and skipped
  (`console_output` refuses it).
- Errors as data: a launch failure is a `LaunchOutcome(error=ProviderFailure)`, its kind
  mapped in `providers.aws.errors`; other calls raise `AwsTransientError` / `AwsPermanentError`.
  Throttling is retried here, and only here.
- IMDSv2 only, tags on instance, volumes and spot request, no credentials in user data.

Events (`poll_events`): spot request status codes (`marked-for-termination` ->
PREEMPTION_NOTICE; `instance-terminated-by-price`, `-no-capacity`, ... -> PREEMPTED;
`capacity-not-available`, `price-too-low`, ... -> CAPACITY_UNAVAILABLE) and instances that
went away (shutting-down, terminated, stopping, stopped) without this provider terminating
them -> PREEMPTED. Each is reported once per provider object; a restarted controller may
hear of a recent preemption again, which the loop ignores for instances it let go.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Final

from orchestrator.catalog import instance_gpus, on_demand_usd_per_hour, region_of_zone
from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import InputError
from orchestrator.model import InstanceId, Market, Offer, OfferId
from providers.aws import offers as offer_data
from providers.aws import s3 as s3_buckets
from providers.aws._session import Clients, SessionFactory
from providers.aws.errors import (
    AwsPermanentError,
    EdgeRetry,
    error_code,
    failure_of,
    is_aws_error,
    raise_mapped,
)
from providers.aws.instances import (
    ALL_STATES,
    CLOUD,
    GONE_STATES,
    SPOT_RECLAIM_REASON,
    TAG_CLUSTER,
    TAG_GANG,
    TAG_JOB,
    TAG_REQUEST,
    TAG_VALUE_CHARS,
    AwsInstance,
    gang_state,
    gangs,
    leader,
    parse_instance,
    parse_offer_id,
    rank0_token,
    ranks_token,
    tags_of,
)
from providers.aws.offers import OfferBook
from providers.aws.userdata import UserDataError, render
from providers.base import (
    Capability,
    EventType,
    FailureKind,
    InstanceInfo,
    LaunchOutcome,
    LaunchSpec,
    ProviderEvent,
    ProviderFailure,
    Quote,
)
from providers.gang import all_or_none, count_invalid, roll_back

if TYPE_CHECKING:
    from mypy_boto3_ec2.type_defs import (
        FilterTypeDef,
        RunInstancesRequestTypeDef,
        SpotInstanceRequestTypeDef,
        TagSpecificationTypeDef,
        TagTypeDef,
    )

logger = logging.getLogger(__name__)

# Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04), x86_64: the public SSM
# parameter that names its newest id in each region ("Finding the ID of a DLAMI").
DEFAULT_AMI_PARAMETER: Final = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)
DESCRIBE_CHUNK: Final = 100  # filter values per DescribeInstances request
TERMINATE_CHUNK: Final = 1000  # ids per TerminateInstances request
METADATA_HOP_LIMIT: Final = 2  # lets a container on the instance reach IMDSv2

_CLUSTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d+$")

# Spot request status codes (EC2 User Guide, "Spot request status") -> what they mean for
# the job. Codes not listed (pending-*, fulfilled, instance-terminated-by-user, ...) are not
# events: either nothing happened, or we did it.
SPOT_STATUS_EVENTS: Final[Mapping[str, EventType]] = {
    "marked-for-termination": EventType.PREEMPTION_NOTICE,  # the two-minute warning
    "marked-for-stop": EventType.PREEMPTION_NOTICE,
    "marked-for-hibernation": EventType.PREEMPTION_NOTICE,
    "instance-terminated-by-price": EventType.PREEMPTED,
    "instance-terminated-by-service": EventType.PREEMPTED,
    "instance-terminated-by-experiment": EventType.PREEMPTED,  # AWS FIS interruption
    "instance-terminated-no-capacity": EventType.PREEMPTED,
    "instance-terminated-capacity-oversubscribed": EventType.PREEMPTED,
    "instance-terminated-launch-group-constraint": EventType.PREEMPTED,
    "instance-stopped-by-price": EventType.PREEMPTED,
    "instance-stopped-by-experiment": EventType.PREEMPTED,
    "instance-stopped-no-capacity": EventType.PREEMPTED,
    "instance-stopped-capacity-oversubscribed": EventType.PREEMPTED,
    "capacity-not-available": EventType.CAPACITY_UNAVAILABLE,
    "capacity-oversubscribed": EventType.CAPACITY_UNAVAILABLE,
    "price-too-low": EventType.CAPACITY_UNAVAILABLE,
    "az-group-constraint": EventType.CAPACITY_UNAVAILABLE,
    "placement-group-constraint": EventType.CAPACITY_UNAVAILABLE,
    "constraint-not-fulfillable": EventType.CAPACITY_UNAVAILABLE,
    "launch-group-constraint": EventType.CAPACITY_UNAVAILABLE,
}


def _chunks(values: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(values), size):
        yield list(values[start : start + size])


class AwsProvider:
    """GPU instances on EC2 for one cluster, in `regions`.

    `session_factory` makes a boto3 session (called once per thread; default: the standard
    credential chain). The AMI is `image_id` (one id, or one per region) or else the value
    of the SSM parameter `ami_parameter` in each region (default: the Deep Learning Base
    AMI). `instance_profile` (an IAM instance profile name) gives the job its AWS access;
    `subnet_ids` maps a zone to a subnet, `security_group_ids` applies to every launch.
    Offers are cached for `offers_ttl_s`, on-demand prices for `on_demand_ttl_s`.
    `sleep` (default: the clock's) is how retries wait.
    """

    name = "aws"

    def __init__(
        self,
        *,
        cluster: str,
        regions: Sequence[str],
        session_factory: SessionFactory | None = None,
        clock: Clock | None = None,
        pricing_region: str = "us-east-1",
        image_id: str | Mapping[str, str] | None = None,
        ami_parameter: str = DEFAULT_AMI_PARAMETER,
        instance_profile: str | None = None,
        subnet_ids: Mapping[str, str] | None = None,
        security_group_ids: Sequence[str] = (),
        offers_ttl_s: float = 600.0,
        on_demand_ttl_s: float = 86_400.0,
        retry_attempts: int = 5,
        sleep: Callable[[float], None] | None = None,
        endpoint_urls: Mapping[str, str] | None = None,
    ) -> None:
        if not _CLUSTER.fullmatch(cluster):
            raise InputError(
                "aws provider",
                "cluster",
                "1-63 letters, digits, '.', '_' or '-'",
                got=repr(cluster),
            )
        if not regions:
            raise InputError("aws provider", "regions", "at least one AWS region", got="[]")
        for region in (*regions, pricing_region):
            if not _REGION.fullmatch(region):
                raise InputError(
                    "aws provider", "regions", "AWS region names like us-east-1", got=repr(region)
                )
        if not offers_ttl_s >= 0 or not on_demand_ttl_s >= 0:
            raise InputError("aws provider", "offers_ttl_s", "seconds >= 0")
        self._cluster = cluster
        self._regions = tuple(dict.fromkeys(regions))
        self._clock: Clock = clock or SystemClock()
        self._clients = Clients(session_factory, endpoint_urls=endpoint_urls)
        self._retry = EdgeRetry(sleep or self._clock.sleep, attempts=retry_attempts)
        self._pricing_region = pricing_region
        self._image_id = image_id
        self._ami_parameter = ami_parameter
        self._instance_profile = instance_profile
        self._subnet_ids = dict(subnet_ids or {})
        self._security_group_ids = tuple(security_group_ids)
        self._offers_ttl_s = offers_ttl_s
        self._on_demand_ttl_s = on_demand_ttl_s
        self._lock = threading.RLock()
        self._book: OfferBook | None = None
        self._region_books: dict[str, list[offer_data.PricedOffer]] = {}
        self._on_demand: dict[tuple[str, str], tuple[float | None, float]] = {}
        self._amis: dict[str, str] = {}
        self._terminated: set[InstanceId] = set()  # instances this object terminated
        self._reported: set[tuple[str, EventType]] = set()

    @property
    def cluster(self) -> str:
        return self._cluster

    @property
    def regions(self) -> tuple[str, ...]:
        return self._regions

    # -- contract -------------------------------------------------------------------------
    def capabilities(self) -> frozenset[Capability]:
        return frozenset(
            {
                Capability.SPOT,
                Capability.ON_DEMAND,
                Capability.PREEMPTION_NOTICE,
                Capability.CHECKPOINT_STORE,
                Capability.PRICES,
                Capability.LOGS,
            }
        )

    def offers(self) -> Sequence[Offer]:
        return self.offer_book().offers

    def prices(self) -> Mapping[OfferId, float]:
        """$/h per offer (whole instance): spot from the price history, on-demand from the
        Pricing API or the catalog. Offers without a known price are absent."""
        return self.offer_book().usd_per_hour

    def quotes(self) -> dict[OfferId, Quote]:
        """`prices()` with where each came from (`DescribeSpotPriceHistory`,
        `pricing:GetProducts`, `catalog`), `Capability.PRICES`."""
        book = self.offer_book()
        return {
            k: Quote(usd, book.price_source.get(k, CLOUD)) for k, usd in book.usd_per_hour.items()
        }

    def offer_book(self, *, refresh: bool = False) -> OfferBook:
        """Offers and prices, fetched at most every `offers_ttl_s` (or now, `refresh`).
        A region that cannot be read keeps its last offers (logged); with none, it has none;
        when no region can be read at all, the first error is raised."""
        now = self._clock.now()
        now_s = now.timestamp()
        with self._lock:
            book = self._book
            if not refresh and book is not None and now_s - book.fetched_at_s < self._offers_ttl_s:
                return book
            first_error: BaseException | None = None
            for region in self._regions:
                try:
                    self._region_books[region] = self._fetch_region(region, now)
                except Exception as exc:
                    if not is_aws_error(exc):
                        raise
                    failure = failure_of(exc, action=f"offers {region}")
                    logger.error(
                        "cannot read offers in %s (%s); %s",
                        region,
                        failure.message,
                        "keeping the last ones"
                        if region in self._region_books
                        else "it has no offers for now",
                    )
                    first_error = first_error or exc
            if not self._region_books and first_error is not None:
                raise_mapped(first_error, action="aws offers")
            priced = [p for r in self._regions for p in self._region_books.get(r, ())]
            self._book = OfferBook.of(priced, now_s)
            return self._book

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]:
        """Gangs of `cluster` with at least one instance pending or running, by leader id."""
        found: dict[InstanceId, InstanceInfo] = {}
        for region in self._regions:
            with _mapped(f"ec2:DescribeInstances {region}"):
                members = self._describe(region, cluster=cluster)
            for gang in gangs(members).values():
                if not any(m.live for m in gang):
                    continue
                lead = leader(gang)
                found[lead.id] = InstanceInfo(
                    id=lead.id,
                    offer_id=lead.offer_id,
                    job_id=lead.job_id,
                    state=gang_state(gang),
                    launched_at_s=lead.launched_at_s,
                    ready_at_s=lead.launched_at_s,  # the job restores itself; AWS cannot tell
                )
        return found

    def launch(self, spec: LaunchSpec, *, request_id: str) -> LaunchOutcome:
        """Start the gang of `spec.count` instances of the offer running the job, all or
        none: rank 0 first, then the others with rank 0's private address; a failure part
        way terminates what this request made. The leader's (rank 0's) id comes back. The
        same `request_id` adopts what it launched before and buys only what is missing."""
        parsed = parse_offer_id(spec.offer_id)
        invalid = self._invalid(spec, request_id, parsed)
        if invalid is not None or parsed is None:
            logger.warning("launch %s refused: %s", request_id, invalid)
            return LaunchOutcome(None, error=ProviderFailure(FailureKind.INVALID, invalid or ""))
        zone, instance_type, market = parsed
        region = region_of_zone(CLOUD, zone)
        try:
            self._user_data(spec, request_id, zone, rank0=None)  # refuse a bad spec up front
        except UserDataError as exc:
            logger.warning("launch %s refused: %s", request_id, exc)
            return LaunchOutcome(None, error=ProviderFailure(FailureKind.INVALID, str(exc)))
        action = f"ec2:RunInstances {zone} {instance_type} {market.value}"
        led: list[AwsInstance] = []
        failure = all_or_none(
            gang_id=request_id,
            spec=spec,
            request_id=request_id,
            start=lambda: self._start_gang(spec, request_id, zone, led),
            roll_back=lambda: self._roll_back(region, request_id),
            call_errors=(Exception,),
            failure_of=lambda exc: self._launch_failure(exc, action),
        )
        if failure is not None:
            return LaunchOutcome(None, error=failure)
        return self._outcome(led[0], spec)

    def _start_gang(
        self, spec: LaunchSpec, request_id: str, zone: str, led: list[AwsInstance]
    ) -> ProviderFailure | None:
        """Launch what of the gang is missing (rank 0, then ranks 1..N-1); the leader goes
        into `led`. A gang of this request that is complete (in any state: the same request
        returns the same instance) or whose rank 0 is live is adopted; a failure comes back,
        or is raised for `_launch_failure` to map."""
        region = region_of_zone(CLOUD, zone)
        members = self._describe(region, cluster=self._cluster, request_ids=[request_id])
        attempts = 0
        for gang in gangs(members).values():
            lead = leader(gang)
            if lead.gang_leader:
                continue  # ranks without their rank 0: not a gang to adopt
            attempts += 1
            if len(gang) >= spec.count or lead.live:
                logger.info(
                    "launch %s: adopting %s (%s)",
                    request_id,
                    lead.id,
                    ", ".join(f"{m.id} {m.state}" for m in gang),
                )
                led.append(lead)
                return None if len(gang) >= spec.count else self._start_ranks(spec, zone, lead)
        made = self._run(spec, request_id, zone, rank0=None, attempt=attempts)
        if isinstance(made, ProviderFailure):
            return made
        led.append(made[0])
        return None if spec.count == 1 else self._start_ranks(spec, zone, made[0])

    def _start_ranks(
        self, spec: LaunchSpec, zone: str, lead: AwsInstance
    ) -> ProviderFailure | None:
        """Ranks 1..N-1 of the gang led by `lead`, told its private address."""
        if not lead.private_ip:  # RunInstances names it; a describe does once it is known
            region = region_of_zone(CLOUD, zone)
            found = self._describe(region, cluster=self._cluster, instance_ids=[lead.id])
            lead = next((m for m in found if m.private_ip), lead)
        if not lead.private_ip:
            return ProviderFailure(
                FailureKind.TRANSIENT, f"rank 0 ({lead.id}) has no private address yet", 30.0
            )
        made = self._run(spec, lead.request_id, zone, rank0=lead)
        return made if isinstance(made, ProviderFailure) else None

    def _run(
        self,
        spec: LaunchSpec,
        request_id: str,
        zone: str,
        *,
        rank0: AwsInstance | None,
        attempt: int = 0,
    ) -> list[AwsInstance] | ProviderFailure:
        """One `RunInstances` call: rank 0 alone (`rank0` None) or the other nodes."""
        parsed = parse_offer_id(spec.offer_id)
        assert parsed is not None
        _, instance_type, market = parsed
        region = region_of_zone(CLOUD, zone)
        user_data = self._user_data(spec, request_id, zone, rank0=rank0)
        params = self._run_params(
            spec,
            request_id,
            zone,
            instance_type,
            market,
            self._ami(region),
            user_data,
            rank0=rank0,
            attempt=attempt,
        )
        action = f"ec2:RunInstances {zone} {instance_type} {market.value}"
        ec2 = self._clients.ec2(region)
        response = self._retry(lambda: ec2.run_instances(**params), action)
        instances = [parse_instance(raw, region) for raw in response.get("Instances", [])]
        wanted = params["MinCount"]
        if len(instances) != wanted:
            return ProviderFailure(
                FailureKind.TRANSIENT,
                f"{action}: {len(instances)} instance(s) in the answer, {wanted} asked for",
                30.0,
            )
        logger.info(
            "launched %s (rank%s %s of %d, %s, %s, %s) for job %s, request %s",
            ", ".join(i.id for i in instances),
            "s" if wanted > 1 else "",
            "0" if rank0 is None else f"1-{spec.count - 1}",
            spec.count,
            instance_type,
            market.value,
            zone,
            spec.job_id,
            request_id,
        )
        return instances

    def _user_data(
        self, spec: LaunchSpec, request_id: str, zone: str, *, rank0: AwsInstance | None
    ) -> str:
        parsed = parse_offer_id(spec.offer_id)
        shape = instance_gpus(CLOUD, parsed[1]) if parsed is not None else None
        return render(
            spec=spec,
            cluster=self._cluster,
            request_id=request_id,
            region=region_of_zone(CLOUD, zone),
            zone=zone,
            nproc_per_node=shape[1] if shape is not None else 1,
            rank0=None if rank0 is None else (rank0.id, rank0.private_ip),
        )

    def _launch_failure(self, exc: BaseException, action: str) -> ProviderFailure:
        if isinstance(exc, UserDataError):
            return ProviderFailure(FailureKind.INVALID, str(exc))
        if isinstance(exc, AwsPermanentError):
            return exc.failure
        if not is_aws_error(exc):
            raise exc
        failure = failure_of(exc, action=action)
        logger.warning("%s failed (%s): %s", action, failure.kind.value, failure.message)
        return failure

    def _roll_back(self, region: str, request_id: str) -> None:
        """Terminate the instances of a failed gang that this request made."""
        try:
            members = self._describe(region, cluster=self._cluster, request_ids=[request_id])
        except Exception as exc:
            if not is_aws_error(exc):
                raise
            logger.warning("could not roll back request %s: %s", request_id, exc)
            return
        roll_back(
            members,
            request_id=request_id,
            made_here=lambda m: (
                m.cluster == self._cluster and m.request_id == request_id and m.live
            ),
            delete=lambda m: self._terminate_chunk(region, [m.id]),
            name=lambda m: m.id,
            call_errors=(Exception,),
        )

    def terminate(self, ids: Sequence[InstanceId], *, request_id: str) -> None:
        """Terminate the gangs of `ids` that carry this cluster's tag (found by describing
        the ids with the tag as a filter); other ids are logged and skipped."""
        remaining = {i for i in ids if i}
        for region in self._regions:
            if not remaining:
                break
            with _mapped(f"ec2:DescribeInstances {region}"):
                hits = self._describe(region, cluster=self._cluster, instance_ids=sorted(remaining))
                if not hits:
                    continue
                remaining -= {h.id for h in hits}
                members = {h.id: h for h in hits}
                requests = sorted({h.request_id for h in hits if h.request_id})
                if requests:
                    for m in self._describe(region, cluster=self._cluster, request_ids=requests):
                        members[m.id] = m
            victims = sorted(
                m.id
                for m in members.values()
                if m.cluster == self._cluster and m.state not in ("shutting-down", "terminated")
            )
            with self._lock:
                self._terminated.update(i for i, m in members.items() if i not in victims)
            for chunk in _chunks(victims, TERMINATE_CHUNK):
                self._terminate_chunk(region, chunk)
            if victims:
                logger.info(
                    "terminated %s in %s (request %s)", ", ".join(victims), region, request_id
                )
        for instance_id in sorted(remaining):
            logger.warning(
                "terminate %s (request %s): not an instance of cluster %s in %s; skipped",
                instance_id,
                request_id,
                self._cluster,
                ", ".join(self._regions),
            )

    def poll_events(self) -> list[ProviderEvent]:
        """Preemption notices, preemptions and capacity losses since the last poll, each
        reported once, by gang leader."""
        now_s = self._clock.now().timestamp()
        observed = []  # read every region first: a failed read reports (and forgets) nothing
        for region in self._regions:
            with _mapped(f"ec2:DescribeInstances {region}"):
                members = self._describe(region, cluster=self._cluster)
            with _mapped(f"ec2:DescribeSpotInstanceRequests {region}"):
                requests = self._spot_requests(region)
            observed.append((members, requests))
        events: list[ProviderEvent] = []
        seen: set[str] = set()
        for members, requests in observed:
            groups = gangs(members)
            leader_of: dict[str, AwsInstance] = {}
            for gang in groups.values():
                lead = leader(gang)
                for m in gang:
                    leader_of[m.id] = lead
                    if m.request_id:
                        leader_of[f"request:{m.request_id}"] = lead
            seen.update(m.id for m in members)
            with self._lock:
                ended_by_us = {leader_of[i].id for i in self._terminated if i in leader_of}
            for request in requests:
                self._spot_event(request, leader_of, ended_by_us, now_s, events, seen)
            for gang in groups.values():
                lead = leader(gang)
                if lead.id in ended_by_us:
                    continue
                gone = [m for m in gang if m.state in GONE_STATES]
                if gone:
                    m = gone[0]
                    why = (
                        "spot capacity reclaimed"
                        if m.state_reason == SPOT_RECLAIM_REASON
                        else f"not by Heliotrope ({m.state_reason or 'no reason given'})"
                    )
                    self._emit(events, EventType.PREEMPTED, lead, now_s, f"{m.id} {m.state}: {why}")
        with self._lock:  # forget what AWS no longer shows: it will not come back
            self._reported = {key for key in self._reported if key[0] in seen}
            self._terminated &= seen
        return events

    def console_output(self, instance_id: InstanceId) -> str:
        """`Capability.LOGS`: what the instance wrote to its console (`GetConsoleOutput`,
        `Latest=True`: the newest 64 KB, on Nitro instances; older ones give what EC2 last
        captured), "" while there is none. For a gang, its id is rank 0's: rank 0's text.
        Only an instance of this cluster is read: the id is described with the cluster tag
        as a filter first (as `terminate` does); any other raises `InputError`."""
        for region in self._regions:
            with _mapped(f"ec2:DescribeInstances {region}"):
                hits = self._describe(region, cluster=self._cluster, instance_ids=[instance_id])
            if any(h.id == instance_id and h.cluster == self._cluster for h in hits):
                return self._console(region, instance_id)
        raise InputError(
            "aws provider",
            "instance",
            f"an instance of cluster {self._cluster} in {', '.join(self._regions)}",
            got=instance_id,
            fix="`heliotrope events JOB` names the instances Heliotrope launched",
        )

    def _console(self, region: str, instance_id: InstanceId) -> str:
        ec2 = self._clients.ec2(region)
        action = f"ec2:GetConsoleOutput {region}"
        with _mapped(action):
            try:
                answer = self._retry(
                    lambda: ec2.get_console_output(InstanceId=instance_id, Latest=True), action
                )
            except Exception as exc:
                if error_code(exc) != "UnsupportedOperation":  # `Latest`: Nitro instances only
                    raise
                answer = self._retry(lambda: ec2.get_console_output(InstanceId=instance_id), action)
        return answer.get("Output") or ""  # base64 on the wire; botocore decodes it

    # -- checkpoint store -------------------------------------------------------------------
    def ensure_checkpoint_bucket(
        self, region: str, name: str, *, kms_key_id: str | None = None
    ) -> str:
        """Create (if missing) and secure the checkpoint bucket `name` in `region`: SSE
        (AES256, or KMS with `kms_key_id`), public access blocked, tagged with the cluster.
        Returns `s3://name`."""
        with _mapped(f"s3 {name}"):
            return s3_buckets.ensure_checkpoint_bucket(
                self._clients.s3(region),
                self._retry,
                region=region,
                name=name,
                cluster=self._cluster,
                kms_key_id=kms_key_id,
            )

    # -- internals -------------------------------------------------------------------------
    def _invalid(
        self, spec: LaunchSpec, request_id: str, parsed: tuple[str, str, Market] | None
    ) -> str | None:
        if parsed is None:
            return f"{spec.offer_id!r} is not an AWS offer id (aws:<zone>:<type>:<market>)"
        region = region_of_zone(CLOUD, parsed[0])
        if region not in self._regions:
            return (
                f"offer {spec.offer_id} is in {region}; this provider serves "
                f"{', '.join(self._regions)}"
            )
        if spec.cluster != self._cluster:
            return f"launch spec for cluster {spec.cluster!r} sent to cluster {self._cluster!r}"
        if (bad := count_invalid(spec.count)) is not None:
            return bad
        for what, value in (("request id", request_id), ("job id", spec.job_id)):
            if not value or len(value) > TAG_VALUE_CHARS:
                return f"{what} must have 1-{TAG_VALUE_CHARS} characters, got {len(value)}"
        return None

    def _outcome(self, lead: AwsInstance, spec: LaunchSpec) -> LaunchOutcome:
        launched_s = lead.launched_at_s
        if math.isnan(launched_s):
            launched_s = self._clock.now().timestamp()
        return LaunchOutcome(lead.id, ready_at_s=launched_s + spec.startup_s)

    def launch_request(self, spec: LaunchSpec, *, request_id: str) -> RunInstancesRequestTypeDef:
        """Exactly the `RunInstances` request `launch(spec, request_id=...)` sends first
        (rank 0's: tags, IMDSv2, market options, user data), for a dry run (`providers
        check`)."""
        parsed = parse_offer_id(spec.offer_id)
        if parsed is None:
            raise AwsPermanentError(
                ProviderFailure(
                    FailureKind.INVALID, f"offer {spec.offer_id!r} is not an AWS offer id"
                )
            )
        zone, instance_type, market = parsed
        user_data = self._user_data(spec, request_id, zone, rank0=None)
        return self._run_params(
            spec,
            request_id,
            zone,
            instance_type,
            market,
            self._ami(region_of_zone(CLOUD, zone)),
            user_data,
        )

    def _run_params(
        self,
        spec: LaunchSpec,
        request_id: str,
        zone: str,
        instance_type: str,
        market: Market,
        image_id: str,
        user_data: str,
        *,
        rank0: AwsInstance | None = None,
        attempt: int = 0,
    ) -> RunInstancesRequestTypeDef:
        """Rank 0's `RunInstances` request (`rank0` None; the `attempt`-th of its request),
        or that of ranks 1..N-1 of the gang `rank0` leads."""
        tags: list[TagTypeDef] = [
            {"Key": TAG_CLUSTER, "Value": self._cluster},
            {"Key": TAG_JOB, "Value": spec.job_id},
            {"Key": TAG_REQUEST, "Value": request_id},
        ]
        if rank0 is not None:
            tags.append({"Key": TAG_GANG, "Value": rank0.id})
        count = 1 if rank0 is None else spec.count - 1
        tag_specs: list[TagSpecificationTypeDef] = [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ]
        params: RunInstancesRequestTypeDef = {
            "ImageId": image_id,
            "InstanceType": instance_type,  # type: ignore[typeddict-item]
            "MinCount": count,
            "MaxCount": count,
            "ClientToken": (
                rank0_token(request_id, attempt)
                if rank0 is None
                else ranks_token(request_id, rank0.id)
            ),
            "Placement": {"AvailabilityZone": zone},
            "MetadataOptions": {
                "HttpTokens": "required",
                "HttpEndpoint": "enabled",
                "HttpPutResponseHopLimit": METADATA_HOP_LIMIT,
            },
            "UserData": user_data,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": tag_specs,
        }
        if market is Market.SPOT:
            tag_specs.append({"ResourceType": "spot-instances-request", "Tags": tags})
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        if self._instance_profile:
            params["IamInstanceProfile"] = {"Name": self._instance_profile}
        if zone in self._subnet_ids:
            params["SubnetId"] = self._subnet_ids[zone]
        if self._security_group_ids:
            params["SecurityGroupIds"] = list(self._security_group_ids)
        return params

    def _terminate_chunk(self, region: str, ids: list[str]) -> None:
        ec2 = self._clients.ec2(region)
        action = f"ec2:TerminateInstances {region}"
        with _mapped(action):
            self._retry(lambda: ec2.terminate_instances(InstanceIds=ids), action)
        with self._lock:
            self._terminated.update(ids)

    def _ami(self, region: str) -> str:
        if isinstance(self._image_id, str):
            return self._image_id
        if self._image_id is not None:
            ami = self._image_id.get(region)
            if ami is None:
                raise AwsPermanentError(
                    ProviderFailure(FailureKind.INVALID, f"no image_id configured for {region}")
                )
            return ami
        with self._lock:
            cached = self._amis.get(region)
        if cached is not None:
            return cached
        ssm = self._clients.ssm(region)
        answer = self._retry(
            lambda: ssm.get_parameter(Name=self._ami_parameter), f"ssm:GetParameter {region}"
        )
        ami = str(answer.get("Parameter", {}).get("Value", ""))
        if not ami.startswith("ami-"):
            raise AwsPermanentError(
                ProviderFailure(
                    FailureKind.INVALID,
                    f"SSM parameter {self._ami_parameter} in {region} does not name an AMI",
                )
            )
        with self._lock:
            self._amis[region] = ami
        logger.info("AMI for %s: %s (from %s)", region, ami, self._ami_parameter)
        return ami

    def _describe(
        self,
        region: str,
        *,
        cluster: str,
        instance_ids: Sequence[str] = (),
        request_ids: Sequence[str] = (),
    ) -> list[AwsInstance]:
        """Instances tagged with `cluster` (any state), optionally only the given ids or
        request tags. The tag is checked again on every answer: a filter is not trusted."""
        ec2 = self._clients.ec2(region)
        paginator = ec2.get_paginator("describe_instances")
        base: list[FilterTypeDef] = [
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
            {"Name": "instance-state-name", "Values": list(ALL_STATES)},
        ]
        batches: list[list[FilterTypeDef]] = []
        if instance_ids:
            batches += [
                [*base, {"Name": "instance-id", "Values": c}]
                for c in _chunks(instance_ids, DESCRIBE_CHUNK)
            ]
        if request_ids:
            batches += [
                [*base, {"Name": f"tag:{TAG_REQUEST}", "Values": c}]
                for c in _chunks(request_ids, DESCRIBE_CHUNK)
            ]
        if not instance_ids and not request_ids:
            batches = [base]
        found: dict[str, AwsInstance] = {}
        for filters in batches:
            pages = self._retry(
                lambda filters=filters: list(
                    paginator.paginate(  # type: ignore[misc]
                        Filters=filters
                    )
                ),
                f"ec2:DescribeInstances {region}",
            )
            for page in pages:
                for reservation in page.get("Reservations", []):
                    for raw in reservation.get("Instances", []):
                        inst = parse_instance(raw, region)
                        if inst.cluster == cluster and inst.id:
                            found[inst.id] = inst
        return list(found.values())

    def _spot_requests(self, region: str) -> list[SpotInstanceRequestTypeDef]:
        ec2 = self._clients.ec2(region)
        paginator = ec2.get_paginator("describe_spot_instance_requests")
        pages = self._retry(
            lambda: list(
                paginator.paginate(
                    Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [self._cluster]}]
                )
            ),
            f"ec2:DescribeSpotInstanceRequests {region}",
        )
        return [
            r
            for page in pages
            for r in page.get("SpotInstanceRequests", [])
            if tags_of(r.get("Tags")).get(TAG_CLUSTER) == self._cluster  # type: ignore[arg-type]
        ]

    def _spot_event(
        self,
        request: SpotInstanceRequestTypeDef,
        leader_of: Mapping[str, AwsInstance],
        ended_by_us: set[str],
        now_s: float,
        events: list[ProviderEvent],
        seen: set[str],
    ) -> None:
        status = request.get("Status", {})
        code = status.get("Code", "")
        kind = SPOT_STATUS_EVENTS.get(code)
        request_key = request.get("SpotInstanceRequestId", "")
        seen.update((request_key, request.get("InstanceId", "")))
        if kind is None:
            return
        tags = tags_of(request.get("Tags"))  # type: ignore[arg-type]
        lead = leader_of.get(request.get("InstanceId", "")) or leader_of.get(
            f"request:{tags.get(TAG_REQUEST, '')}"
        )
        if lead is not None and lead.id in ended_by_us:
            return
        detail = f"spot request {request_key}: {code}"
        if status.get("Message"):
            detail += f" ({status.get('Message')})"
        if lead is not None:
            self._emit(events, kind, lead, now_s, detail)
            return
        key = (request.get("InstanceId") or request_key, kind)
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        events.append(ProviderEvent(kind, key[0], tags.get(TAG_JOB, ""), now_s, detail))

    def _emit(
        self,
        events: list[ProviderEvent],
        kind: EventType,
        lead: AwsInstance,
        now_s: float,
        detail: str,
    ) -> None:
        key = (lead.id, kind)
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        logger.warning("%s %s (job %s): %s", kind.value, lead.id, lead.job_id, detail)
        events.append(ProviderEvent(kind, lead.id, lead.job_id, now_s, detail))

    def _fetch_region(self, region: str, now: datetime) -> list[offer_data.PricedOffer]:
        ec2 = self._clients.ec2(region)
        gpus = offer_data.fetch_gpu_types(ec2, self._retry, region)
        zones = offer_data.fetch_zones(ec2, self._retry, region, sorted(gpus))
        sold = {t: g for t, g in gpus.items() if zones.get(t)}
        spot = offer_data.fetch_spot_prices(ec2, self._retry, region, sorted(sold), now)
        on_demand = self._on_demand_prices(region, sorted(sold), now.timestamp())
        return offer_data.region_offers(region, sold, zones, spot, on_demand)

    def _on_demand_prices(
        self, region: str, instance_types: Sequence[str], now_s: float
    ) -> dict[str, tuple[float, str]]:
        """{type: (price, source)}: the Pricing API (cached), else the catalog's list price.
        After one failed Pricing call the rest of this refresh uses the catalog."""
        prices: dict[str, tuple[float, str]] = {}
        pricing_ok = True
        for instance_type in instance_types:
            key = (region, instance_type)
            cached = self._on_demand.get(key)
            usd: float | None = None
            if cached is not None and now_s - cached[1] < self._on_demand_ttl_s:
                usd = cached[0]
            elif pricing_ok:
                try:
                    usd = offer_data.fetch_on_demand(
                        self._clients.pricing(self._pricing_region),
                        self._retry,
                        region,
                        instance_type,
                    )
                    self._on_demand[key] = (usd, now_s)
                except Exception as exc:
                    if not is_aws_error(exc):
                        raise
                    pricing_ok = False
                    logger.warning(
                        "Pricing API unavailable (%s); on-demand prices in %s come "
                        "from the catalog",
                        failure_of(exc, action="pricing:GetProducts").message,
                        region,
                    )
            if usd is not None:
                prices[instance_type] = (usd, offer_data.SOURCE_PRICING)
                continue
            listed = on_demand_usd_per_hour(CLOUD, instance_type)
            if listed is not None:
                prices[instance_type] = (listed, offer_data.SOURCE_CATALOG)
        return prices


@contextlib.contextmanager
def _mapped(action: str) -> Iterator[None]:
    """Re-raise botocore errors as Heliotrope errors (transient or permanent)."""
    try:
        yield
    except Exception as exc:
        if is_aws_error(exc):
            raise_mapped(exc, action=action)
        raise
