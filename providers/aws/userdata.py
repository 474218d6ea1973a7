"""The user-data script that starts a job on a fresh instance.

cloud-init runs it once, as root, at first boot. It exports the job's environment
(`LaunchSpec.env`; a name that looks like a credential makes the launch INVALID) and the
gang's (providers/gang.py), asks the instance metadata service (IMDSv2: a session token
first) for what only the node knows (rank 0: its private address, which is MASTER_ADDR,
and its id, the gang's; the other nodes: their launch index, from which their rank), and
starts the job (under torchrun unless the launch says otherwise) with its output in
`/var/log/heliotrope/job.log`. Credentials never travel in user data: anyone who can
describe the instance can read it. The job gets AWS access from the instance profile.
"""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Mapping
from typing import Final

from providers.base import LaunchSpec
from providers.gang import RANK_NAMES, Node, command, environment

USER_DATA_LIMIT_BYTES: Final = 16 * 1024  # EC2: user data is limited to 16 KB (raw)
LOG_DIR: Final = "/var/log/heliotrope"
IMDS: Final = "http://169.254.169.254/latest"

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names that carry credentials; matched on "_"-separated words so that, say,
# TOKENIZERS_PARALLELISM passes while HF_TOKEN and WANDB_API_KEY do not.
_SECRET_WORDS: Final = frozenset(
    {
        "SECRET",
        "SECRETS",
        "TOKEN",
        "TOKENS",
        "PASSWORD",
        "PASSWD",
        "PASSPHRASE",
        "CREDENTIAL",
        "CREDENTIALS",
        "PRIVATE",
        "APIKEY",
        "AUTH",
    }
)
_SECRET_PAIRS: Final = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("SECRET", "KEY")})
_DROPPED_PREFIXES: Final = ("AWS_", "GOOGLE_", "GCP_", "GCLOUD_", "CLOUDSDK_", "AZURE_")


class UserDataError(ValueError):
    """The launch spec cannot be turned into user data (bad name, too large, no job)."""


def looks_secret(name: str) -> bool:
    """Whether an environment variable name looks like it holds a credential."""
    upper = name.upper()
    if upper.startswith(_DROPPED_PREFIXES):
        return True
    words = [w for w in upper.split("_") if w]
    return any(w in _SECRET_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )


def job_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env`, checked: shell variable names only, and no credential-like name (user data is
    readable by anyone who may describe the instance). Errors name the variable, never its
    value."""
    secret = sorted(name for name in env if looks_secret(name))
    if secret:
        raise UserDataError(
            f"the job environment has credential-like names ({', '.join(secret)}): user "
            "data is readable by anyone who may describe the instance; give the job an "
            "instance profile or read the secret from a secret store"
        )
    for name in env:
        if not _NAME.fullmatch(name):
            raise UserDataError(f"environment name {name!r} is not a shell variable name")
    return dict(env)


# Values only the node knows (its address, id, launch index): rendered as shell variables
# that the script sets from IMDS before it exports anything.
_SHELL_VALUES: Final = {
    "@heliotrope-rank0-addr@": "heliotrope_master_addr",
    "@heliotrope-rank0-id@": "heliotrope_gang_id",
    "@heliotrope-node-rank@": "heliotrope_node_rank",
}
_RANK0_ADDR, _RANK0_ID, _NODE_RANK = _SHELL_VALUES
_SHELL_VALUE = re.compile("|".join(re.escape(k) for k in _SHELL_VALUES))


def _word(value: str) -> str:
    """`value` as one shell word: literal parts quoted, node-only values expanded."""
    parts: list[str] = []
    last = 0
    for hit in _SHELL_VALUE.finditer(value):
        if hit.start() > last:
            parts.append(shlex.quote(value[last : hit.start()]))
        parts.append(f'"${{{_SHELL_VALUES[hit.group()]}}}"')
        last = hit.end()
    if last < len(value) or not parts:
        parts.append(shlex.quote(value[last:]))
    return "".join(parts)


def render(
    *,
    spec: LaunchSpec,
    cluster: str,
    request_id: str,
    region: str,
    zone: str,
    nproc_per_node: int,
    rank0: tuple[str, str] | None = None,
) -> str:
    """The user-data script (bash) of one `RunInstances` call of the gang: rank 0's
    (`rank0` None: it reads its own address and id from IMDS) or the other nodes' (`rank0`
    = rank 0's instance id and private IP; each node's rank is 1 + its launch index).
    Every node gets `providers.gang.environment` and runs `providers.gang.command`.
    Raises `UserDataError` when it cannot be made."""
    if not spec.entrypoint:
        raise UserDataError("the launch spec has no entrypoint: nothing would run")
    job_environment(spec.env)
    gang_id, master_addr = rank0 if rank0 is not None else (_RANK0_ID, _RANK0_ADDR)
    first_rank = 0 if rank0 is None else 1
    node = Node(gang_id, first_rank, spec.count, nproc_per_node, master_addr)
    exported = environment(
        spec,
        node,
        cluster=cluster,
        request_id=request_id,
        region=region,
        zone=zone,
        extra={"HELIOTROPE_NOTICE_SOURCE": "aws"},
    )
    job = list(command(spec.entrypoint, node, spec.launcher, request_id=request_id))
    if rank0 is not None and spec.count > 2:  # one user data for ranks 1..N-1: from IMDS
        exported.update(dict.fromkeys(RANK_NAMES, _NODE_RANK))
        if job != list(spec.entrypoint):  # wrapped in our torchrun: its rank, not the job's
            job[job.index("--node-rank=1")] = f"--node-rank={_NODE_RANK}"
    if rank0 is None:
        node_values = [
            "heliotrope_master_addr=$(imds local-ipv4)",
            "heliotrope_gang_id=$(imds instance-id)",
        ]
    else:
        node_values = ["heliotrope_node_rank=$((1 + $(imds ami-launch-index)))"]
    lines = [
        "#!/bin/bash",
        "# Written by Heliotrope (providers/aws/userdata.py): starts one job, once.",
        "set -euo pipefail",
        "umask 077",
        f"imds_token=$(curl -fsS -X PUT {IMDS}/api/token "
        "-H 'X-aws-ec2-metadata-token-ttl-seconds: 300')",
        f'imds() {{ curl -fsS -H "X-aws-ec2-metadata-token: $imds_token" {IMDS}/meta-data/$1; }}',
        *node_values,
        *(f"export {name}={_word(value)}" for name, value in exported.items()),
        "export HELIOTROPE_EC2_INSTANCE_ID=$(imds instance-id)",
        "unset imds_token",
        f"mkdir -p {LOG_DIR}",
        f"exec {' '.join(_word(a) for a in job)} >>{LOG_DIR}/job.log 2>&1",
        "",
    ]
    script = "\n".join(lines)
    size = len(script.encode())
    if size > USER_DATA_LIMIT_BYTES:
        raise UserDataError(
            f"user data is {size} bytes, over EC2's {USER_DATA_LIMIT_BYTES}: pass large "
            "settings through the checkpoint store instead of the environment"
        )
    return script
