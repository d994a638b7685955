"""The topics' preconditions of the guarantee, as the operator checks them (pure).

Under ownership each id is published once within the window only while:
- the input topic exists (any partition count, and it may grow: worker w reads input
  partitions i with i % workers == w);
- the output topic exists with at least `workers` partitions (the owner w of an id
  publishes it to output partition w), is not compacted (a rebuild would miss published
  ids), and keeps every record for the whole window (a lost store is rebuilt from it):
  `retention.ms` -1 or at least `window.duration` (-1 for a window with `maxKeys` only),
  `retention.bytes` -1;
- the internal topic (`names.owned_topic`, or `kafka.ownedTopic`) exists with at least
  `workers` partitions and loses no record: `cleanup.policy=delete`, `retention.ms=-1`,
  `retention.bytes=-1`, `message.timestamp.type=CreateTime`, `max.message.bytes` at least
  the input's plus `HEADER_ROOM`, replication factor and `min.insync.replicas` at least
  the output's, and unclean leader election off.
Why each, and each failure's reason: docs/design.md, "The guarantee and what it assumes".

When `workers` does not divide the input's partition count, a producer keyed by id with
murmur2 has some of its records forwarded (`forwarded_share`): TopicReady stays True and
its message says how many. A pipeline without ownership (`OwnershipOff`) needs exactly
`spec.partitions` input partitions (worker p reads input partition p) and no internal topic.

The shell reads the facts (`read_topics`); `check_topics` decides. A failure is the
TopicReady condition's reason and message, with the numbers, and makes the pipeline
Degraded; the operator logs it at ERROR.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

# room for the forwarding headers (dedup.id, dedup.origin) and the batch overhead on top
# of the largest input record, in the internal topic's max.message.bytes
HEADER_ROOM: Final = 65536
# the broker's default max.message.bytes (message.max.bytes), when nothing says otherwise
KAFKA_DEFAULT_MAX_MESSAGE_BYTES: Final = 1048588

OUTPUT_CONFIGS: Final = ("cleanup.policy", "retention.ms", "retention.bytes", "min.insync.replicas")
INPUT_CONFIGS: Final = ("max.message.bytes",)
OWNED_CONFIGS: Final = (
    "cleanup.policy",
    "retention.ms",
    "retention.bytes",
    "message.timestamp.type",
    "max.message.bytes",
    "min.insync.replicas",
    "unclean.leader.election.enable",
)

# reasons that keep workers from starting: without the input or the internal topic's
# partitions a worker cannot run
BLOCKING: Final = frozenset({"TopicMissing", "OwnedTopicMissing", "OwnedPartitionsTooFew"})


@dataclass(frozen=True)
class TopicCheck:
    """What the operator found out about the topics (the TopicReady condition)."""

    ok: bool
    reason: str
    message: str
    partitions: int | None = None  # the input topic's partition count, when read
    # under ownership any worker may start whatever the input's partition count
    ownership: bool = False
    blocks: bool = False  # no worker may start (the input or the internal topic unusable)


@dataclass(frozen=True)
class TopicFacts:
    """The topics as Kafka's metadata and configs describe them."""

    input_topic: str
    input_partitions: int | None  # None: the topic does not exist
    output_topic: str
    output_partitions: int | None  # None: the topic does not exist
    # the output topic's configs (OUTPUT_CONFIGS); a missing key: not read (the check
    # then assumes nothing about it)
    output_config: Mapping[str, str] = field(default_factory=dict)
    input_why: str = ""  # what Kafka said of a missing input topic
    output_config_error: str | None = None  # why the output's configs could not be read
    output_replication: int | None = None  # the output's replication factor
    input_config: Mapping[str, str] = field(default_factory=dict)  # INPUT_CONFIGS
    input_config_error: str | None = None
    # the internal topic; None: not read (a pipeline without ownership)
    owned_topic: str | None = None
    owned_partitions: int | None = None  # None: the topic does not exist
    owned_replication: int | None = None
    owned_config: Mapping[str, str] = field(default_factory=dict)  # OWNED_CONFIGS
    owned_config_error: str | None = None
    owned_why: str = ""  # why it is missing (e.g. its creation failed)
    owned_user_named: bool = False  # kafka.ownedTopic: the user creates it


def forwarded_share(input_partitions: int, workers: int) -> Fraction:
    """The expected share of a murmur2-keyed producer's records that reach a worker not
    owning them, so are forwarded through the internal topic.

    Such a record's hash h (uniform) puts it on input partition h % I, read by worker
    (h % I) % W; its owner is h % W. Both depend on h only modulo lcm(I, W): write
    h = r + k*I with r = h % I and k in [0, W/g), g = gcd(I, W). Then
    (h % I) % W == h % W iff k*I == 0 (mod W) iff k == 0 (mod W/g): one k in W/g. So the
    share that stays is g/W, the share forwarded 1 - gcd(I, W)/W (0 when W divides I).
    """
    if input_partitions < 1 or workers < 1:
        raise ValueError("partition and worker counts are positive")
    return 1 - Fraction(math.gcd(input_partitions, workers), workers)


