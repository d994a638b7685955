"""Kafka client settings as text: `key=value[,key=value]` in librdkafka's names.

The one parser for that form, wherever it is read: the worker's `--kafka-config`
(`DEDUP_KAFKA_CONFIG`), the Spark jobs' `--kafka-config`, and the operator's settings
(the Secret named by `spec.kafka.securityRef`, and `spec.kafka.config` rendered into the
workers' `DEDUP_KAFKA_CONFIG`). Strict, so that the parts never read one text two ways:
an entry without `=`, or with an empty key, is refused with an error naming the entry.
Blanks around entries, keys and values are dropped; empty entries (`a=1,,b=2`) are
skipped; a key given twice keeps its last value. A value holds no comma (the separator).
"""

from __future__ import annotations

from collections.abc import Iterable


class KafkaSettingsError(ValueError):
    """A `key=value` text with an entry that is not one; the message names the entry,
    `position` (1-based) says where it is for texts that may not be shown (a Secret's)."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


def parse_kafka_settings(text: str | None) -> dict[str, str]:
    """`key=value[,key=value]` as a dict (an empty or None text: no settings)."""
    settings: dict[str, str] = {}
    entries = filter(None, (part.strip() for part in (text or "").split(",")))
    for position, entry in enumerate(entries, start=1):
        key, sep, value = entry.partition("=")
        if not sep:
            raise KafkaSettingsError(f"Kafka setting {entry!r} is not key=value", position)
        if not key.strip():
            raise KafkaSettingsError(f"Kafka setting {entry!r} has an empty key", position)
        settings[key.strip()] = value.strip()
    return settings


def format_kafka_settings(settings: Iterable[tuple[str, str]]) -> str:
    """The text `parse_kafka_settings` reads back as `settings` (when it can: see
    `unreadable_setting`)."""
    return ",".join(f"{key}={value}" for key, value in settings)


def unreadable_setting(key: str, value: str) -> str | None:
    """Why the pair (key, value) cannot travel as `key=value` text and be read back as
    itself, or None when it can: a key that is empty, has blanks around it or holds `=`
    or `,`, or a value that holds `,` or has blanks around it."""
    text = format_kafka_settings([(key, value)])
    try:
        read = parse_kafka_settings(text)
    except KafkaSettingsError as exc:
        return str(exc)
    if read != {key: value}:
        return f"Kafka setting {text!r} does not read back as key {key!r}, value {value!r}"
    return None
