"""`orchestrator.training.boot`: a job waits for its instance's emulated start-up."""

from __future__ import annotations

import logging
import time

import pytest

from orchestrator.training.boot import READY_AT_ENV, wait_until_ready
from providers.local.provider import READY_AT_ENV as PROVIDER_READY_AT_ENV


def test_the_provider_and_the_job_name_the_same_variable() -> None:
    assert READY_AT_ENV == PROVIDER_READY_AT_ENV


def test_no_ready_time_and_a_past_one_do_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(READY_AT_ENV, raising=False)
    assert wait_until_ready() == 0.0
    assert wait_until_ready(repr(time.time() - 5.0)) == 0.0


def test_a_future_ready_time_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    target = time.time() + 0.05
    monkeypatch.setenv(READY_AT_ENV, repr(target))
    assert wait_until_ready() > 0.0
    assert time.time() >= target


@pytest.mark.parametrize("bad", ["soon", "nan", "inf"])
def test_a_bad_ready_time_is_named_and_the_job_runs(
    bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert wait_until_ready(bad) == 0.0
    assert READY_AT_ENV in caplog.text and repr(bad) in caplog.text