@dataclass(frozen=True)
class OwnedTopicSettings:
    """How the operator creates the internal topic."""

    name: str
    partitions: int
    replication: int
    config: Mapping[str, str]


def owned_topic_settings(facts: TopicFacts, workers: int) -> OwnedTopicSettings | str:
    """The internal topic's settings from the input's and the output's, or why they
    cannot be known yet (then it is not created)."""
    if facts.owned_topic is None:
        return "no internal topic for a pipeline without ownership"
    if facts.input_partitions is None:
        return "the input topic does not exist"
    if facts.output_partitions is None or facts.output_replication is None:
        return "the output topic does not exist"
    if facts.input_config_error is not None:
        return f"cannot read the input topic's max.message.bytes ({facts.input_config_error})"
    if facts.output_config_error is not None:
        return f"cannot read the output topic's min.insync.replicas ({facts.output_config_error})"
    largest = _number(facts.input_config.get("max.message.bytes"))
    if largest is None:
        largest = KAFKA_DEFAULT_MAX_MESSAGE_BYTES
    config = {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "message.timestamp.type": "CreateTime",
        "max.message.bytes": str(largest + HEADER_ROOM),
        "unclean.leader.election.enable": "false",
    }
    in_sync = _number(facts.output_config.get("min.insync.replicas"))
    if in_sync is not None:
        config["min.insync.replicas"] = str(in_sync)
    return OwnedTopicSettings(facts.owned_topic, workers, facts.output_replication, config)


def check_topics(
    facts: TopicFacts, partitions: int, window_ms: int | None, *, ownership: bool = True
) -> TopicCheck:
    """TopicReady for `partitions` workers and a window of `window_ms` (None: `maxKeys`
    only); `ownership` False: a pipeline that ran before ownership (worker p reads input
    partition p). The first problem is the reason; the message names every problem."""
    inp, out = facts.input_topic, facts.output_topic
    if facts.input_partitions is None:
        why = f" ({facts.input_why})" if facts.input_why else ""
        return TopicCheck(
            False,
            "TopicMissing",
            f"input topic {inp} does not exist{why}",
            ownership=ownership,
            blocks=True,
        )
    count = facts.input_partitions
    problems: list[tuple[str, str]] = []
    if not ownership and count != partitions:
        problems.append(
            (
                "PartitionCountMismatch",
                f"input topic {inp} has {count} partitions, spec.partitions is {partitions} "
                "(a pipeline without ownership: worker p reads input partition p)",
            )
        )
    problems += _output_problems(facts, partitions, window_ms)
    if ownership:
        problems += _owned_problems(facts, partitions)
    if problems:
        reason = problems[0][0]
        return TopicCheck(
            False,
            reason,
            "; ".join(message for _, message in problems),
            count,
            ownership=ownership,
            blocks=any(r in BLOCKING for r, _ in problems),
        )
    extra = ""
    if facts.output_partitions is not None and facts.output_partitions > partitions:
        extra = f" (partitions {partitions}..{facts.output_partitions - 1} stay empty)"
    if not ownership:
        return TopicCheck(
            True,
            "TopicFound",
            f"input topic {inp} has {count} partitions; output topic {out} has "
            f"{facts.output_partitions} partitions{extra} and keeps the window",
            count,
        )
    return TopicCheck(
        True,
        "TopicFound",
        f"input topic {inp} has {count} partitions for {partitions} workers "
        f"({_forwarding(count, partitions)}); output topic {out} has "
        f"{facts.output_partitions} partitions{extra} and keeps the window; internal topic "
        f"{facts.owned_topic} has {facts.owned_partitions} partitions",
        count,
        ownership=True,
    )


def _forwarding(inputs: int, workers: int) -> str:
    share = forwarded_share(inputs, workers)
    if share == 0:
        return "a producer keyed by id with murmur2 needs no forwarding"
    return (
        f"warning: {inputs} input partitions are not a multiple of {workers} workers, so "
        f"{float(share):.1%} ({share}) of the records of a producer keyed by id with "
        "murmur2 reach a worker that does not own their id and are forwarded through the "
        f"internal topic (each crosses the broker twice more); grow the input to a "
        f"multiple of {workers} partitions to forward none"
    )


