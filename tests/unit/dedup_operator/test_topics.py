"""The topics' preconditions of the guarantee (dedup_operator.topics.check_topics), the
internal topic's settings, and the share of records forwarded."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest

from dedup_operator.topics import (
    HEADER_ROOM,
    KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
    OwnedTopicSettings,
    TopicFacts,
    check_topics,
    forwarded_share,
    owned_topic_settings,
)

H = 3_600_000
GOOD = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "min.insync.replicas": "2",
}
INPUT = {"max.message.bytes": "1048588"}
OWNED = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "message.timestamp.type": "CreateTime",
    "max.message.bytes": str(1048588 + HEADER_ROOM),
    "min.insync.replicas": "2",
    "unclean.leader.election.enable": "false",
}


def facts(inputs: int | None = 3, outputs: int | None = 3, **config: str) -> TopicFacts:
    """Topics without an internal topic (a pipeline that ran before ownership)."""
    return TopicFacts("in", inputs, "out", outputs, {**GOOD, **config}, output_replication=3)


def owned(
    owned_partitions: int | None = 3,
    inputs: int | None = 3,
    outputs: int | None = 3,
    owned_replication: int = 3,
    **config: str,
) -> TopicFacts:
    """Topics with the internal topic `ns.p-owned` (`config` changes its configs)."""
    return replace(
        facts(inputs, outputs),
        input_config=INPUT,
        owned_topic="ns.p-owned",
        owned_partitions=owned_partitions,
        owned_replication=owned_replication if owned_partitions is not None else None,
        owned_config={**OWNED, **config} if owned_partitions is not None else {},
    )


# ------------------------------------------------------------------ forwarded share
def brute_force_share(inputs: int, workers: int) -> Fraction:
    """Over every hash value of one full period, the share whose input partition's
    worker (h % I) % W is not its owner h % W; the period is found by searching, not
    by a formula."""
    period = next(n for n in range(1, inputs * workers + 1) if n % inputs == 0 == n % workers)
    moved = sum(1 for h in range(period) if (h % inputs) % workers != h % workers)
    # and the same share over a longer stretch of hash values (any multiple of the period)
    stretch = 7 * inputs * workers
    assert Fraction(
        sum(1 for h in range(stretch) if (h % inputs) % workers != h % workers), stretch
    ) == Fraction(moved, period)
    return Fraction(moved, period)


@pytest.mark.parametrize("inputs", range(1, 13))
@pytest.mark.parametrize("workers", range(1, 9))
def test_forwarded_share_is_what_counting_hashes_gives(inputs: int, workers: int) -> None:
    assert forwarded_share(inputs, workers) == brute_force_share(inputs, workers)


def test_forwarded_share_examples() -> None:
    assert forwarded_share(3, 2) == Fraction(1, 2)  # h = 3, 4, 5 of 0..5 move
    assert forwarded_share(4, 2) == 0  # a multiple: nothing moves
    assert forwarded_share(2, 4) == Fraction(1, 2)
    assert forwarded_share(6, 4) == Fraction(1, 2)
    assert forwarded_share(5, 3) == Fraction(2, 3)
    assert forwarded_share(7, 7) == 0
    with pytest.raises(ValueError):
        forwarded_share(0, 2)


# --------------------------------------------------------------- under ownership
def test_any_input_partition_count_under_ownership() -> None:
    for inputs in (2, 3, 4, 12):
        check = check_topics(owned(inputs=inputs), 2, 672 * H)
        assert (check.ok, check.reason, check.partitions) == (True, "TopicFound", inputs), check
        assert check.ownership and not check.blocks
        assert "internal topic ns.p-owned has 3 partitions" in check.message


def test_a_multiple_needs_no_forwarding_else_a_warning_with_the_share() -> None:
    even = check_topics(owned(inputs=4), 2, H)
    assert even.ok and "needs no forwarding" in even.message and "warning" not in even.message
    uneven = check_topics(owned(inputs=3), 2, H)
    assert uneven.ok and uneven.reason == "TopicFound"
    assert "warning: 3 input partitions are not a multiple of 2 workers" in uneven.message
    assert "50.0% (1/2)" in uneven.message


def test_each_broken_internal_topic_setting_is_a_reason_with_the_numbers() -> None:
    cases = {
        "OwnedTopicMissing": (
            owned(owned_partitions=None),
            "internal topic ns.p-owned does not exist",
        ),
        "OwnedPartitionsTooFew": (
            owned(owned_partitions=2),
            "has 2 partitions, fewer than the 3 workers",
        ),
        "OwnedTopicCompacted": (
            owned(**{"cleanup.policy": "compact"}),
            "has cleanup.policy=compact",
        ),
        "OwnedRetentionLimited": (
            owned(**{"retention.ms": str(168 * H)}),
            "deletes records after 168h (retention.ms=604800000)",
        ),
        "OwnedRetentionBytes": (
            owned(**{"retention.bytes": "1073741824"}),
            "keeps at most 1073741824 bytes a partition",
        ),
        "OwnedTimestampType": (
            owned(**{"message.timestamp.type": "LogAppendTime"}),
            "message.timestamp.type=LogAppendTime",
        ),
        "OwnedMessageBytesTooSmall": (
            owned(**{"max.message.bytes": "1048588"}),
            "takes records up to 1048588 bytes (max.message.bytes), input topic in up to "
            f"1048588: a forwarded record with its headers may need 1048588 + {HEADER_ROOM}",
        ),
        "OwnedReplicationTooLow": (
            owned(owned_replication=1),
            "has replication factor 1, output topic out 3",
        ),
        "OwnedMinInsyncTooLow": (
            owned(**{"min.insync.replicas": "1"}),
            "has min.insync.replicas=1, output topic out 2",
        ),
        "OwnedUncleanElection": (
            owned(**{"unclean.leader.election.enable": "true"}),
            "unclean.leader.election.enable=true",
        ),
    }
    for reason, (given, says) in cases.items():
        check = check_topics(given, 3, 672 * H)
        assert (check.ok, check.reason) == (False, reason), (reason, check)
        assert says in check.message, (reason, check.message)
        # workers cannot start without the internal topic's partitions; the rest degrade
        assert check.blocks == (reason in ("OwnedTopicMissing", "OwnedPartitionsTooFew"))


def test_compact_with_delete_is_compaction_still() -> None:
    check = check_topics(owned(**{"cleanup.policy": "compact,delete"}), 3, H)
    assert check.reason == "OwnedTopicCompacted"


def test_a_larger_internal_limit_and_stronger_durability_are_fine() -> None:
    bigger = owned(
        owned_replication=5,
        **{"max.message.bytes": "9999999", "min.insync.replicas": "3"},
    )
    assert check_topics(bigger, 3, H).ok


def test_a_user_named_internal_topic_missing_says_how_to_create_it() -> None:
    check = check_topics(replace(owned(owned_partitions=None), owned_user_named=True), 3, H)
    assert check.reason == "OwnedTopicMissing" and check.blocks
    assert "create it (kafka.ownedTopic) with at least 3 partitions" in check.message
    assert "retention.ms=-1" in check.message


def test_unreadable_configs_are_said_never_assumed_fine() -> None:
    unread = TopicFacts("in", 3, "out", 3, {}, output_config_error="TOPIC_AUTHORIZATION_FAILED")
    check = check_topics(unread, 3, H, ownership=False)
    assert (check.ok, check.reason) == (False, "OutputConfigUnreadable")
    assert "DescribeConfigs" in check.message
    internal = replace(owned(), owned_config={}, owned_config_error="TOPIC_AUTHORIZATION_FAILED")
    check = check_topics(internal, 3, H)
    assert (check.ok, check.reason) == (False, "OwnedConfigUnreadable")
    assert "DescribeConfigs on it" in check.message
    no_input = replace(owned(), input_config={}, input_config_error="TOPIC_AUTHORIZATION_FAILED")
    check = check_topics(no_input, 3, H)
    assert (check.ok, check.reason) == (False, "InputConfigUnreadable")


def test_output_checks_hold_under_ownership_against_the_workers() -> None:
    check = check_topics(owned(outputs=2, **{}), 3, H)
    assert check.reason == "OutputPartitionsTooFew"
    assert "has 2 partitions, fewer than the 3 workers" in check.message
    short = replace(owned(), output_config={**GOOD, "retention.ms": str(H)})
    assert check_topics(short, 3, 24 * H).reason == "OutputRetentionTooShort"


def test_input_missing_blocks_every_worker() -> None:
    check = check_topics(owned(inputs=None), 3, H)
    assert (check.reason, check.blocks) == ("TopicMissing", True)


# ------------------------------------------------------------ the internal topic made
def test_internal_topic_settings_follow_the_input_and_the_output() -> None:
    made = owned_topic_settings(owned(owned_partitions=None), 4)
    assert made == OwnedTopicSettings(
        "ns.p-owned",
        partitions=4,
        replication=3,
        config={
            "cleanup.policy": "delete",
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "message.timestamp.type": "CreateTime",
            "max.message.bytes": str(1048588 + HEADER_ROOM),
            "unclean.leader.election.enable": "false",
            "min.insync.replicas": "2",
        },
    )
    # what it makes passes every check
    assert isinstance(made, OwnedTopicSettings)
    created = replace(
        owned(owned_partitions=None),
        owned_partitions=made.partitions,
        owned_replication=made.replication,
        owned_config=made.config,
    )
    assert check_topics(created, 4, H).reason == "OutputPartitionsTooFew"  # 3 of them
    assert check_topics(replace(created, output_partitions=4), 4, H).ok
    bigger_input = replace(
        owned(owned_partitions=None), input_config={"max.message.bytes": "5000000"}
    )
    made = owned_topic_settings(bigger_input, 4)
    assert isinstance(made, OwnedTopicSettings)
    assert made.config["max.message.bytes"] == str(5000000 + HEADER_ROOM)
    unset = replace(owned(owned_partitions=None), input_config={})
    made = owned_topic_settings(unset, 4)
    assert isinstance(made, OwnedTopicSettings)
    assert made.config["max.message.bytes"] == str(KAFKA_DEFAULT_MAX_MESSAGE_BYTES + HEADER_ROOM)


def test_internal_topic_is_not_made_from_what_is_unknown() -> None:
    assert "input topic does not exist" in str(owned_topic_settings(owned(None, inputs=None), 2))
    assert "output topic does not exist" in str(owned_topic_settings(owned(None, outputs=None), 2))
    unread = replace(owned(None), input_config_error="TOPIC_AUTHORIZATION_FAILED")
    assert "max.message.bytes" in str(owned_topic_settings(unread, 2))


# ------------------------------------------- a pipeline that ran before ownership
def test_topics_that_keep_the_window() -> None:
    ok = check_topics(facts(), 3, 672 * H, ownership=False)
    assert (ok.ok, ok.reason, ok.partitions) == (True, "TopicFound", 3)
    assert not ok.ownership
    assert check_topics(facts(**{"retention.ms": str(672 * H)}), 3, 672 * H, ownership=False).ok
    assert check_topics(facts(**{"retention.ms": str(700 * H)}), 3, 672 * H, ownership=False).ok
    assert check_topics(facts(), 3, None, ownership=False).ok  # maxKeys only, kept for ever
    wider = check_topics(facts(outputs=5), 3, H, ownership=False)
    assert wider.ok and "partitions 3..4 stay empty" in wider.message
    assert check_topics(facts(**{"cleanup.policy": "delete"}), 3, H, ownership=False).ok


def test_each_broken_precondition_is_a_reason_with_the_numbers() -> None:
    cases = {
        "TopicMissing": (facts(inputs=None), "input topic in does not exist"),
        "PartitionCountMismatch": (facts(inputs=2), "has 2 partitions, spec.partitions is 3"),
        "OutputTopicMissing": (facts(outputs=None), "output topic out does not exist"),
        "OutputPartitionsTooFew": (facts(outputs=2), "has 2 partitions, fewer than"),
        "OutputCompacted": (
            facts(**{"cleanup.policy": "compact,delete"}),
            "is compacted (cleanup.policy=compact,delete)",
        ),
        "OutputRetentionTooShort": (
            facts(**{"retention.ms": str(24 * H)}),
            "keeps records 24h (retention.ms=86400000), the window is 672h",
        ),
        "OutputRetentionBytes": (
            facts(**{"retention.bytes": "1073741824"}),
            "keeps at most 1073741824 bytes a partition",
        ),
    }
    for reason, (given, says) in cases.items():
        check = check_topics(given, 3, 672 * H, ownership=False)
        assert (check.ok, check.reason) == (False, reason), (reason, check)
        assert says in check.message, (reason, check.message)


def test_partition_count_mismatch_only_without_ownership() -> None:
    assert check_topics(owned(inputs=2), 3, H).ok
    assert check_topics(facts(inputs=2), 3, H, ownership=False).reason == "PartitionCountMismatch"


def test_a_window_without_duration_needs_the_output_kept_for_ever() -> None:
    check = check_topics(facts(**{"retention.ms": str(10_000 * H)}), 3, None, ownership=False)
    assert check.reason == "OutputRetentionTooShort"
    assert "no duration (maxKeys only)" in check.message and "retention.ms=-1" in check.message


def test_every_problem_is_named_the_first_is_the_reason() -> None:
    many = facts(inputs=2, outputs=2, **{"retention.ms": "1000", "cleanup.policy": "compact"})
    check = check_topics(many, 3, H, ownership=False)
    assert check.reason == "PartitionCountMismatch"
    for part in ("spec.partitions is 3", "fewer than", "compacted", "keeps records 1s"):
        assert part in check.message
    several = owned(
        owned_partitions=2, outputs=2, **{"retention.ms": "1000", "cleanup.policy": "compact"}
    )
    check = check_topics(several, 3, H)
    assert check.reason == "OutputPartitionsTooFew" and check.blocks
    for part in ("fewer than the 3 workers", "internal topic ns.p-owned has 2 partitions",
                 "cleanup.policy=compact", "retention.ms=1000"):  # fmt: skip
        assert part in check.message
