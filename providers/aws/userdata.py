"""The user-data script that starts a job on a fresh instance.

cloud-init runs it once, as root, at first boot. It exports the job's environment
(`LaunchSpec.env`; a name that looks like a credential makes the launch INVALID), asks the instance
metadata service (IMDSv2: a session token first) for the instance id and the gang rank
(`ami-launch-index`), and starts `LaunchSpec.entrypoint` with its output in
`/var/log/heliotrope/job.log`. Credentials never travel in user data: anyone who can
describe the instance can read it. The job gets AWS access from the instance profile.
"""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Final

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


def render(
    *,
    entrypoint: Sequence[str],
    env: Mapping[str, str],
    job_id: str,
    cluster: str,
    request_id: str,
    gang_size: int,
) -> str:
    """The user-data script (bash). Raises `UserDataError` when it cannot be made."""
    if not entrypoint:
        raise UserDataError("the launch spec has no entrypoint: nothing would run")
    exported = {
        **job_environment(env),
        "HELIOTROPE_JOB_ID": job_id,
        "HELIOTROPE_CLUSTER": cluster,
        "HELIOTROPE_REQUEST_ID": request_id,
        "HELIOTROPE_GANG_SIZE": str(gang_size),
        "HELIOTROPE_NOTICE_SOURCE": "aws",
    }
    lines = [
        "#!/bin/bash",
        "# Written by Heliotrope (providers/aws/userdata.py): starts one job, once.",
        "set -euo pipefail",
        "umask 077",
        *(f"export {name}={shlex.quote(value)}" for name, value in exported.items()),
        f"imds_token=$(curl -fsS -X PUT {IMDS}/api/token "
        "-H 'X-aws-ec2-metadata-token-ttl-seconds: 300')",
        f'imds() {{ curl -fsS -H "X-aws-ec2-metadata-token: $imds_token" {IMDS}/meta-data/$1; }}',
        "export HELIOTROPE_INSTANCE_ID=$(imds instance-id)",
        "export HELIOTROPE_GANG_RANK=$(imds ami-launch-index)",
        "unset imds_token",
        f"mkdir -p {LOG_DIR}",
        f"exec {shlex.join(entrypoint)} >>{LOG_DIR}/job.log 2>&1",
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
