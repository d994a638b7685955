"""librdkafka's connection-failure lines: WARNING while a broker is up or all brokers have
been down for less than 30 s, ERROR beyond that; every other line at librdkafka's level.
The rule in milliseconds, then the hook that feeds it, then the hook on a real client."""

from __future__ import annotations

import json
import logging
import time

import pytest
from confluent_kafka import Consumer, KafkaError

from dedup_contract.broker_logs import (
    BROKERS_DOWN_GRACE_MS,
    BrokersDown,
    ConnectionLog,
    any_broker_up,
    is_connection_failure,
)

W, E = logging.WARNING, logging.ERROR


def test_the_default_grace_is_30_s() -> None:
    assert BROKERS_DOWN_GRACE_MS == 30_000
    assert BrokersDown().grace_ms == 30_000


def test_all_brokers_down_is_a_warning_for_30_s_then_an_error() -> None:
    rule = BrokersDown()
    assert rule.connection_failed(0) == W  # the failure that takes the last broker down
    rule.all_down()  # librdkafka's _ALL_BROKERS_DOWN follows it
    assert [rule.connection_failed(t) for t in (200, 29_999, 30_000, 45_000)] == [W, W, E, E]
    assert rule.down_ms(45_000) == 45_000


def test_a_failure_while_a_broker_is_up_stays_a_warning() -> None:
    # One broker of several refuses connections for minutes; the client's statistics
    # keep reporting another one up.
    rule = BrokersDown()
    levels = []
    for t in range(0, 300_000, 30_000):
        levels.append(rule.connection_failed(t))
        rule.broker_up()
    assert levels == [W] * 10
    assert rule.down_ms(300_000) is None


def test_without_word_that_all_are_down_failures_stay_warnings() -> None:
    rule = BrokersDown()
    assert [rule.connection_failed(t) for t in (0, 30_000, 600_000)] == [W, W, W]


def test_a_broker_up_ends_the_outage_and_the_next_one_counts_afresh() -> None:
    rule = BrokersDown()
    rule.connection_failed(0)
    rule.all_down()
    assert rule.connection_failed(31_000) == E
    rule.broker_up()  # back at 40 s
    assert rule.down_ms(40_000) is None
    rule.all_down()  # down again at 100 s
    assert [rule.connection_failed(t) for t in (100_100, 130_099, 130_100)] == [W, W, E]


def test_idle_connections_closed_long_ago_do_not_count_as_an_outage() -> None:
    # A broker closes an idle client's connections (librdkafka: all brokers down, no
    # failure); ten minutes later the broker restarts as the client reconnects.
    rule = BrokersDown()
    rule.all_down()
    assert rule.down_ms(600_000) is None
    assert [rule.connection_failed(t) for t in (600_000, 620_000, 630_000)] == [W, W, E]


def test_a_report_of_a_broker_up_taken_just_before_the_outage_costs_no_error() -> None:
    # librdkafka may serve a statistics report taken just before the connection went
    # down after its _ALL_BROKERS_DOWN; the next report (none up) sets it right.
    rule = BrokersDown()
    rule.all_down()
    rule.broker_up()  # the stale report
    assert rule.connection_failed(100) == W
    rule.all_down()  # the next report, 1 s later
    assert [rule.connection_failed(t) for t in (30_099, 30_100)] == [W, E]


def test_the_grace_period_can_be_given() -> None:
    rule = BrokersDown(grace_ms=5_000)
    rule.all_down()
    assert [rule.connection_failed(t) for t in (0, 4_999, 5_000)] == [W, W, E]


CONNECT_FAILED = (
    "[thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: Connect to ipv4#127.0.0.1:9092 failed: "
    "Connection refused (after 0ms in state CONNECT)"
)


@pytest.mark.parametrize(
    ("facility", "text", "expected"),
    [
        ("FAIL", CONNECT_FAILED, True),
        (
            "FAIL",
            "[thrd:GroupCoordinator]: GroupCoordinator: 127.0.0.1:9092: Connect to "
            "ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT, "
            "293 identical error(s) suppressed)",
            True,
        ),
        (
            "FAIL",
            "[thrd:kafka-0.kafka:9092/0]: kafka-0.kafka:9092/0: Failed to resolve "
            "'kafka-0.kafka:9092': Name or service not known (after 1ms in state CONNECT)",
            True,
        ),
        # configuration mistakes, not outages: they stay as librdkafka logs them
        (
            "FAIL",
            "[thrd:ssl://b:9093/bootstrap]: ssl://b:9093/bootstrap: SSL handshake failed: "
            "Disconnected: connecting to a PLAINTEXT broker listener? (after 2ms in state "
            "SSL_HANDSHAKE)",
            False,
        ),
        (
            "FAIL",
            "[thrd:b:9092/bootstrap]: b:9092/bootstrap: Disconnected while requesting "
            "ApiVersion: might be caused by incorrect security.protocol configuration",
            False,
        ),
        ("ERROR", "[thrd:app]: rdkafka#producer-1: " + CONNECT_FAILED, False),
        (
            "TXNERR",
            "[thrd:main]: Current transaction failed in state BeginCommit: 1 message(s) "
            "failed delivery (see individual delivery reports) (_INCONSISTENT)",
            False,
        ),
    ],
)
def test_which_lines_are_connection_failures(facility: str, text: str, expected: bool) -> None:
    assert is_connection_failure(facility, text) is expected


