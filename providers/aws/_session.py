"""boto3 sessions and clients, created lazily: one session per thread.

boto3 is imported inside functions, never when this package is imported (SkyPilot's
`sky/adaptors`), so `import providers.aws` works where boto3 is not installed. A boto3
`Session` is not thread-safe: every thread gets its own from the session factory, and
its clients are cached per (service, region) in that thread.

botocore's own retries are off (one attempt): Heliotrope retries once, at its edge
(`providers.aws.errors.EdgeRetry`), with an injectable sleep, so the number of attempts
and the waits are known and tests never sleep.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from boto3.session import Session
    from botocore.config import Config
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_pricing import PricingClient
    from mypy_boto3_s3 import S3Client

SessionFactory = Callable[[], "Session"]

USER_AGENT_EXTRA = "heliotrope"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0


class SsmClient(Protocol):
    """The one SSM call the adapter makes (no SSM type stubs are installed)."""

    def get_parameter(self, *, Name: str) -> Mapping[str, Any]: ...  # noqa: N803


def default_session() -> Session:
    """A session from the standard credential chain: environment, shared config and
    credentials files (AWS_PROFILE), container or instance role."""
    import boto3

    return boto3.session.Session()


class Clients:
    """Per-thread boto3 clients. `endpoint_urls` maps a service name ("s3", "ec2", ...)
    to an endpoint (a VPC endpoint, or a local test server)."""

    def __init__(
        self,
        session_factory: SessionFactory | None = None,
        *,
        endpoint_urls: Mapping[str, str] | None = None,
    ) -> None:
        self._factory = session_factory or default_session
        self._endpoints = dict(endpoint_urls or {})
        self._local = threading.local()

    def session(self) -> Session:
        session: Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._factory()
            self._local.session = session
            self._local.clients = {}
        return session

    def ec2(self, region: str) -> EC2Client:
        return cast("EC2Client", self._client("ec2", region))

    def s3(self, region: str) -> S3Client:
        return cast("S3Client", self._client("s3", region))

    def pricing(self, region: str) -> PricingClient:
        return cast("PricingClient", self._client("pricing", region))

    def ssm(self, region: str) -> SsmClient:
        return cast(SsmClient, self._client("ssm", region))

    def _client(self, service: str, region: str) -> object:
        session = self.session()
        clients: dict[tuple[str, str], object] = self._local.clients
        key = (service, region)
        client = clients.get(key)
        if client is None:
            client = session.client(  # type: ignore[call-overload]
                service,
                region_name=region,
                endpoint_url=self._endpoints.get(service),
                config=_config(),
            )
            clients[key] = client
        return client


def _config() -> Config:
    from botocore.config import Config

    return Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        user_agent_extra=USER_AGENT_EXTRA,
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
    )