def _owned_problems(facts: TopicFacts, workers: int) -> list[tuple[str, str]]:
    name = facts.owned_topic
    if facts.owned_partitions is None:
        why = f" ({facts.owned_why})" if facts.owned_why else ""
        fix = (
            f"; create it (kafka.ownedTopic) with at least {workers} partitions, "
            "cleanup.policy=delete, retention.ms=-1, retention.bytes=-1, "
            "message.timestamp.type=CreateTime, unclean.leader.election.enable=false, "
            f"max.message.bytes of the input's + {HEADER_ROOM}, and replication and "
            "min.insync.replicas at least the output's"
            if facts.owned_user_named
            else ""
        )
        return [("OwnedTopicMissing", f"internal topic {name} does not exist{why}{fix}")]
    problems = []
    if facts.owned_partitions < workers:
        problems.append(
            (
                "OwnedPartitionsTooFew",
                f"internal topic {name} has {facts.owned_partitions} partitions, fewer than "
                f"the {workers} workers (worker w reads internal partitions q with "
                f"q % {workers} == w; records forwarded to owners {facts.owned_partitions}.."
                f"{workers - 1} would have no partition)",
            )
        )
    if facts.owned_config_error is not None:
        problems.append(
            (
                "OwnedConfigUnreadable",
                f"cannot read the configs of internal topic {name} "
                f"({facts.owned_config_error}): whether it keeps every forwarded record is "
                "unchecked; allow DescribeConfigs on it",
            )
        )
    config = facts.owned_config
    policy = config.get("cleanup.policy")
    if policy is not None and {p.strip() for p in policy.split(",")} != {"delete"}:
        problems.append(
            (
                "OwnedTopicCompacted",
                f"internal topic {name} has cleanup.policy={policy}: compaction would drop "
                "forwarded records whose input offset is committed (their only copy); use "
                "cleanup.policy=delete",
            )
        )
    retention_ms = _number(config.get("retention.ms"))
    if retention_ms is not None and retention_ms != -1:
        problems.append(
            (
                "OwnedRetentionLimited",
                f"internal topic {name} deletes records after {_duration(retention_ms)} "
                f"(retention.ms={retention_ms}): a forwarded record an owner has not yet "
                "consumed (a stopped worker, a backlog) would be lost; set retention.ms=-1 "
                "(owners delete what they consumed)",
            )
        )
    retention_bytes = _number(config.get("retention.bytes"))
    if retention_bytes is not None and retention_bytes != -1:
        problems.append(
            (
                "OwnedRetentionBytes",
                f"internal topic {name} keeps at most {retention_bytes} bytes a partition "
                "(retention.bytes): forwarded records not yet consumed could be deleted; "
                "set retention.bytes=-1",
            )
        )
    stamp = config.get("message.timestamp.type")
    if stamp is not None and stamp != "CreateTime":
        problems.append(
            (
                "OwnedTimestampType",
                f"internal topic {name} has message.timestamp.type={stamp}: a forwarded "
                "record would lose its input timestamp, the window's clock; set "
                "message.timestamp.type=CreateTime",
            )
        )
    problems += _size_problems(facts)
    problems += _durability_problems(facts)
    return problems


def _size_problems(facts: TopicFacts) -> list[tuple[str, str]]:
    name, inp = facts.owned_topic, facts.input_topic
    if facts.input_config_error is not None:
        return [
            (
                "InputConfigUnreadable",
                f"cannot read the configs of input topic {inp} ({facts.input_config_error}): "
                f"whether internal topic {name} takes its largest records is unchecked; "
                "allow DescribeConfigs on it",
            )
        ]
    takes = _number(facts.owned_config.get("max.message.bytes"))
    largest = _number(facts.input_config.get("max.message.bytes"))
    if takes is None or largest is None or takes >= largest + HEADER_ROOM:
        return []
    return [
        (
            "OwnedMessageBytesTooSmall",
            f"internal topic {name} takes records up to {takes} bytes (max.message.bytes), "
            f"input topic {inp} up to {largest}: a forwarded record with its headers may "
            f"need {largest} + {HEADER_ROOM}, and one too large aborts the same transaction "
            f"for ever; set max.message.bytes={largest + HEADER_ROOM} or more",
        )
    ]


def _durability_problems(facts: TopicFacts) -> list[tuple[str, str]]:
    name, out = facts.owned_topic, facts.output_topic
    problems = []
    if (
        facts.owned_replication is not None
        and facts.output_replication is not None
        and facts.owned_replication < facts.output_replication
    ):
        problems.append(
            (
                "OwnedReplicationTooLow",
                f"internal topic {name} has replication factor {facts.owned_replication}, "
                f"output topic {out} {facts.output_replication}: a forwarded record must be "
                "as durable as a published one",
            )
        )
    ours = _number(facts.owned_config.get("min.insync.replicas"))
    theirs = _number(facts.output_config.get("min.insync.replicas"))
    if ours is not None and theirs is not None and ours < theirs:
        problems.append(
            (
                "OwnedMinInsyncTooLow",
                f"internal topic {name} has min.insync.replicas={ours}, output topic {out} "
                f"{theirs}: a forwarded record must be as durable as a published one; set "
                f"min.insync.replicas={theirs} or more",
            )
        )
    if facts.owned_config.get("unclean.leader.election.enable", "false").lower() == "true":
        problems.append(
            (
                "OwnedUncleanElection",
                f"internal topic {name} has unclean.leader.election.enable=true: an unclean "
                "leader may drop committed forwarded records; set it to false",
            )
        )
    return problems


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
                f"the {partitions} workers (worker w publishes to output partition w)",
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
