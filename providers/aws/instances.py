"""EC2 instances as Heliotrope sees them: tags, gangs and states.

Every instance the adapter launches carries three tags (on the instance, its volumes and,
for spot, its spot request): `heliotrope:cluster`, `heliotrope:job` and
`heliotrope:request`. An instance without our cluster tag does not exist for the adapter.

A gang (`LaunchSpec.count` > 1) is two `RunInstances` calls: rank 0 alone, then the other
`count - 1` nodes, which learn rank 0's private address from their user data. All of them
share the request tag, and the others carry `heliotrope:gang=<rank 0's id>`: rank 0 is the
instance without it, the others' rank is 1 + their `AmiLaunchIndex`. A gang that failed
part way is terminated (rolled back); a retry of its request starts a new rank 0 (a new
ClientToken, `rank0_token(request, attempt)`), so the dead attempt is another gang. The
gang is known by its leader, rank 0; that is the id `launch` returns and `list_instances`,
`terminate` and `poll_events` use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from orchestrator.model import InstanceId, Market, Offer, OfferId
from providers.base import InstanceState

if TYPE_CHECKING:
    from mypy_boto3_ec2.type_defs import InstanceTypeDef

CLOUD: Final = "aws"
TAG_CLUSTER: Final = "heliotrope:cluster"
TAG_JOB: Final = "heliotrope:job"
TAG_REQUEST: Final = "heliotrope:request"
TAG_GANG: Final = "heliotrope:gang"  # on ranks 1..N-1: rank 0's instance id
TAG_KEYS: Final = (TAG_CLUSTER, TAG_JOB, TAG_REQUEST, TAG_GANG)
TAG_VALUE_CHARS: Final = 256  # EC2 tag value limit
CLIENT_TOKEN_CHARS: Final = 64  # EC2 ClientToken limit

LIVE_STATES: Final = frozenset({"pending", "running"})
GONE_STATES: Final = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
ALL_STATES: Final = ("pending", "running", "shutting-down", "terminated", "stopping", "stopped")

# StateReason codes (EC2 API reference, "StateReason"): why an instance went away.
SPOT_RECLAIM_REASON: Final = "Server.SpotInstanceTermination"


@dataclass(frozen=True, slots=True)
class AwsInstance:
    """The facts of one EC2 instance that the adapter uses (parsed from DescribeInstances)."""

    id: InstanceId
    region: str
    zone: str
    instance_type: str
    market: Market
    state: str  # EC2 state name: pending, running, shutting-down, terminated, ...
    state_reason: str  # StateReason code, "" when none
    launched_at_s: float
    launch_index: int
    cluster: str
    job_id: str
    request_id: str
    spot_request_id: str
    private_ip: str = ""
    gang_leader: str = ""  # rank 0's id, on ranks 1..N-1

    @property
    def rank(self) -> int:
        """The node rank in its gang."""
        return self.launch_index + 1 if self.gang_leader else self.launch_index

    @property
    def offer_id(self) -> OfferId:
        return Offer.make_id(CLOUD, self.zone, self.instance_type, self.market)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


def tags_of(raw: Iterable[Mapping[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw or () if "Key" in t and "Value" in t}


def parse_instance(raw: InstanceTypeDef, region: str) -> AwsInstance:
    tags = tags_of(raw.get("Tags"))  # type: ignore[arg-type]
    launched = raw.get("LaunchTime")
    return AwsInstance(
        id=raw.get("InstanceId", ""),
        region=region,
        zone=raw.get("Placement", {}).get("AvailabilityZone", ""),
        instance_type=raw.get("InstanceType", ""),
        market=Market.SPOT if raw.get("InstanceLifecycle") == "spot" else Market.ON_DEMAND,
        state=raw.get("State", {}).get("Name", ""),
        state_reason=raw.get("StateReason", {}).get("Code", ""),
        launched_at_s=launched.timestamp() if launched is not None else float("nan"),
        launch_index=raw.get("AmiLaunchIndex", 0),
        cluster=tags.get(TAG_CLUSTER, ""),
        job_id=tags.get(TAG_JOB, ""),
        request_id=tags.get(TAG_REQUEST, ""),
        spot_request_id=raw.get("SpotInstanceRequestId", "") or "",
        private_ip=raw.get("PrivateIpAddress", "") or "",
        gang_leader=tags.get(TAG_GANG, ""),
    )


def client_token(request_id: str) -> str:
    """The request id as an EC2 ClientToken (at most 64 printable ASCII characters; a
    longer or non-ASCII id is replaced by a digest of it)."""
    if (
        0 < len(request_id) <= CLIENT_TOKEN_CHARS
        and request_id.isascii()
        and (request_id.isprintable())
    ):
        return request_id
    return "sha256-" + hashlib.sha256(request_id.encode()).hexdigest()[: CLIENT_TOKEN_CHARS - 7]


def rank0_token(request_id: str, attempt: int) -> str:
    """The ClientToken of the `RunInstances` call that starts rank 0 of a gang (attempt 0:
    the request id itself)."""
    return client_token(request_id if attempt == 0 else f"{request_id}/{attempt}")


def ranks_token(request_id: str, rank0_id: str) -> str:
    """The ClientToken of the `RunInstances` call that starts ranks 1..N-1 of a gang."""
    return client_token(f"{request_id}/ranks/{rank0_id}")


def gangs(instances: Iterable[AwsInstance]) -> dict[str, list[AwsInstance]]:
    """Instances grouped by gang, keyed by its rank 0's id, each gang in rank order, leader
    first. Ranks 1..N-1 name their rank 0 (a tag); an instance of an older launch, made by
    one call for the whole gang, belongs with the one of its request at launch index 0."""
    by_request: dict[str, list[AwsInstance]] = {}
    for inst in instances:
        by_request.setdefault(inst.request_id or f"instance:{inst.id}", []).append(inst)
    groups: dict[str, list[AwsInstance]] = {}
    for members in by_request.values():
        heads = [m for m in members if not m.gang_leader and m.launch_index == 0]
        first = min(heads or members, key=lambda i: (i.rank, i.id))
        for m in members:
            key = m.gang_leader or (m.id if m in heads else first.id)
            groups.setdefault(key, []).append(m)
    for gang in groups.values():
        gang.sort(key=lambda i: (i.rank, i.id))
    return groups


def leader(members: Sequence[AwsInstance]) -> AwsInstance:
    return min(members, key=lambda i: (i.rank, i.id))


def gang_state(members: Sequence[AwsInstance]) -> InstanceState:
    """BOOTING while any member is pending, RUNNING when all run; a gang with a member
    gone is PREEMPTED when the spot market took one, TERMINATED otherwise."""
    if all(m.live for m in members):
        return (
            InstanceState.BOOTING
            if any(m.state == "pending" for m in members)
            else (InstanceState.RUNNING)
        )
    if any(m.state_reason == SPOT_RECLAIM_REASON for m in members):
        return InstanceState.PREEMPTED
    return InstanceState.TERMINATED


def parse_offer_id(offer_id: OfferId) -> tuple[str, str, Market] | None:
    """(zone, instance type, market) of an AWS offer id, None when it is not one."""
    parts = offer_id.split(":")
    if len(parts) != 4 or parts[0] != CLOUD or not parts[1] or not parts[2]:
        return None
    try:
        market = Market(parts[3])
    except ValueError:
        return None
    return parts[1], parts[2], market
