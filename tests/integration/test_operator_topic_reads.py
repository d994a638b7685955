"""The operator's topic reads through shared admin clients, on a real broker
(`kafka_admin.SharedAdmins`): pipelines with the same settings share one client, a
client unused for its idle time is closed, and a broker outage is told by the check
(KafkaUnreachable) with its client dropped, never by an idle client's ERROR lines."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest

from dedup_local.kafka import KafkaBroker
from dedup_operator.kafka_admin import SharedAdmins, read_topics
from dedup_operator.topics import TopicCheck, TopicFacts
from support.kafka_fixtures import NewTopic

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]


def test_checks_of_pipelines_on_one_cluster_share_one_connected_client(
    kafka: KafkaBroker, new_topic: NewTopic
) -> None:
    admins = SharedAdmins()
    a_in, a_out, b_in, b_out = (new_topic(n) for n in (2, 3, 4, 5))
    a = read_topics(kafka.bootstrap, {}, a_in, a_out, admins=admins)
    b = read_topics(kafka.bootstrap, {}, b_in, b_out, admins=admins)
    assert isinstance(a, TopicFacts) and (a.input_partitions, a.output_partitions) == (2, 3)
    assert isinstance(b, TopicFacts) and (b.input_partitions, b.output_partitions) == (4, 5)
    assert admins.opened == 1 and len(admins) == 1
    other = read_topics(kafka.bootstrap, {"client.id": "team-b"}, a_in, a_out, admins=admins)
    assert isinstance(other, TopicFacts) and admins.opened == 2


def test_a_grown_topic_is_seen_by_the_shared_client_at_its_next_check(
    kafka: KafkaBroker, new_topic: NewTopic
) -> None:
    admins = SharedAdmins()
    topic, out = new_topic(2), new_topic(2)
    before = read_topics(kafka.bootstrap, {}, topic, out, admins=admins)
    assert isinstance(before, TopicFacts) and before.input_partitions == 2
    kafka.grow_topic(topic, 4)  # returns once the broker serves 4 (it applies metadata late)
    after = read_topics(kafka.bootstrap, {}, topic, out, admins=admins)
    assert isinstance(after, TopicFacts) and after.input_partitions == 4
    assert admins.opened == 1


def test_an_outage_is_told_by_the_check_and_no_idle_client_logs_an_error(
    kafka_broker_factory: Callable[..., KafkaBroker], caplog: pytest.LogCaptureFixture
) -> None:
    broker = kafka_broker_factory()
    topic, out = "reads-in", "reads-out"
    broker.create_topic(topic, 1)
    broker.create_topic(out, 1)
    admins = SharedAdmins(idle_s=2.0)
    caplog.set_level(logging.INFO, logger="librdkafka")
    assert isinstance(read_topics(broker.bootstrap, {}, topic, out, admins=admins), TopicFacts)
    assert len(admins) == 1

    broker.stop()
    down = time.monotonic()
    time.sleep(3.0)
    assert len(admins) == 0  # closed by the sweeper, idle for 2 s
    unreached = read_topics(broker.bootstrap, {}, topic, out, admins=admins, timeout_s=3.0)
    assert isinstance(unreached, TopicCheck) and unreached.reason == "KafkaUnreachable"
    assert len(admins) == 0 and admins.opened == 2  # dropped: the next check opens anew
    # beyond the brokers-down grace (30 s): no client of ours is left to cross it
    time.sleep(max(0.0, 33.0 - (time.monotonic() - down)))
    errors = [r for r in caplog.records if r.name == "librdkafka" and r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]

    broker.start()
    back = read_topics(broker.bootstrap, {}, topic, out, admins=admins, timeout_s=10.0)
    assert isinstance(back, TopicFacts) and back.input_partitions == 1
