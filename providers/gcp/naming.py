"""Names, request ids, labels and the startup script: everything derived, nothing stored.

A launch is idempotent because everything it sends is a pure function of
(project, cluster, request id):

- the gang name `hel-<20 hex>` (one instance), or `hel-<20 hex>-g<N>` whose members are
  `<gang>-0 .. <gang>-<N-1>` (a gang of N instances, launched and preempted together);
  the gang size is part of the name, so terminating a gang needs nothing but its id;
- the Compute Engine `requestId` of each insert or delete, a UUID (the API requires one)
  made with uuid5 from those parts; Compute Engine ignores a repeated requestId for at
  least 60 minutes, and a retried launch first `get`s the instance by its name anyway;
- labels, whose values must be lower-case letters, digits, `_` and `-`, at most 63
  characters: `label_value` maps any text onto that set, deterministically.

Our instance id is `<zone>/<gang>`.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

NAME_PREFIX: Final = "hel"
LABEL_CLUSTER: Final = "heliotrope-cluster"
LABEL_JOB: Final = "heliotrope-job"
LABEL_REQUEST: Final = "heliotrope-request"
LABEL_GANG: Final = "heliotrope-gang"
# Metadata keys: exact (unsanitized) values, read back by list_instances and poll_events.
META_CLUSTER: Final = "heliotrope-cluster"
META_JOB: Final = "heliotrope-job-id"
META_REQUEST: Final = "heliotrope-request-id"
META_STARTUP_S: Final = "heliotrope-startup-s"
META_STARTUP_SCRIPT: Final = "startup-script"

# A fixed namespace: uuid5(NAMESPACE_URL, "https://github.com/heliotrope/providers/gcp").
_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/heliotrope/providers/gcp")
_HASH_HEX: Final = 20
_MEMBER = re.compile(rf"^({NAME_PREFIX}-[0-9a-f]{{{_HASH_HEX}}})(?:-g([1-9]\d*)-(\d+))?$")
_GANG = re.compile(rf"^{NAME_PREFIX}-[0-9a-f]{{{_HASH_HEX}}}(?:-g([1-9]\d*))?$")
_LABEL_MAX: Final = 63
_LABEL_BAD = re.compile(r"[^a-z0-9_-]")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names that look like credentials: never written into instance metadata, which anyone with
# compute.instances.get can read.
SECRET_NAME: Final = re.compile(
    r"(?:^|_)(?:SECRETS?|TOKENS?|PASSWORDS?|PASSWD|PASSPHRASE|CREDENTIALS?|PRIVATE_?KEY|"
    r"API_?KEYS?|ACCESS_?KEYS?|AUTH|COOKIES?)(?:_|$)",
    re.IGNORECASE,
)
_CLOUD_CREDENTIAL_PREFIXES: Final = ("AWS_", "GOOGLE_", "GCP_", "GCLOUD_", "CLOUDSDK_", "AZURE_")

JOB_DIR: Final = "/var/lib/heliotrope"
JOB_LOG: Final = "/var/log/heliotrope-job.log"


@dataclass(frozen=True, slots=True)
class Gang:
    """A gang: its zone, name and size."""

    zone: str
    name: str
    count: int

    @property
    def instance_id(self) -> str:
        return f"{self.zone}/{self.name}"

    @property
    def members(self) -> tuple[str, ...]:
        if self.count == 1:
            return (self.name,)
        return tuple(f"{self.name}-{k}" for k in range(self.count))


def gang_for(*, project: str, cluster: str, request_id: str, zone: str, count: int) -> Gang:
    """The gang a launch request makes (same request, same gang)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    digest = hashlib.sha256("\0".join((project, cluster, request_id)).encode()).hexdigest()
    base = f"{NAME_PREFIX}-{digest[:_HASH_HEX]}"
    return Gang(zone, base if count == 1 else f"{base}-g{count}", count)


def parse_instance_id(instance_id: str) -> Gang | None:
    """The gang named by one of our instance ids, or None if it is not one."""
    zone, sep, name = instance_id.partition("/")
    m = _GANG.match(name)
    if not sep or not zone or m is None:
        return None
    return Gang(zone, name, int(m.group(1) or 1))


def gang_of_member(zone: str, member: str) -> Gang | None:
    """The gang an instance name belongs to, or None if the name is not one we make."""
    m = _MEMBER.match(member)
    if m is None:
        return None
    if m.group(2) is None:
        return Gang(zone, m.group(1), 1)
    count, index = int(m.group(2)), int(m.group(3))
    if index >= count:
        return None
    return Gang(zone, f"{m.group(1)}-g{count}", count)


def request_uuid(*parts: str) -> str:
    """A Compute Engine requestId (a UUID) that is a pure function of `parts`."""
    return str(uuid.uuid5(_NAMESPACE, "\0".join(parts)))


def label_value(text: str) -> str:
    """`text` as a label value: lower case, [a-z0-9_-], at most 63 characters. A value that
    had to change keeps its readable start and gains a short hash, so two different texts
    do not collide.

    >>> label_value("ml-team"), label_value("Job #7")
    ('ml-team', 'job--7-c56d9700')
    """
    lowered = text.lower()
    safe = _LABEL_BAD.sub("-", lowered)
    if safe == text and len(safe) <= _LABEL_MAX:
        return safe
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{safe[: _LABEL_MAX - 9]}-{digest}"


def refused_env_names(env: Mapping[str, str]) -> list[str]:
    """Names in `env` that must not go into instance metadata: credential-like names,
    cloud credential variables and names a shell cannot export."""
    return sorted(
        name
        for name in env
        if not _ENV_NAME.match(name)
        or SECRET_NAME.search(name)
        or name.startswith(_CLOUD_CREDENTIAL_PREFIXES)
    )


def startup_script(env: Mapping[str, str], entrypoint: Sequence[str]) -> str:
    """The `startup-script` metadata value: write the job's environment to
    /var/lib/heliotrope/job.env, then start the entrypoint in its own session, logging to
    /var/log/heliotrope-job.log. Without an entrypoint only the environment file is
    written (for an image whose own service starts the job). Every value is shell-quoted.

    The caller removes credential-like names first (`refused_env_names`); this function
    refuses them too, so a secret can never reach metadata by another path.
    """
    refused = refused_env_names(env)
    if refused:
        raise ValueError(f"refusing to put {', '.join(refused)} into instance metadata")
    exports = "\n".join(f"export {name}={shlex.quote(env[name])}" for name in sorted(env))
    # The heredoc's end marker must not be a line of the body (a value holding a newline
    # and the marker would end it early and run the rest): derive it from the body.
    marker = "HELIOTROPE_ENV_" + hashlib.sha256(exports.encode()).hexdigest()[:24]
    while marker in exports:
        marker += "_"
    lines = [
        "#!/bin/bash",
        "# Written by Heliotrope (providers/gcp). Holds no credentials: the job reads its",
        "# own from the instance's service account.",
        "set -euo pipefail",
        f"mkdir -p {JOB_DIR}",
        f"cat > {JOB_DIR}/job.env <<'{marker}'",
        exports,
        marker,
    ]
    if entrypoint:
        lines += [
            f"cd {JOB_DIR}",
            ". ./job.env",
            f"setsid nohup {shlex.join(entrypoint)} >> {JOB_LOG} 2>&1 < /dev/null &",
        ]
    return "\n".join(lines) + "\n"
