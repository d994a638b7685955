"""What a pipeline must not share with another pipeline on the same Kafka cluster (pure).

Each id is published once only while a pipeline's workers are alone:
- **with their consumer group's position on their input topic.** Committed offsets are
  kept per group, topic and partition, so two pipelines of one group on one input topic
  move each other's position and each skips what the other read. The default group,
  `dedup-<pipeline>`, does not name the namespace: two pipelines of the same name in two
  namespaces share it.
- **on the topics they write.** A store is caught up and rebuilt from its output's owner
  partition, so another pipeline's records in the output would be taken for ids this one
  published (and this one's, in the other's, for the other's): each would skip ids it
  never published. The internal topic (`kafka.ownedTopic`, else `<namespace>.<pipeline>
  -owned`) is read by the owners as their own forwarded records. So no topic one pipeline
  writes (output, internal) may be a topic another writes. Reading another's output as
  an input (a chain of pipelines) is fine, and so is a shared dead-letter topic.

Of two pipelines that would share one of these, the one created first keeps it: the
other's TopicReady is False (`ConsumerGroupShared`, `OutputTopicShared` or
`OwnedTopicShared`, naming the older), and no worker of it starts (workers already
running are not stopped, as for a missing topic).

Kafka clusters are told apart by `kafka.bootstrapServers` as written (the set of
host:port, case and order aside); two lists naming the same cluster by different brokers
are not recognised, nor is a pipeline outside the operator's watch (another operator's
namespaces) or a program of its own writing to the output.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from dedup_contract import names
from dedup_operator.topics import TopicCheck

# TopicReady's reasons for what an older pipeline holds
SHARED_REASONS: Final = frozenset({"ConsumerGroupShared", "OutputTopicShared", "OwnedTopicShared"})


@dataclass(frozen=True, order=True)
class KafkaClaims:
    """What one pipeline holds on its Kafka cluster; ordered by age (the creation time,
    then namespace and name: RFC 3339 times in UTC sort as times)."""

    created: str
    namespace: str
    name: str
    cluster: frozenset[str]
    group: str
    input_topic: str
    output_topic: str
    owned_topic: str  # the internal topic it writes under ownership (named, or its own)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def cluster_of(bootstrap_servers: str) -> frozenset[str]:
    """A Kafka cluster as `kafka.bootstrapServers` names it: its host:port entries,
    lowercased, in any order."""
    return frozenset(s.strip().lower() for s in bootstrap_servers.split(",") if s.strip())


def claims_of(body: Mapping[str, Any]) -> KafkaClaims | None:
    """A DedupPipeline's claims from its body as the API serves it, with the same
    defaults as its spec; None for one being deleted or without a readable kafka
    section (the API server's schema requires one; it would fail its own pass)."""
    meta = body.get("metadata") or {}
    kafka = (body.get("spec") or {}).get("kafka")
    if meta.get("deletionTimestamp") or not isinstance(kafka, Mapping):
        return None
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    try:
        return KafkaClaims(
            created=str(meta.get("creationTimestamp") or ""),
            namespace=namespace,
            name=name,
            cluster=cluster_of(str(kafka["bootstrapServers"])),
            group=str(kafka.get("consumerGroup") or names.default_consumer_group(name)),
            input_topic=str(kafka["inputTopic"]),
            output_topic=str(kafka["outputTopic"]),
            owned_topic=str(kafka.get("ownedTopic") or names.owned_topic(namespace, name)),
        )
    except KeyError:
        return None


class ClaimsMemo:
    """`claims_of` each watched pipeline, read once per resourceVersion: every pass reads
    every pipeline's claims, which at 100 pipelines (a pass each every 0.3 s) made the
    reading itself a share of the operator's CPU growing with the square of the count.
    Holds the pipelines of the last call only; thread-safe (passes run on a pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str, str], KafkaClaims | None] = {}

    def claims(self, bodies: Iterable[Mapping[str, Any]]) -> list[KafkaClaims]:
        """The claims of `bodies` (None ones left out), as `claims_of` gives them. A body
        without a resourceVersion (not from the API server) is read every time."""
        with self._lock:
            held = self._held
        kept: dict[tuple[str, str, str], KafkaClaims | None] = {}
        found: list[KafkaClaims] = []
        for body in bodies:
            meta = body.get("metadata") or {}
            version = meta.get("resourceVersion")
            if not version:
                claims = claims_of(body)
            else:
                key = (str(meta.get("namespace") or ""), str(meta.get("name")), str(version))
                claims = held[key] if key in held else claims_of(body)
                kept[key] = claims
            if claims is not None:
                found.append(claims)
        with self._lock:
            self._held = kept
        return found


def shared_with_older(me: KafkaClaims, others: Iterable[KafkaClaims]) -> TopicCheck | None:
    """The failing TopicReady check when a pipeline created before `me` on the same Kafka
    cluster holds what `me` needs (the oldest such pipeline is named); None when none
    does."""
    for other in sorted(others):
        if other >= me or (other.namespace, other.name) == (me.namespace, me.name):
            continue
        if not other.cluster & me.cluster:
            continue
        found = _what_is_shared(me, other)
        if found is not None:
            reason, what, remedy = found
            return TopicCheck(
                False,
                reason,
                f"{what} is already used by pipeline {other.ref} (created {other.created}) "
                f"on the same Kafka cluster: each id would not be published once; "
                f"{remedy} (no worker starts until then)",
                blocks=True,
            )
    return None


def _what_is_shared(me: KafkaClaims, other: KafkaClaims) -> tuple[str, str, str] | None:
    """(reason, what is shared, how to stop sharing it), or None."""
    if me.group == other.group and me.input_topic == other.input_topic:
        return (
            "ConsumerGroupShared",
            f"consumer group {me.group} on input topic {me.input_topic}",
            "set kafka.consumerGroup to a group of its own",
        )
    if me.output_topic == other.output_topic:
        return "OutputTopicShared", f"output topic {me.output_topic}", _recreate("outputTopic")
    theirs = {other.output_topic: "output topic", other.owned_topic: "internal topic"}
    mine = {
        me.output_topic: ("output topic", "outputTopic"),
        me.owned_topic: ("internal topic", "ownedTopic"),
    }
    for topic, (what, field) in mine.items():
        if topic in theirs:
            return "OwnedTopicShared", f"{what} {topic} (as its {theirs[topic]})", _recreate(field)
    return None


def _recreate(field: str) -> str:
    """The way out when a topic is shared: the topics are immutable (the CRD's rules)."""
    return (
        f"kafka.{field} cannot change: delete this pipeline and create it again with a "
        f"topic of its own"
    )
