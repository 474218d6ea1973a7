"""Preemption notice sources against a fake metadata server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from orchestrator.errors import InputError, TransientError
from orchestrator.training import (
    AwsSpotNotices,
    FileNotices,
    GceNotices,
    NoticeWatcher,
    PreemptionNotice,
    notice_source_from_env,
)
from orchestrator.training.notices import AzureScheduledEvents
from tests.training.metadata_server import metadata_server


def test_aws_imdsv2_spot_instance_action() -> None:
    with metadata_server() as (url, state):
        source = AwsSpotNotices(url)
        assert source.poll() is None  # 404: no notice
        state.preempted = True
        assert source.poll() == PreemptionNotice("aws", "terminate at 2024-05-01T12:00:00Z")
        puts = [r for r in state.requests if r[0] == "PUT"]
        assert puts == [("PUT", "/latest/api/token")]  # the token is reused


def test_aws_token_is_renewed_when_refused() -> None:
    with metadata_server() as (url, state):
        source = AwsSpotNotices(url)
        assert source.poll() is None
        state.token = "tok-2"  # the old token now answers 401
        state.preempted = True
        assert source.poll() is not None
        assert [r for r in state.requests if r[0] == "PUT"] == [("PUT", "/latest/api/token")] * 2


def test_gce_preempted_flag() -> None:
    with metadata_server() as (url, state):
        source = GceNotices(url)
        assert source.poll() is None
        state.preempted = True
        assert source.poll() == PreemptionNotice("gcp", "instance/preempted is TRUE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("source_type", [AwsSpotNotices, GceNotices])
def test_an_unreachable_metadata_service_is_transient(
    source_type: type[AwsSpotNotices] | type[GceNotices],
) -> None:
    source = source_type(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    with pytest.raises(TransientError, match="unreachable"):
        source.poll()


def test_file_notice(tmp_path: Path) -> None:
    source = FileNotices(str(tmp_path / "preempt"))
    assert source.poll() is None
    (tmp_path / "preempt").write_text("")
    assert source.poll() == PreemptionNotice("file", str(tmp_path / "preempt"))


def test_watcher_polls_in_a_daemon_thread_and_calls_back_once() -> None:
    got: list[PreemptionNotice] = []
    called = threading.Event()

    def on_notice(notice: PreemptionNotice) -> None:
        got.append(notice)
        called.set()

    with metadata_server() as (url, state):
        watcher = NoticeWatcher(GceNotices(url), on_notice, interval_s=0.02).start()
        assert watcher._thread.daemon
        threading.Event().wait(0.1)
        assert not got
        state.preempted = True
        assert called.wait(5)
        watcher.stop()
        assert got == [PreemptionNotice("gcp", "instance/preempted is TRUE")]


def test_watcher_survives_an_unreachable_service(caplog: pytest.LogCaptureFixture) -> None:
    watcher = NoticeWatcher(
        AwsSpotNotices(f"http://127.0.0.1:{free_port()}", timeout_s=0.2),
        lambda _n: None,
        interval_s=0.01,
    ).start()
    threading.Event().wait(0.2)
    assert watcher._thread.is_alive()
    watcher.stop()
    assert not watcher._thread.is_alive()
    assert "cannot poll aws preemption notices" in caplog.text


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({}, None),
        ({"HELIOTROPE_NOTICE_SOURCE": "aws"}, AwsSpotNotices),
        ({"HELIOTROPE_NOTICE_SOURCE": "GCP"}, GceNotices),
        ({"HELIOTROPE_NOTICE_SOURCE": "azure"}, AzureScheduledEvents),
        ({"HELIOTROPE_NOTICE_SOURCE": "local"}, None),
        ({"HELIOTROPE_NOTICE_SOURCE": "local", "HELIOTROPE_PREEMPT_FILE": "/x"}, FileNotices),
        ({"HELIOTROPE_PREEMPT_FILE": "/x"}, FileNotices),
    ],
)
def test_source_from_env(env: dict[str, str], kind: type | None) -> None:
    source = notice_source_from_env(env)
    assert (type(source) if source is not None else None) is kind


def test_metadata_url_override() -> None:
    source = notice_source_from_env(
        {"HELIOTROPE_NOTICE_SOURCE": "aws", "HELIOTROPE_METADATA_URL": "http://127.0.0.1:9/"}
    )
    assert isinstance(source, AwsSpotNotices) and source.base_url == "http://127.0.0.1:9"
    with pytest.raises(InputError, match="HELIOTROPE_NOTICE_SOURCE"):
        notice_source_from_env({"HELIOTROPE_NOTICE_SOURCE": "oracle"})
