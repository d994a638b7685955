"""Which Kafka errors a worker's start-up waits out rather than crashing on."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from dedup_worker.sources import worth_retrying


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    ],
)
def test_a_coordinator_that_is_moving_or_loading_is_waited_out(code: int) -> None:
    assert worth_retrying(KafkaError(code))


def test_errors_the_client_calls_retriable_are_waited_out() -> None:
    assert worth_retrying(KafkaError(KafkaError._TIMED_OUT, retriable=True))


@pytest.mark.parametrize("code", [KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError._FENCED])
def test_other_errors_are_not(code: int) -> None:
    assert not worth_retrying(KafkaError(code))


def test_something_that_is_not_a_kafka_error_is_not() -> None:
    assert not worth_retrying(None)
