"""The operator's calls to Kafka's admin API: the topics' facts that `topics.check_topics`
decides on, and the internal topic created and deleted. Each call opens its own
AdminClient with the pipeline's client settings; what Kafka refuses comes back as a value
(`TopicCheck` KafkaUnreachable, or Kafka's error text)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from dedup_contract import broker_logs
from dedup_operator.topics import (
    INPUT_CONFIGS,
    OUTPUT_CONFIGS,
    OWNED_CONFIGS,
    OwnedTopicSettings,
    TopicCheck,
    TopicFacts,
)


def _admin(bootstrap: str, settings: Mapping[str, str]) -> AdminClient:
    # librdkafka's lines through logging (JSON, not raw `%3|...|FAIL|` on stderr), a
    # failed connection at WARNING: a client of 5 s never sees all brokers down for 30 s;
    # an unreachable Kafka is the TopicReady condition's ERROR line
    return AdminClient(
        {"bootstrap.servers": bootstrap, **settings, "logger": broker_logs.ConnectionLog()}
    )


def read_topics(
    bootstrap: str,
    settings: Mapping[str, str],
    input_topic: str,
    output_topic: str,
    owned_topic: str | None = None,
    timeout_s: float = 5.0,
    owned_user_named: bool = False,
) -> TopicFacts | TopicCheck:
    """The input, output (and internal, when `owned_topic` is given) topics' partition
    counts, replication and configs (what `topics.check_topics` decides on), or
    KafkaUnreachable."""
    admin = _admin(bootstrap, settings)

    def count(topic: str) -> tuple[int | None, int | None, str]:
        # the one topic's metadata, not the cluster's (which grows with every topic)
        info = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            why = str(info.error) if info is not None and info.error is not None else ""
            return None, None, why
        replication = min(len(p.replicas) for p in info.partitions.values())
        return len(info.partitions), replication, ""

    try:
        inputs, _, why = count(input_topic)
        outputs, output_replication, _ = count(output_topic)
        owned = count(owned_topic) if owned_topic is not None else (None, None, "")
    except KafkaException as exc:
        return TopicCheck(
            False, "KafkaUnreachable", f"cannot read metadata of {input_topic}: {exc}"
        )

    def configs(topic: str, keys: Sequence[str]) -> tuple[dict[str, str], str | None]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            entries = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
        except Exception as exc:  # authorization, timeout: said in the condition
            return {}, str(exc) or type(exc).__name__
        return {k: str(entries[k].value) for k in keys if k in entries}, None

    input_config: dict[str, str] = {}
    output_config: dict[str, str] = {}
    owned_config: dict[str, str] = {}
    input_error = output_error = owned_error = None
    if outputs is not None:
        output_config, output_error = configs(output_topic, OUTPUT_CONFIGS)
    if owned_topic is not None and inputs is not None:
        input_config, input_error = configs(input_topic, INPUT_CONFIGS)
    if owned_topic is not None and owned[0] is not None:
        owned_config, owned_error = configs(owned_topic, OWNED_CONFIGS)
    return TopicFacts(
        input_topic,
        inputs,
        output_topic,
        outputs,
        output_config,
        why,
        output_error,
        output_replication=output_replication,
        input_config=input_config,
        input_config_error=input_error,
        owned_topic=owned_topic,
        owned_partitions=owned[0],
        owned_replication=owned[1],
        owned_config=owned_config,
        owned_config_error=owned_error,
        owned_user_named=owned_user_named,
    )


def create_topic(
    bootstrap: str, settings: Mapping[str, str], topic: OwnedTopicSettings, timeout_s: float = 15.0
) -> str | None:
    """Create the internal topic; None when done (or it exists), else Kafka's error."""
    admin = _admin(bootstrap, settings)
    new = NewTopic(
        topic.name,
        num_partitions=topic.partitions,
        replication_factor=topic.replication,
        config=dict(topic.config),
    )
    try:
        admin.create_topics([new], request_timeout=timeout_s)[topic.name].result(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return None
        return str(error or exc)
    except Exception as exc:  # a timeout
        return str(exc) or type(exc).__name__
    return None


def delete_topic(
    bootstrap: str, settings: Mapping[str, str], topic: str, timeout_s: float = 15.0
) -> str | None:
    """Delete a topic the operator created; None when done (or it is gone), else why not."""
    admin = _admin(bootstrap, settings)
    try:
        admin.delete_topics([topic], request_timeout=timeout_s)[topic].result(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        return str(error or exc)
    except Exception as exc:
        return str(exc) or type(exc).__name__
    return None
