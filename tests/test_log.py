"""Logging: one redacted JSON line per event on stderr, however often it is configured."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterator

import pytest
import structlog
import structlog.testing

import toolforge.log as log_module
from toolforge.core.redact import REDACTED
from toolforge.log import (
    ARTIFACTS_WRITTEN,
    CLIENT_DISCONNECTED,
    EVENT_NAMES,
    STREAM_STARTED,
    TOOL_ATTEMPT,
    UPSTREAM_ERROR,
    configure_logging,
    get_logger,
)


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    yield
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def lines(err: str) -> list[dict[str, object]]:
    out = err.splitlines()
    assert all(out), f"blank line in {err!r}"
    return [json.loads(line) for line in out]


def test_a_log_call_is_one_redacted_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    get_logger("tests.log").info(
        STREAM_STARTED, api_key="sk-abc123", authorization="Bearer x", stream_id="s1"
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "sk-abc123" not in captured.err and "Bearer x" not in captured.err
    [event] = lines(captured.err)
    assert event["event"] == "stream.started"
    assert event["api_key"] == REDACTED
    assert event["authorization"] == REDACTED
    assert event["stream_id"] == "s1"
    assert event["level"] == "info"
    assert event["logger"] == "tests.log"
    assert isinstance(event["timestamp"], str)
    stamp = dt.datetime.fromisoformat(event["timestamp"])
    assert stamp.utcoffset() == dt.timedelta(0)


def test_secrets_in_messages_and_nested_values_are_redacted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging()
    log = get_logger("tests.log").bind(request={"headers": {"X-Api-Key": "k-123"}})
    log.warning("upstream rejected gsk_abcdef123456", url="https://h/v1?api_key=q1w2e3")
    err = capsys.readouterr().err
    assert "k-123" not in err and "gsk_abcdef123456" not in err and "q1w2e3" not in err
    [event] = lines(err)
    assert event["event"] == f"upstream rejected {REDACTED}"
    assert event["request"] == {"headers": {"X-Api-Key": REDACTED}}


def test_context_variables_are_redacted_too(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    structlog.contextvars.bind_contextvars(token="t0k3n", stream_id="s2")
    get_logger("tests.log").info(TOOL_ATTEMPT, attempt=1)
    [event] = lines(capsys.readouterr().err)
    assert event["token"] == REDACTED and event["stream_id"] == "s2" and event["attempt"] == 1


def test_configuring_again_replaces_rather_than_adds(capsys: pytest.CaptureFixture[str]) -> None:
    log = get_logger("tests.log")  # created before configuration: must follow it
    for _ in range(3):
        configure_logging(level="DEBUG")
    log.debug("one")
    configure_logging(level="warning")
    log.info("filtered out")
    log.warning("two")
    assert [e["event"] for e in lines(capsys.readouterr().err)] == ["one", "two"]


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging(level="LOUD")


def test_exceptions_are_structured_and_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    password = "hunter2-local"  # a local: tracebacks are rendered without locals
    try:
        raise RuntimeError("upstream said token=s3cr3t")
    except RuntimeError:
        get_logger("tests.log").exception(UPSTREAM_ERROR)
    err = capsys.readouterr().err
    assert "s3cr3t" not in err and password not in err
    [event] = lines(err)
    assert event["level"] == "error"
    assert isinstance(event["exception"], list)
    assert event["exception"][0]["exc_type"] == "RuntimeError"


def test_values_orjson_cannot_encode_still_give_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging()
    log = get_logger("tests.log")
    log.info("big", n=2**70, text="lone \ud800 surrogate")
    deep: object = "x"
    for _ in range(5_000):
        deep = [deep]
    log.info("deep", value=deep, api_key="sk-abcdef12")
    big, stub = lines(capsys.readouterr().err)
    assert big["n"] == 2**70 and big["event"] == "big"
    assert stub["event"] == "deep" and "log_error" in stub and "value" not in stub


def test_console_rendering_is_redacted_too(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=False)
    get_logger("tests.log").info(ARTIFACTS_WRITTEN, password="pw1", path="/tmp/x")
    err = capsys.readouterr().err
    assert "artifacts.written" in err and "pw1" not in err and REDACTED in err
    assert len(err.splitlines()) == 1


def test_output_reaches_the_real_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    get_logger("tests.log").info(CLIENT_DISCONNECTED, cookie="c=1")
    [event] = lines(capfd.readouterr().err)
    assert event == event | {"event": "client.disconnected", "cookie": REDACTED}


def test_event_names_are_unique_dotted_strings() -> None:
    constants = [v for k, v in vars(log_module).items() if k.isupper() and isinstance(v, str)]
    assert set(constants) == EVENT_NAMES and len(constants) == len(EVENT_NAMES)
    assert all(v.count(".") == 1 and v == v.lower() for v in EVENT_NAMES)


def test_a_logger_in_use_follows_every_later_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # get_logger binds once per configuration, not once per call: a logger that has
    # already logged must still see configure_logging, structlog.configure,
    # reset_defaults and capture_logs that come after.
    log = get_logger("tests.log")
    configure_logging(level="ERROR")
    log.warning("filtered out")
    configure_logging(level="INFO")
    log.info("one")
    with structlog.testing.capture_logs() as captured:
        log.info("captured")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    log.info("filtered out too")
    structlog.reset_defaults()  # structlog's own defaults: everything, to stdout
    log.info("three")
    out, err = capsys.readouterr()
    assert [e["event"] for e in lines(err)] == ["one"]
    assert [e["event"] for e in captured] == ["captured"]
    assert "three" in out and "filtered out" not in out + err
