"""The one redactor (`orchestrator.signals.sources.redact.Redactor`): log records, error
messages and `providers check` rows all pass through it."""

from __future__ import annotations

import logging

from orchestrator.signals.sources.redact import AWS_KEY_ID, LOG_PATTERNS, Redactor

KEY = "hElIoTrOpE-secret-value"


def test_a_secret_that_holds_another_is_hidden_whole() -> None:
    redact = Redactor(["secret", KEY])
    assert redact(f"key={KEY}; short=secret") == "key=***; short=***"


def test_empty_and_short_values_are_not_secrets() -> None:
    redact = Redactor([None, "", "abc"])
    assert redact("abc is a word") == "abc is a word"
    assert redact.secrets() == ()


def test_shapes_are_hidden_unregistered_and_a_header_keeps_its_name() -> None:
    redact = Redactor(patterns=LOG_PATTERNS)
    text = redact("id AKIAIOSFODNN7EXAMPLE, headers {'Authorization': 'AWS4-HMAC abc'}")
    assert "AKIAIOSFODNN7EXAMPLE" not in text and "AWS4-HMAC" not in text
    assert "id ***" in text and "'Authorization': '***" in text


def test_added_secrets_count_from_then_on() -> None:
    redact = Redactor(patterns=[AWS_KEY_ID])
    assert redact(KEY) == KEY
    redact.add([KEY])
    assert redact(f"got {KEY}") == "got ***"


def test_as_a_filter_it_rewrites_the_formatted_record() -> None:
    redact = Redactor([KEY])
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "token %s sent", (KEY,), None)
    assert redact.filter(record) is True
    assert record.getMessage() == "token *** sent"
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "nothing %d", (3,), None)
    redact.filter(plain)
    assert plain.args == (3,)  # untouched when there is nothing to hide
