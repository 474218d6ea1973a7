"""The launch contract of a gang, in one place for every provider.

A job of `nodes: N` and `gpus_per_node: G` (`LaunchSpec.count` instances of an offer with
G GPUs) is launched as a gang: all N nodes or none. Every adapter

- gives node `r` the environment `environment(...)` returns: MASTER_ADDR, MASTER_PORT,
  NNODES, NODE_RANK, NPROC_PER_NODE (and torchrun's PET_* defaults of the same five), the
  same under HELIOTROPE_* names, and HELIOTROPE_JOB_ID, _CLUSTER, _INSTANCE_ID (the gang's
  id), _OFFER_ID, _REGION, _ZONE, _REQUEST_ID;
- runs `command(...)`: the job under `torchrun` with a c10d rendezvous at rank 0
  (`--nnodes N --nproc-per-node G --node-rank r --rdzv-backend c10d --rdzv-endpoint
  MASTER_ADDR:MASTER_PORT --rdzv-id <gang> --no-python <entrypoint>`), unless the launch
  says `Launcher.NONE`, the entrypoint is a torchrun already (it reads the PET_* defaults),
  or the gang is one process (torchrun would only add an agent);
- on a failure part way, calls `roll_back(...)`: every member this request made is deleted,
  nothing else is touched, so a failed gang leaves no instance behind;
- is idempotent by request id: a retried launch finds the members it made (by their
  request tag or label) and adopts them instead of buying more (`foreign_member` and
  `member_going` say when a member found under the gang's name cannot be adopted);
- reports a preemption of any member as a preemption of the gang, under the gang's id.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from orchestrator.model import Market
from providers.base import FailureKind, Launcher, LaunchSpec, ProviderFailure

logger = logging.getLogger(__name__)

MASTER_PORT: Final = 29500  # torchrun's default rendezvous port, opened by every adapter
TORCHRUN: Final = ("torchrun",)
RDZV_ID_CHARS: Final = 64
#: The five variables torchrun also reads as PET_<name> (its defaults for its flags).
TORCH_NAMES: Final = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE")
#: The names whose value is the node's rank.
RANK_NAMES: Final = ("NODE_RANK", "PET_NODE_RANK", "HELIOTROPE_NODE_RANK")
#: The HELIOTROPE_* names every node gets on every provider.
HELIOTROPE_NAMES: Final = (
    "HELIOTROPE_JOB_ID",
    "HELIOTROPE_CLUSTER",
    "HELIOTROPE_INSTANCE_ID",
    "HELIOTROPE_OFFER_ID",
    "HELIOTROPE_REGION",
    "HELIOTROPE_ZONE",
    "HELIOTROPE_REQUEST_ID",
    "HELIOTROPE_NODE_RANK",
    "HELIOTROPE_NUM_NODES",
    "HELIOTROPE_NPROC_PER_NODE",
    "HELIOTROPE_MASTER_ADDR",
    "HELIOTROPE_MASTER_PORT",
)
_TORCHRUN_MODULES: Final = frozenset({"torch.distributed.run", "torch.distributed.launch"})
_PYTHON = re.compile(r"^python[0-9.]*$")

M = TypeVar("M")
W = TypeVar("W")


@dataclass(frozen=True, slots=True)
class Node:
    """Rank `rank` of the gang `gang_id`: `nnodes` nodes of `nproc_per_node` processes,
    rendezvous at `master_addr:master_port` (rank 0)."""

    gang_id: str
    rank: int
    nnodes: int
    nproc_per_node: int
    master_addr: str
    master_port: int = MASTER_PORT

    def __post_init__(self) -> None:
        if self.nnodes < 1 or not 0 <= self.rank < self.nnodes:
            raise ValueError(f"node rank {self.rank} of a gang of {self.nnodes}")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def torch_env(node: Node) -> dict[str, str]:
    """The five torchrun variables of `node`, and the same as torchrun's PET_* defaults."""
    values = {
        "MASTER_ADDR": node.master_addr,
        "MASTER_PORT": str(node.master_port),
        "NNODES": str(node.nnodes),
        "NODE_RANK": str(node.rank),
        "NPROC_PER_NODE": str(node.nproc_per_node),
    }
    return {**values, **{f"PET_{name}": value for name, value in values.items()}}


