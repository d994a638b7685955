"""One reading of Kafka `key=value[,key=value]` settings (dedup_contract.kafka_settings),
and the three places that read them refusing an entry that is not `key=value`: the
worker's --kafka-config, the Spark jobs' --kafka-config and the operator's spec."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from dedup_contract.kafka_settings import (
    KafkaSettingsError,
    format_kafka_settings,
    parse_kafka_settings,
    unreadable_setting,
)
from dedup_operator.spec import PipelineSpec, SpecError
from dedup_spark.source import SourceError, parse_settings
from dedup_worker.cli import build_parser, config_from_args


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def test_entries_are_read_trimmed_and_the_last_of_a_key_wins() -> None:
    text = " security.protocol = SASL_SSL ,, sasl.mechanisms=PLAIN,a=1,a=2, empty= "
    assert parse_kafka_settings(text) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "PLAIN",
        "a": "2",
        "empty": "",
    }
    assert parse_kafka_settings("") == parse_kafka_settings(None) == {}
    assert parse_kafka_settings("k=v=w") == {"k": "v=w"}  # the first `=` splits


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a=1,foo", "Kafka setting 'foo' is not key=value"),
        ("foo", "Kafka setting 'foo' is not key=value"),
        ("a=1, =x", "Kafka setting '=x' has an empty key"),
    ],
)
def test_an_entry_without_a_key_and_a_value_is_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(KafkaSettingsError, match=exactly(message)):
        parse_kafka_settings(text)


def test_settings_written_as_text_read_back_the_same() -> None:
    pairs = [("security.protocol", "SSL"), ("a", ""), ("b", "x=y")]
    assert parse_kafka_settings(format_kafka_settings(pairs)) == dict(pairs)
    assert unreadable_setting("security.protocol", "SSL") is None
    assert unreadable_setting("", "x") == "Kafka setting '=x' has an empty key"
    assert unreadable_setting("a,foo", "1") == "Kafka setting 'a' is not key=value"
    assert "does not read back" in str(unreadable_setting("a", "1,b=2"))


WORKER = [
    "--bootstrap-servers", "127.0.0.1:9092",
    "--input-topic", "events",
    "--output-topic", "events-deduped",
    "--partition", "0",
    "--pipeline", "events",
    "--store-path", "/tmp/store",
    "--window-duration", "2h",
]  # fmt: skip


def test_the_worker_refuses_a_kafka_config_entry_that_is_not_key_value() -> None:
    args = build_parser().parse_args([*WORKER, "--kafka-config", "a=1,foo"])
    with pytest.raises(
        ValueError, match=exactly("--kafka-config: Kafka setting 'foo' is not key=value")
    ):
        config_from_args(args)


def test_the_spark_jobs_refuse_a_kafka_config_entry_that_is_not_key_value() -> None:
    with pytest.raises(SourceError, match=exactly("Kafka setting 'foo' is not key=value")):
        parse_settings("security.protocol=SSL,foo")


SPEC: dict[str, Any] = {
    "kafka": {"bootstrapServers": "k:9092", "inputTopic": "a", "outputTopic": "b"},
    "partitions": 2,
    "messageId": {"source": "key"},
    "window": {"maxKeys": 1000},
}


def test_the_operator_refuses_a_spec_whose_kafka_config_is_not_key_value() -> None:
    """`kafka.config` reaches the workers as key=value text (DEDUP_KAFKA_CONFIG): an entry
    that would not read back as itself is an invalid spec (condition InvalidSpec), named.
    (The CRD's rules refuse such keys; this is for what slipped through.)"""
    spec = copy.deepcopy(SPEC)
    spec["kafka"]["config"] = {"security.protocol": "SSL", "foo,a": "1"}
    with pytest.raises(
        SpecError, match=exactly("kafka.config: Kafka setting 'foo' is not key=value")
    ):
        PipelineSpec.parse("events", "default", spec)
    spec["kafka"]["config"] = {"": "x"}
    with pytest.raises(
        SpecError, match=exactly("kafka.config: Kafka setting '=x' has an empty key")
    ):
        PipelineSpec.parse("events", "default", spec)
    spec["kafka"]["config"] = {"security.protocol": "SSL", "foo": ""}
    parsed = PipelineSpec.parse("events", "default", spec)
    assert parsed.kafka.config == (("security.protocol", "SSL"), ("foo", ""))


def test_the_operator_says_which_entry_of_a_kafka_secret_is_not_key_value_without_showing_it() -> (
    None
):
    """The Secret's text reaches the workers after the spec's settings; an entry the
    workers would refuse makes TopicReady False (SecretInvalid) with its position, never
    its text (it may be a credential)."""
    from dedup_operator.observe import kafka_settings_of
    from dedup_operator.topics import TopicCheck

    class SecretHolder:
        def __init__(self, text: str) -> None:
            self.text = text

        def secret_value(self, namespace: str, name: str, key: str) -> str | None:
            return self.text

    spec_body = copy.deepcopy(SPEC)
    spec_body["kafka"]["securityRef"] = {"secretName": "kafka-auth", "key": "config"}
    spec = PipelineSpec.parse("events", "default", spec_body)
    told = kafka_settings_of(SecretHolder("sasl.username=u,hunter2"), spec)  # type: ignore[arg-type]
    assert isinstance(told, TopicCheck) and not told.ok and told.reason == "SecretInvalid"
    assert "entry 2 is not key=value" in told.message and "hunter2" not in told.message
    read = kafka_settings_of(SecretHolder("sasl.username=u,sasl.password=p"), spec)  # type: ignore[arg-type]
    assert isinstance(read, dict)
    assert (read["sasl.username"], read["sasl.password"]) == ("u", "p")
