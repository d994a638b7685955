"""pytest fixtures for the real Kafka part (see local/dedup_local/kafka.py).

`kafka`: one real broker (KRaft, Java) per test session, started on first use (where
the local cluster's pods reach it, when the session uses that cluster).
`topic_name`: a unique topic name for the test (not created).
`new_topic`: a factory that creates unique topics on the session broker.
`kafka_broker_factory`: private brokers for tests that kill or restart one (chaos); they
are stopped and removed after the test, so the shared `kafka` stays up for the others.

When the broker jars are missing the fixtures fail with the setup command to run
(`make setup-kafka`); they never skip silently. The session broker starts as every
session part does (support/session_parts.py: one start at a time on the machine,
retried once, the group ended with one line when it does not start).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import pytest

from dedup_local.kafka import KafkaBroker
from dedup_local.paths import MissingArtifact
from support.session_parts import start_session_part


class NewTopic(Protocol):
    def __call__(
        self,
        partitions: int = 1,
        config: Mapping[str, str | int] | None = None,
        *,
        prefix: str | None = None,
    ) -> str: ...


def _unique_name(request: pytest.FixtureRequest, prefix: str | None = None) -> str:
    base = prefix or request.node.name
    base = re.sub(r"[^a-zA-Z0-9._-]+", "-", base).strip("-.")[:80] or "topic"
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def kafka(request: pytest.FixtureRequest) -> Iterator[KafkaBroker]:
    """The session's Kafka broker; `.bootstrap` is "127.0.0.1:<port>", or, when a test of
    the session runs on the local cluster's real nodes (`local_cluster`), the address
    their pods reach (`RealCluster.broker_host`; the host's clients reach it too)."""
    on_real_nodes = any("local_cluster" in getattr(item, "fixturenames", ())
                        for item in request.session.items)  # fmt: skip
    host = request.getfixturevalue("local_cluster").broker_host if on_real_nodes else None
    made: list[KafkaBroker] = []

    def start() -> KafkaBroker:
        made.append(KafkaBroker(host=host) if host else KafkaBroker())
        return made[-1].start()

    def clean_up() -> None:
        made.pop().close()

    broker = start_session_part(request, "the session's Kafka broker", start, clean_up)
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test (derived from its name); not created."""
    return _unique_name(request)


@pytest.fixture
def new_topic(kafka: KafkaBroker, request: pytest.FixtureRequest) -> NewTopic:
    """Creates a uniquely named topic on the session broker and returns its name."""

    def make(
        partitions: int = 1,
        config: Mapping[str, str | int] | None = None,
        *,
        prefix: str | None = None,
    ) -> str:
        name = _unique_name(request, prefix)
        kafka.create_topic(name, partitions, config)
        return name

    return make


@pytest.fixture
def kafka_broker_factory() -> Iterator[Callable[..., KafkaBroker]]:
    """Starts private brokers (`KafkaBroker(**kwargs)`), closed after the test."""
    brokers: list[KafkaBroker] = []

    def make(**kwargs: Any) -> KafkaBroker:
        broker = KafkaBroker(**kwargs)
        brokers.append(broker)
        try:
            broker.start()
        except MissingArtifact as exc:
            pytest.fail(str(exc), pytrace=False)
        return broker

    yield make
    for broker in brokers:
        broker.close()
