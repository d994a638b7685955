"""The level of librdkafka's connection-failure lines.

librdkafka logs every failed connection attempt at ERROR ("Connect to ipv4#10.0.0.7:9092
failed: Connection refused"), so a broker restarting for a few seconds, or one broker of
several being down, would leave ERROR lines in every worker's log. The rule: such a line
is a WARNING while librdkafka has at least one broker up, or while all its brokers have
been down for less than the grace period (30 s); beyond that it stays an ERROR.

`BrokersDown` is the rule, pure (every time is passed in, in milliseconds).
`ConnectionLog` feeds it from one client's own reports and passes that client's log lines
on to the ``librdkafka`` logger at the level the rule gives:

* **all brokers down**: librdkafka's `_ALL_BROKERS_DOWN` error (error_cb), sent when its
  last broker connection goes down, or a statistics report (stats_cb) with no broker
  connection UP;
* **a broker up**: a statistics report with a broker connection UP (librdkafka's state
  for each connection), or a request that succeeded (the producer's committed transaction);
* **how long down**: from the first connection failure after the last proof of a broker
  up. Not from `_ALL_BROKERS_DOWN` itself: a client whose idle connections the broker
  closed has all brokers "down" for hours without any failure, and a restart of the
  broker must not find its first failed attempt already past the grace period.

A line is judged when the worker serves it (librdkafka hands log lines, errors and
statistics to the client's poll, in the order it produced them), with what that client
had reported up to it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError

# librdkafka's own log lines (delivered on poll) go through our structured logging.
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")

BROKERS_DOWN_GRACE_MS = 30_000
"""How long all brokers may be down before a connection failure is an ERROR."""

STATISTICS_INTERVAL_MS = 1_000
"""How often librdkafka reports its connections' states (stats_cb) to a polled client."""

# What librdkafka says when establishing a connection to a broker fails (facility FAIL):
# the address refused, unreachable or timing out, or the name not resolving (a broker
# pod restarting loses its DNS record). Anything else it logs at ERROR stays as it is.
_CONNECTION_FAILURE = re.compile(r"(?:^|: )(?:Connect to \S+ failed: |Failed to resolve ')")
# librdkafka's connection states in which a broker is usable (rd_kafka_broker_state_is_up)
_UP_STATES = frozenset({"UP", "UPDATE", "REAUTH"})


def is_connection_failure(facility: str, text: str) -> bool:
    """Whether a librdkafka log line (facility, text) says a connection attempt failed.

    The text is ``[thrd:<thread>]: <broker>: <error> (after Nms in state S[, N identical
    error(s) suppressed])``, e.g. ``[thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: Connect to
    ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)``; a
    coordinator's adds its address: ``GroupCoordinator: 127.0.0.1:9092: Connect to ...``."""
    return facility == "FAIL" and _CONNECTION_FAILURE.search(text) is not None


class BrokersDown:
    """Which level a connection-failure line gets, given what one client's librdkafka
    reported before it. Times are milliseconds on one monotonic clock."""

    def __init__(self, grace_ms: int = BROKERS_DOWN_GRACE_MS) -> None:
        self.grace_ms = grace_ms
        self._all_down = False  # librdkafka said so, and no broker came up since
        self._failing_since: int | None = None  # first failure since a broker was up

    def all_down(self) -> None:
        """librdkafka reports every broker connection down."""
        self._all_down = True

    def broker_up(self) -> None:
        """librdkafka reports a broker connection up (or a request succeeded)."""
        self._all_down = False
        self._failing_since = None

    def connection_failed(self, now_ms: int) -> int:
        """A connection attempt failed at `now_ms`: the level of its line."""
        if self._failing_since is None:
            self._failing_since = now_ms
        if self._all_down and now_ms - self._failing_since >= self.grace_ms:
            return logging.ERROR
        return logging.WARNING

    def down_ms(self, now_ms: int) -> int | None:
        """How long all brokers have been down as of `now_ms` (None: not known down)."""
        if not self._all_down or self._failing_since is None:
            return None
        return now_ms - self._failing_since


def any_broker_up(statistics: str | Mapping[str, Any]) -> bool | None:
    """From a librdkafka statistics report (JSON, or as parsed by a caller that reads
    more of it): whether a broker connection is up; None if the report names no broker
    (the client's internal one aside)."""
    report = json.loads(statistics) if isinstance(statistics, str) else statistics
    brokers = report.get("brokers") or {}
    states = [b.get("state") for b in brokers.values() if b.get("source") != "internal"]
    if not states:
        return None
    return any(state in _UP_STATES for state in states)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class ConnectionLog:
    """One Kafka client's log hook: its ``logger`` (librdkafka calls ``log(level, "%s
    [%s] %s", facility, client, text)``), and what its error and statistics callbacks
    report. Thread-safe: a client's callbacks run on whichever thread polls it."""

    def __init__(
        self,
        rule: BrokersDown | None = None,
        clock_ms: Callable[[], int] = _monotonic_ms,
        logger: logging.Logger = LIBRDKAFKA_LOG,
    ) -> None:
        self.rule = rule or BrokersDown()
        self._clock_ms = clock_ms
        self._logger = logger
        self._lock = threading.Lock()

    def log(self, level: int, msg: str, *args: object) -> None:
        """librdkafka's log line: a connection failure at the rule's level, others as is."""
        extra = None
        if (
            level >= logging.ERROR
            and len(args) == 3
            and is_connection_failure(str(args[0]), str(args[2]))
        ):
            now = self._clock_ms()
            with self._lock:
                level = min(level, self.rule.connection_failed(now))
                down = self.rule.down_ms(now)
            if down is not None:
                extra = {"all_brokers_down_seconds": round(down / 1000, 3)}
        self._logger.log(level, msg, *args, extra=extra)

    def error(self, err: object) -> None:
        """From error_cb: `_ALL_BROKERS_DOWN` says every broker connection is down."""
        if isinstance(err, KafkaError) and err.code() == KafkaError._ALL_BROKERS_DOWN:
            with self._lock:
                self.rule.all_down()

    def statistics(self, report: str | Mapping[str, Any]) -> None:
        """From stats_cb: the connections' states librdkafka reports (its JSON, or as
        parsed already)."""
        try:
            up = any_broker_up(report)
        except (ValueError, AttributeError, TypeError):  # not the report expected: no word
            return
        if up is None:
            return
        with self._lock:
            if up:
                self.rule.broker_up()
            else:
                self.rule.all_down()

    def request_succeeded(self) -> None:
        """A request this client sent was answered: a broker is up."""
        with self._lock:
            self.rule.broker_up()
