"""`heliotrope -v` logs botocore at DEBUG; no credential may reach a log line. The one
redactor (`signals.sources.http.redact_logs`) sits on every handler of the root logger."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from orchestrator.signals.sources.http import REDACTOR, redact_logs

KEY_ID = "ASIAHELIOTROPETEST02"
SECRET = "hElIoTrOpE/fake+secret/9876543210abcdefGHIJ"
TOKEN = "FwoGZXIvYXdzEHeliotropeFakeSessionTokenValue0123456789abcdef"


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    for name, value in (
        ("AWS_ACCESS_KEY_ID", KEY_ID),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
        ("AWS_SESSION_TOKEN", TOKEN),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
        handler.removeFilter(REDACTOR)


def test_botocore_debug_lines_carry_no_credential(stream: io.StringIO) -> None:
    from moto import mock_aws

    redact_logs()
    import boto3

    with mock_aws():
        boto3.client("ec2", region_name="us-east-1").describe_regions()
    text = stream.getvalue()
    assert "botocore" in text and "Authorization" in text  # it did log the signed request
    for secret in (KEY_ID, SECRET, TOKEN):
        assert secret not in text


def test_an_unregistered_key_id_is_still_redacted(stream: io.StringIO) -> None:
    redact_logs({})
    logging.getLogger("botocore.test").debug("key %s in a header", "AKIAIOSFODNN7EXAMPLE")
    assert "AKIAIOSFODNN7EXAMPLE" not in stream.getvalue()
    assert "key *** in a header" in stream.getvalue()
