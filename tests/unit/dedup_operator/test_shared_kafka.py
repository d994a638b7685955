"""What two pipelines on one Kafka cluster must not share (dedup_operator.shared_kafka):
the younger is refused what the older holds, and only that."""

from __future__ import annotations

from typing import Any

from dedup_contract import names
from dedup_operator.shared_kafka import ClaimsMemo, claims_of, cluster_of, shared_with_older


def body(ns: str, name: str, created: str, **kafka: str) -> dict[str, Any]:
    spec = {
        "bootstrapServers": "kafka-0:9092,kafka-1:9092",
        "inputTopic": "events",
        "outputTopic": f"{ns}-{name}-out",
        **kafka,
    }
    meta = {"namespace": ns, "name": name, "creationTimestamp": created}
    return {"metadata": meta, "spec": {"kafka": spec}}


OLD, NEW = "2026-11-25T09:00:00Z", "2026-11-26T10:00:00Z"


def verdict(me: dict[str, Any], *others: dict[str, Any]) -> tuple[str, str] | None:
    mine = claims_of(me)
    assert mine is not None
    found = shared_with_older(mine, [c for c in map(claims_of, (me, *others)) if c])
    return None if found is None else (found.reason, found.message)


def test_the_same_name_in_two_namespaces_shares_the_default_group_on_one_input() -> None:
    older, younger = body("billing", "events", OLD), body("analytics", "events", NEW)
    found = verdict(younger, older)
    assert found is not None and found[0] == "ConsumerGroupShared"
    assert f"consumer group {names.default_consumer_group('events')}" in found[1]
    assert "billing/events" in found[1]
    assert verdict(older, younger) is None, "the older one keeps it"


def test_a_group_of_its_own_or_another_input_topic_or_cluster_shares_nothing() -> None:
    older = body("billing", "events", OLD)
    assert verdict(body("analytics", "events", NEW, consumerGroup="own"), older) is None
    assert verdict(body("analytics", "events", NEW, inputTopic="clicks"), older) is None
    other_cluster = body("analytics", "events", NEW, bootstrapServers="kafka-2.other:9092")
    assert verdict(other_cluster, older) is None


def test_one_cluster_is_recognised_by_any_broker_it_shares_case_and_order_aside() -> None:
    assert cluster_of(" Kafka-1:9092 ,kafka-0:9092") == cluster_of("kafka-0:9092,kafka-1:9092")
    older = body("billing", "events", OLD)
    younger = body("analytics", "events", NEW, bootstrapServers="KAFKA-1:9092")
    assert verdict(younger, older) is not None


def test_an_output_topic_shared_is_refused_to_the_younger() -> None:
    # other names: other default groups, so only the output is shared
    older = body("billing", "a", OLD, outputTopic="out")
    found = verdict(body("x", "b", NEW, outputTopic="out"), older)
    assert found is not None and found[0] == "OutputTopicShared"
    assert found[1].startswith("output topic out is already used by pipeline billing/a ")
    assert "kafka.outputTopic cannot change: delete this pipeline" in found[1]
    assert verdict(older, body("x", "b", NEW, outputTopic="out")) is None


def test_a_topic_one_writes_as_internal_topic_the_other_writes_is_refused() -> None:
    # the default internal topic names the namespace and the pipeline
    older = body("billing", "a", OLD, outputTopic="out")
    found = verdict(body("x", "b", NEW, outputTopic="billing.a-owned"), older)
    assert found is not None and found[0] == "OwnedTopicShared"
    assert "output topic billing.a-owned (as its internal topic)" in found[1]
    found = verdict(body("x", "b", NEW, ownedTopic="out"), older)
    assert found is not None and found[0] == "OwnedTopicShared"
    assert "internal topic out (as its output topic)" in found[1]
    assert "kafka.ownedTopic cannot change" in found[1]
    named = body("billing", "a", OLD, ownedTopic="forwarded")
    found = verdict(body("x", "b", NEW, ownedTopic="forwarded"), named)
    assert found is not None and found[0] == "OwnedTopicShared"
    assert "internal topic forwarded (as its internal topic)" in found[1]


def test_a_chain_of_pipelines_and_a_shared_dead_letter_topic_share_nothing() -> None:
    # the younger reads the older's output: a chain, each writing its own topics
    older = body("billing", "a", OLD, inputTopic="raw", outputTopic="clean")
    assert verdict(body("x", "b", NEW, inputTopic="clean", outputTopic="cleaner"), older) is None
    older = body("billing", "a", OLD, outputTopic="out-a", deadLetterTopic="dlq")
    assert verdict(body("x", "b", NEW, outputTopic="out-b", deadLetterTopic="dlq"), older) is None


def test_equal_creation_times_are_ordered_by_namespace_and_name() -> None:
    a, b = body("a", "events", OLD), body("b", "events", OLD)
    assert verdict(a, b) is None
    assert verdict(b, a) is not None


def test_a_pipeline_being_deleted_or_without_kafka_holds_nothing() -> None:
    gone = body("billing", "events", OLD)
    gone["metadata"]["deletionTimestamp"] = NEW
    assert claims_of(gone) is None
    assert claims_of({"metadata": {"name": "x", "namespace": "y"}, "spec": {}}) is None
    assert verdict(body("analytics", "events", NEW), gone) is None


def versioned(b: dict[str, Any], version: str) -> dict[str, Any]:
    return {**b, "metadata": {**b["metadata"], "resourceVersion": version}}


def test_the_memo_gives_what_claims_of_gives() -> None:
    bodies = [versioned(body("a", f"p{i}", OLD), str(i + 1)) for i in range(5)]
    deleted = versioned(body("a", "gone", OLD), "9")
    deleted["metadata"]["deletionTimestamp"] = NEW
    memo = ClaimsMemo()
    expected = [claims_of(b) for b in bodies]
    assert memo.claims([*bodies, deleted]) == expected
    assert memo.claims([*bodies, deleted]) == expected


def test_the_memo_reads_a_pipeline_again_only_at_a_new_resource_version() -> None:
    memo = ClaimsMemo()
    first = versioned(body("a", "p", OLD), "7")
    assert [c.output_topic for c in memo.claims([first])] == ["a-p-out"]
    # the same version with another body: not read again (the API server never serves it)
    same_version = versioned(body("a", "p", OLD, outputTopic="other"), "7")
    assert [c.output_topic for c in memo.claims([same_version])] == ["a-p-out"]
    changed = versioned(body("a", "p", OLD, outputTopic="other"), "8")
    assert [c.output_topic for c in memo.claims([changed])] == ["other"]


def test_the_memo_forgets_pipelines_gone_and_reads_unversioned_bodies_each_time() -> None:
    memo = ClaimsMemo()
    memo.claims([versioned(body("a", "p", OLD), "7")])
    assert memo.claims([]) == []
    unversioned = body("a", "q", OLD)
    assert [c.name for c in memo.claims([unversioned])] == ["q"]
    unversioned["spec"]["kafka"]["outputTopic"] = "moved"
    assert [c.output_topic for c in memo.claims([unversioned])] == ["moved"]
