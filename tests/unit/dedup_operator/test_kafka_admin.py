"""The shared admin clients' rule (`kafka_admin.SharedAdmins`): one client per
(bootstrap, settings), kept while used, closed when idle, dropped when Kafka was not
reached. The clients here are plain objects standing in for AdminClient (named as such):
what a real one does with a real broker is `tests/integration/test_operator_topic_reads.py`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dedup_contract.broker_logs import ConnectionLog
from dedup_operator.kafka_admin import SharedAdmins


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def admins(clock: Clock) -> tuple[SharedAdmins, list[Any]]:
    made: list[Any] = []

    def open_client(bootstrap: str, settings: Mapping[str, str], log: ConnectionLog) -> Any:
        stand_in = object()  # a stand-in for AdminClient: only its identity is looked at
        made.append(stand_in)
        return stand_in

    return SharedAdmins(open_client, monotonic=clock, idle_s=10.0), made


def test_checks_with_the_same_settings_share_one_client() -> None:
    clock = Clock()
    shared, made = admins(clock)
    first = shared.take("k:9092", {"security.protocol": "SSL"})
    shared.give_back("k:9092", {"security.protocol": "SSL"}, first, failed=False)
    clock.now += 9.0
    again = shared.take("k:9092", {"security.protocol": "SSL"})
    assert again is first and len(made) == 1


def test_other_settings_or_another_cluster_get_their_own_client() -> None:
    shared, made = admins(Clock())
    a = shared.take("k:9092", {"sasl.username": "team-a"})
    b = shared.take("k:9092", {"sasl.username": "team-b"})
    c = shared.take("other:9092", {"sasl.username": "team-a"})
    assert len({id(a), id(b), id(c)}) == 3 and len(made) == 3 and len(shared) == 3


def test_the_settings_order_does_not_matter() -> None:
    shared, made = admins(Clock())
    shared.take("k:9092", {"a": "1", "b": "2"})
    shared.take("k:9092", {"b": "2", "a": "1"})
    assert len(made) == 1


def test_a_client_idle_for_idle_s_is_closed_and_a_new_one_opened() -> None:
    clock = Clock()
    shared, made = admins(clock)
    first = shared.take("k:9092", {})
    shared.give_back("k:9092", {}, first, failed=False)
    clock.now += 9.9
    assert shared.sweep() == 0
    clock.now += 0.1
    assert shared.sweep() == 1 and len(shared) == 0
    assert shared.take("k:9092", {}) is not first and len(made) == 2


def test_a_client_in_use_is_never_closed_however_long_the_check() -> None:
    clock = Clock()
    shared, _ = admins(clock)
    shared.take("k:9092", {})
    clock.now += 60.0
    assert shared.sweep() == 0 and len(shared) == 1


def test_a_client_that_did_not_reach_kafka_is_dropped_at_once() -> None:
    shared, made = admins(Clock())
    first = shared.take("k:9092", {})
    shared.give_back("k:9092", {}, first, failed=True)
    assert len(shared) == 0
    assert shared.take("k:9092", {}) is not first and len(made) == 2


def test_a_failed_check_does_not_drop_the_client_that_replaced_its_own() -> None:
    shared, _ = admins(Clock())
    old = shared.take("k:9092", {})
    assert shared.take("k:9092", {}) is old  # a concurrent check on the same client
    shared.give_back("k:9092", {}, old, failed=True)
    new = shared.take("k:9092", {})
    shared.give_back("k:9092", {}, old, failed=True)  # the concurrent check fails too
    assert shared.take("k:9092", {}) is new
