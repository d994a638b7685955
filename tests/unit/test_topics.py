"""The topics' preconditions of the guarantee (dedup_operator.topics.check_topics)."""

from __future__ import annotations

from dedup_operator.topics import TopicFacts, check_topics

H = 3_600_000
GOOD = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}


def facts(inputs: int | None = 3, outputs: int | None = 3, **config: str) -> TopicFacts:
    return TopicFacts("in", inputs, "out", outputs, {**GOOD, **config})


def test_topics_that_keep_the_window() -> None:
    ok = check_topics(facts(), 3, 672 * H)
    assert (ok.ok, ok.reason, ok.partitions) == (True, "TopicFound", 3)
    assert check_topics(facts(**{"retention.ms": str(672 * H)}), 3, 672 * H).ok  # exactly
    assert check_topics(facts(**{"retention.ms": str(700 * H)}), 3, 672 * H).ok
    assert check_topics(facts(), 3, None).ok  # maxKeys only, kept for ever
    wider = check_topics(facts(outputs=5), 3, H)
    assert wider.ok and "partitions 3..4 stay empty" in wider.message
    assert check_topics(facts(**{"cleanup.policy": "delete"}), 3, H).ok


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
        check = check_topics(given, 3, 672 * H)
        assert (check.ok, check.reason) == (False, reason), (reason, check)
        assert says in check.message, (reason, check.message)


def test_a_window_without_duration_needs_the_output_kept_for_ever() -> None:
    check = check_topics(facts(**{"retention.ms": str(10_000 * H)}), 3, None)
    assert check.reason == "OutputRetentionTooShort"
    assert "no duration (maxKeys only)" in check.message and "retention.ms=-1" in check.message


def test_every_problem_is_named_the_first_is_the_reason() -> None:
    many = facts(inputs=2, outputs=2, **{"retention.ms": "1000", "cleanup.policy": "compact"})
    check = check_topics(many, 3, H)
    assert check.reason == "PartitionCountMismatch"
    for part in ("spec.partitions is 3", "fewer than", "compacted", "keeps records 1s"):
        assert part in check.message


def test_unreadable_configs_are_said_never_assumed_fine() -> None:
    unread = TopicFacts("in", 3, "out", 3, {}, output_config_error="TOPIC_AUTHORIZATION_FAILED")
    check = check_topics(unread, 3, H)
    assert (check.ok, check.reason) == (False, "OutputConfigUnreadable")
    assert "DescribeConfigs" in check.message