def environment(
    spec: LaunchSpec,
    node: Node,
    *,
    cluster: str,
    request_id: str,
    region: str,
    zone: str,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """What node `node.rank` of the gang gets, on every provider: the job's own `spec.env`,
    then (overriding it) the contract's variables, then the adapter's `extra` (its notice
    source, a checkpoint mount)."""
    env = dict(spec.env)
    env.update(torch_env(node))
    env.update(
        {
            "HELIOTROPE_JOB_ID": spec.job_id,
            "HELIOTROPE_CLUSTER": cluster,
            "HELIOTROPE_INSTANCE_ID": node.gang_id,
            "HELIOTROPE_OFFER_ID": spec.offer_id,
            "HELIOTROPE_REGION": region,
            "HELIOTROPE_ZONE": zone,
            "HELIOTROPE_REQUEST_ID": request_id,
            "HELIOTROPE_NODE_RANK": str(node.rank),
            "HELIOTROPE_NUM_NODES": str(node.nnodes),
            "HELIOTROPE_NPROC_PER_NODE": str(node.nproc_per_node),
            "HELIOTROPE_MASTER_ADDR": node.master_addr,
            "HELIOTROPE_MASTER_PORT": str(node.master_port),
        }
    )
    env.update(extra or {})
    return env


def is_torchrun(entrypoint: Sequence[str]) -> bool:
    """Whether `entrypoint` starts torchrun itself (`torchrun ...`, `python -m
    torch.distributed.run ...`): it is its own launcher and reads the PET_* defaults."""
    if not entrypoint:
        return False
    first = os.path.basename(entrypoint[0])
    if first == "torchrun":
        return True
    return (
        bool(_PYTHON.match(first))
        and len(entrypoint) >= 3
        and entrypoint[1] == "-m"
        and entrypoint[2] in _TORCHRUN_MODULES
    )


def command(
    entrypoint: Sequence[str],
    node: Node,
    launcher: Launcher = Launcher.TORCHRUN,
    *,
    request_id: str,
    torchrun: Sequence[str] = TORCHRUN,
) -> tuple[str, ...]:
    """The command node `node.rank` runs: `entrypoint` under torchrun (c10d rendezvous at
    rank 0, the launch's request id as the rendezvous id), or `entrypoint` as it is for
    `Launcher.NONE`, an entrypoint that is a torchrun already, a one-process gang, or no
    entrypoint (an image that starts its own job)."""
    job = tuple(entrypoint)
    if not job or launcher is Launcher.NONE or is_torchrun(job) or node.world_size == 1:
        return job
    return (
        *torchrun,
        f"--nnodes={node.nnodes}",
        f"--nproc-per-node={node.nproc_per_node}",
        f"--node-rank={node.rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={node.master_addr}:{node.master_port}",
        f"--rdzv-id={rdzv_id(request_id)}",
        "--no-python",
        *job,
    )


def rdzv_id(request_id: str) -> str:
    """The gang's rendezvous id, from its launch's request id (the same on every node and
    on a retry; a node of another launch never joins this one)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", request_id)
    if safe == request_id and len(safe) <= RDZV_ID_CHARS:
        return safe
    digest = hashlib.sha256(request_id.encode()).hexdigest()[:12]
    return f"{safe[: RDZV_ID_CHARS - 13]}-{digest}"


# -- failures --------------------------------------------------------------------------------


def foreign_member(what: str, request_id: str, cluster: str) -> ProviderFailure:
    """A resource under the gang's name that this request did not make: never adopted."""
    return ProviderFailure(
        FailureKind.INVALID,
        f"{what} exists but was not launched for request {request_id!r} of cluster "
        f"{cluster!r}; not touching it",
    )


def member_going(what: str, state: str, retry_after_s: float) -> ProviderFailure:
    """A member of this request that is being deleted: the launch can only be retried."""
    return ProviderFailure(
        FailureKind.TRANSIENT,
        f"{what} of this request is {state}; try again once it is gone",
        retry_after_s,
    )


def count_invalid(count: int) -> str | None:
    return None if count >= 1 else f"count must be >= 1, got {count}"


def invalid_offer(spec: LaunchSpec, why: str) -> ProviderFailure:
    return ProviderFailure(FailureKind.INVALID, f"offer {spec.offer_id!r}: {why}")


def offer_parts(
    spec: LaunchSpec, *, cloud: str, cluster: str, form: str
) -> tuple[str, str, Market] | ProviderFailure:
    """(place, shape, market) of `spec.offer_id` once the checks every cloud adapter makes
    pass: the launch is for `cluster`, a gang of one or more, an offer id of `cloud` in the
    form `form` (`<cloud>:<place>:<shape>:<market>`), of a known market."""
    if spec.cluster != cluster:
        return invalid_offer(
            spec, f"cluster {spec.cluster!r}, but this provider serves {cluster!r}"
        )
    if (bad := count_invalid(spec.count)) is not None:
        return invalid_offer(spec, bad)
    parts = spec.offer_id.split(":")
    if len(parts) != 4 or parts[0] != cloud:
        return invalid_offer(spec, f"expected {form}")
    _, place, shape, market_name = parts
    try:
        market = Market(market_name)
    except ValueError:
        return invalid_offer(spec, f"market {market_name!r} is not spot or on_demand")
    return place, shape, market


# -- all or none -----------------------------------------------------------------------------


def all_or_none(
    *,
    gang_id: str,
    spec: LaunchSpec,
    request_id: str,
    start: Callable[[], ProviderFailure | None],
    roll_back: Callable[[], object],
    call_errors: tuple[type[BaseException], ...],
    failure_of: Callable[[BaseException], ProviderFailure],
) -> ProviderFailure | None:
    """Start every member (`start`); on a failure, returned or raised (one of
    `call_errors`, mapped by `failure_of`), undo what this request made (`roll_back`) and
    return the failure. None: the whole gang is up."""
    try:
        try:
            failure = start()
        except call_errors as exc:
            failure = failure_of(exc)
    except Exception:  # not a cloud's error (a bug): leave nothing running
        roll_back()
        raise
    if failure is None:
        logger.info(
            "launched %s (%s x %s) for job %s (request %s)",
            gang_id,
            spec.count,
            spec.offer_id,
            spec.job_id,
            request_id,
        )
        return None
    logger.info(
        "launch %s (%s x %s) refused: %s %s",
        gang_id,
        spec.count,
        spec.offer_id,
        failure.kind.value,
        failure.message,
    )
    roll_back()
    return failure


def roll_back(
    members: Iterable[M],
    *,
    request_id: str,
    made_here: Callable[[M], bool],
    delete: Callable[[M], W],
    wait: Callable[[M, W], object] | None = None,
    name: Callable[[M], str] = str,
    call_errors: tuple[type[BaseException], ...] = (Exception,),
    reason: Callable[[BaseException], str] = str,
) -> list[M]:
    """Delete the members of a failed gang that this request made (`made_here`: ours, and
    tagged with `request_id`), waiting for each deletion when `wait` is given (so a retry
    meets no half-deleted member). Best effort: a member that cannot be deleted is logged
    and stays ours, tagged, visible to `list_instances`. Returns the members deleted."""
    started: list[tuple[M, W]] = []
    for member in members:
        try:
            if not made_here(member):
                continue
            started.append((member, delete(member)))
        except call_errors as exc:
            logger.warning("could not roll back %s: %s", name(member), reason(exc))
    deleted: list[M] = []
    for member, handle in started:
        try:
            if wait is not None:
                wait(member, handle)
        except call_errors as exc:
            logger.warning("could not roll back %s: %s", name(member), reason(exc))
            continue
        deleted.append(member)
        logger.info("rolled back %s of failed launch %s", name(member), request_id)
    return deleted
