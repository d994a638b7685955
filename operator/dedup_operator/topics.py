"""The topics' preconditions of the guarantee, as the operator checks them (pure).

Each id is published once within the window only while:
- the input topic exists with `spec.partitions` partitions (a worker reads partition p;
  more or fewer partitions would leave records unread or ids owned twice);
- the output topic exists with at least `spec.partitions` partitions (worker p publishes
  to output partition p; more stay empty), is not compacted (compaction keeps the last
  record of each *key*, and output records are keyed as their input was: a rebuild
  would miss published ids), and keeps every record for the whole window: a lost store
  is rebuilt from the output over the window, so an id published earlier than the
  output's retention is forgotten and would be published again. `retention.ms` -1 or at
  least `window.duration`; a window without a duration (`maxKeys` only) needs -1;
  `retention.bytes` -1, since no byte count can be proven to hold a window of time.

The shell (`kube.read_topics`) reads the facts; `check_topics` decides. A failure is the
TopicReady condition's reason and message, with the numbers, and makes the pipeline
Degraded; the operator logs it at ERROR.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TopicCheck:
    """What the operator found out about the topics (the TopicReady condition)."""

    ok: bool
    reason: str
    message: str
    partitions: int | None = None  # the input topic's partition count, when read


@dataclass(frozen=True)
class TopicFacts:
    """The topics as Kafka's metadata and configs describe them."""

    input_topic: str
    input_partitions: int | None  # None: the topic does not exist
    output_topic: str
    output_partitions: int | None  # None: the topic does not exist
    # the output topic's configs (cleanup.policy, retention.ms, retention.bytes); a
    # missing key: not read (the check then assumes nothing about it)
    output_config: Mapping[str, str] = field(default_factory=dict)
    input_why: str = ""  # what Kafka said of a missing input topic
    output_config_error: str | None = None  # why the output's configs could not be read


def check_topics(facts: TopicFacts, partitions: int, window_ms: int | None) -> TopicCheck:
    """TopicReady for `partitions` workers and a window of `window_ms` (None: `maxKeys`
    only). The first problem is the reason; the message names every problem."""
    inp, out = facts.input_topic, facts.output_topic
    if facts.input_partitions is None:
        why = f" ({facts.input_why})" if facts.input_why else ""
        return TopicCheck(False, "TopicMissing", f"input topic {inp} does not exist{why}")
    count = facts.input_partitions
    problems: list[tuple[str, str]] = []
    if count != partitions:
        problems.append(
            (
                "PartitionCountMismatch",
                f"input topic {inp} has {count} partitions, spec.partitions is {partitions}",
            )
        )
    problems += _output_problems(facts, partitions, window_ms)
    if problems:
        reason = problems[0][0]
        return TopicCheck(False, reason, "; ".join(message for _, message in problems), count)
    extra = ""
    if facts.output_partitions is not None and facts.output_partitions > partitions:
        extra = f" (partitions {partitions}..{facts.output_partitions - 1} stay empty)"
    return TopicCheck(
        True,
        "TopicFound",
        f"input topic {inp} has {count} partitions; output topic {out} has "
        f"{facts.output_partitions} partitions{extra} and keeps the window",
        count,
    )


def _output_problems(
    facts: TopicFacts, partitions: int, window_ms: int | None
) -> list[tuple[str, str]]:
    out = facts.output_topic
    if facts.output_partitions is None:
        return [("OutputTopicMissing", f"output topic {out} does not exist")]
    problems = []
    if facts.output_partitions < partitions:
        problems.append(
            (
                "OutputPartitionsTooFew",
                f"output topic {out} has {facts.output_partitions} partitions, fewer than "
                f"spec.partitions {partitions}",
            )
        )
    if facts.output_config_error is not None:
        problems.append(
            (
                "OutputConfigUnreadable",
                f"cannot read the configs of output topic {out} ({facts.output_config_error}): "
                "its compaction and retention against the window are unchecked; allow "
                "DescribeConfigs on it",
            )
        )
    config = facts.output_config
    policy = {p.strip() for p in config.get("cleanup.policy", "delete").split(",")}
    if "compact" in policy:
        problems.append(
            (
                "OutputCompacted",
                f"output topic {out} is compacted (cleanup.policy={config['cleanup.policy']}): "
                "a store rebuilt from it would miss published ids; use cleanup.policy=delete",
            )
        )
    retention_ms = _number(config.get("retention.ms"))
    if retention_ms is not None and retention_ms >= 0:
        window = "no duration (maxKeys only)" if window_ms is None else _duration(window_ms)
        if window_ms is None or retention_ms < window_ms:
            problems.append(
                (
                    "OutputRetentionTooShort",
                    f"output topic {out} keeps records {_duration(retention_ms)} "
                    f"(retention.ms={retention_ms}), the window is {window}: a store rebuilt "
                    "from it would forget ids published earlier; set retention.ms="
                    + ("-1" if window_ms is None else f"{window_ms} or more, or -1"),
                )
            )
    retention_bytes = _number(config.get("retention.bytes"))
    if retention_bytes is not None and retention_bytes >= 0:
        problems.append(
            (
                "OutputRetentionBytes",
                f"output topic {out} keeps at most {retention_bytes} bytes a partition "
                "(retention.bytes): records younger than the window may be deleted, and a "
                "rebuilt store would forget their ids; set retention.bytes=-1",
            )
        )
    return problems


def _number(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _duration(ms: int) -> str:
    """Milliseconds as a person reads them: 86400000 -> 24h, 90000 -> 90s."""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