def _stats(states: dict[str, tuple[str, str]]) -> str:
    """A statistics report naming these brokers: name -> (state, source)."""
    brokers = {name: {"state": state, "source": source} for name, (state, source) in states.items()}
    return json.dumps({"name": "rdkafka#consumer-2", "brokers": brokers})


INTERNAL = {":0/internal": ("UP", "internal")}


@pytest.mark.parametrize(
    ("states", "up"),
    [
        ({"b:9092/1": ("UP", "learned")}, True),
        ({"b:9092/1": ("CONNECT", "learned"), "GroupCoordinator": ("UP", "logical")}, True),
        ({"b:9092/1": ("DOWN", "learned"), "b:9092/bootstrap": ("INIT", "configured")}, False),
        ({"b:9092/1": ("TRY_CONNECT", "learned"), **INTERNAL}, False),
        (INTERNAL, None),  # nothing but the client's internal broker
    ],
)
def test_statistics_say_whether_a_broker_is_up(
    states: dict[str, tuple[str, str]], up: bool | None
) -> None:
    assert any_broker_up(_stats(states)) is up


class Clock:
    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> int:
        return self.ms


def _log(hook: ConnectionLog, level: int, facility: str, text: str) -> None:
    # exactly how confluent-kafka calls a client's logger
    hook.log(level, "%s [%s] %s", facility, "rdkafka#consumer-2", text)


def test_the_hook_logs_failures_at_the_rules_level_and_the_rest_as_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    hook = ConnectionLog(clock_ms=clock)
    with caplog.at_level(logging.DEBUG, logger="librdkafka"):
        _log(hook, E, "FAIL", CONNECT_FAILED)  # t = 0
        hook.error(KafkaError(KafkaError._TRANSPORT, "b:9092/1: Connect to ... failed"))
        hook.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
        hook.statistics(_stats({"b:9092/1": ("CONNECT", "learned")}))
        clock.ms = 29_000
        _log(hook, E, "FAIL", CONNECT_FAILED)
        _log(hook, logging.INFO, "FAIL", "[thrd:b]: b:9092/1: Disconnected (after 5ms in state UP)")
        clock.ms = 31_000
        _log(hook, E, "FAIL", CONNECT_FAILED)
        _log(hook, E, "TXNERR", "[thrd:main]: Current transaction failed in state BeginCommit")
        hook.statistics(_stats({"b:9092/1": ("UP", "learned")}))  # back
        clock.ms = 40_000
        _log(hook, E, "FAIL", CONNECT_FAILED)
    got = [(r.levelname, r.args[0] if isinstance(r.args, tuple) else None) for r in caplog.records]
    assert got == [
        ("WARNING", "FAIL"),
        ("WARNING", "FAIL"),
        ("INFO", "FAIL"),
        ("ERROR", "FAIL"),
        ("ERROR", "TXNERR"),
        ("WARNING", "FAIL"),
    ]
    assert all(r.name == "librdkafka" for r in caplog.records)
    assert caplog.records[0].getMessage() == f"FAIL [rdkafka#consumer-2] {CONNECT_FAILED}"
    assert caplog.records[3].__dict__["all_brokers_down_seconds"] == 31.0
    assert not hasattr(caplog.records[0], "all_brokers_down_seconds")


def test_the_hook_never_raises_a_level(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    hook = ConnectionLog(clock_ms=clock)
    hook.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    with caplog.at_level(logging.DEBUG, logger="librdkafka"):
        _log(hook, W, "FAIL", CONNECT_FAILED)
        clock.ms = 60_000
        _log(hook, logging.INFO, "FAIL", CONNECT_FAILED)
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]


def test_the_hook_is_what_a_real_client_logs_through(caplog: pytest.LogCaptureFixture) -> None:
    """A consumer of a closed port: librdkafka's connection failures reach the hook (as
    its logger) at WARNING, its _ALL_BROKERS_DOWN (error_cb) and its statistics
    (stats_cb) too."""
    reports: list[str] = []
    hook = ConnectionLog()

    def statistics(report: str) -> None:
        reports.append(report)
        hook.statistics(report)

    consumer = Consumer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "group.id": "g",
            "logger": hook,
            "error_cb": hook.error,
            "stats_cb": statistics,
            "statistics.interval.ms": 200,
        }
    )
    try:
        with caplog.at_level(logging.DEBUG, logger="librdkafka"):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not (reports and len(caplog.records) >= 2):
                consumer.poll(0.1)
    finally:
        consumer.close()
    failures = [r for r in caplog.records if "Connect to ipv4#127.0.0.1:1 failed" in r.getMessage()]
    assert failures, [r.getMessage() for r in caplog.records]
    assert {r.levelname for r in failures} == {"WARNING"}
    assert any_broker_up(reports[-1]) is False
    assert hook.rule.down_ms(time.monotonic_ns() // 1_000_000) is not None, "all down, known"
