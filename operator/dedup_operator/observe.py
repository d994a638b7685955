"""The observe step of a reconcile pass: what it decides on, read once. It writes nothing.

- `observe_pipeline`: the spec (as the workers run it: `ownership_generation.decide`), the volume
  claims, the topics' check (the remembered one, read again every topic_check_s; an
  internal topic the operator is to create is reported, not created), the pods, the
  Leases, the Nodes with their heartbeats and the VolumeAttachments (watched:
  cache.py), the pods the taint of a lost node would evict, the scheduled audit's
  result, and what the process remembers of the pipeline (`memory.Recalled`);
- `observe_deleted`: what finalizing a deleted pipeline decides on;
- `read_topic_facts` / `topic_check`: how the topics are read and checked (the
  executor reads them again after it created the internal topic).

It owns what a pass observed (`PipelineObservation`, `InvalidSpec`, `DeletedPipeline`,
`AuditSeen`, `MissingOwnedTopic`), which `plan.py` decides on, and reads the cluster
only through `cluster_api.ClusterReads`.

Every Lease is seen through the process's `LeaseWatch`: its clock remembers when each
changed, which is how a Lease is known to have run out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from dedup_contract import names
from dedup_contract.handover import HandoverReason
from dedup_contract.kafka_settings import KafkaSettingsError, parse_kafka_settings
from dedup_operator import audit_status, ownership_generation, shared_kafka
from dedup_operator.actions import TopicQuery
from dedup_operator.cluster_api import ClusterReads
from dedup_operator.desired import scheduled_audit
from dedup_operator.desired.owner import Owner
from dedup_operator.failover import LeaseView, NodeView, PodView, ReleaseVolume
from dedup_operator.kafka_admin import read_topics
from dedup_operator.memory import LeaseWatch, PipelineMemory, Recalled
from dedup_operator.node_marks import taint_mark
from dedup_operator.observed import (
    Obj,
    lease_view,
    node_pod,
    node_view,
    pod_view,
    worker_lease_name,
)
from dedup_operator.ownership_generation import OwnershipState
from dedup_operator.settings import ReconcileSettings
from dedup_operator.spec import PipelineSpec, SpecError
from dedup_operator.topics import (
    OwnedTopicSettings,
    TopicCheck,
    TopicFacts,
    check_topics,
    owned_topic_settings,
)

log = logging.getLogger("dedup_operator.reconcile")


# ------------------------------------------------- what a pass observed (its types)
@dataclass(frozen=True)
class AuditSeen:
    """The scheduled audit's result as read: its ConfigMap (None: none yet) and the
    newest Spark operator run (name, state)."""

    config_map: Obj | None = None
    run: tuple[str, str] | None = None


@dataclass(frozen=True)
class MissingOwnedTopic:
    """The internal topic does not exist and the operator is to create it: how."""

    query: TopicQuery
    wanted: OwnedTopicSettings


@dataclass(frozen=True)
class PipelineObservation:
    """What one pass read of a pipeline and the cluster around it."""

    spec: PipelineSpec
    generation: int
    previous: Mapping[str, Any]  # the status as read at the pass's start
    claims: Mapping[str, Obj]  # PVC name -> PVC
    pods: Mapping[int, tuple[PodView, ...]]  # partition -> its worker pods
    leases: Mapping[str, LeaseView]  # Lease name -> view
    nodes: Mapping[str, NodeView]
    attachments: Sequence[Obj]  # the VolumeAttachments of its claims' volumes
    topic: TopicCheck
    # the ownership generation (dedup_operator.ownership_generation.decide); None: as a new pipeline
    ownership: OwnershipState | None = None
    # the memory key of `topic` when it was read in this pass (it is remembered then)
    topic_read: tuple[Any, ...] | None = None
    uid: str = ""  # the pipeline's: the owner of its objects
    finalizers: frozenset[str] = frozenset()  # the pipeline's, as read at the pass's start
    recalled: Recalled = field(default_factory=Recalled)
    owned_topic: MissingOwnedTopic | None = None  # to create before anything else
    spark_operator: bool = False  # the ScheduledSparkApplication CRD is installed
    audit: AuditSeen = field(default_factory=AuditSeen)
    # an older pipeline on the same Kafka cluster holds what this one needs
    # (dedup_operator.shared_kafka); None: nothing shared
    shared: TopicCheck | None = None

    @property
    def topic_ready(self) -> TopicCheck:
        """The TopicReady check the pass decides on: what is shared with an older
        pipeline when anything is, else the topics' own check (`topic`, the one
        remembered between passes)."""
        return self.shared if self.shared is not None else self.topic

    @property
    def owner(self) -> Owner:
        return Owner(self.spec.name, self.spec.namespace, self.uid)

    def previous_partition(self, p: int) -> Mapping[str, Any]:
        for entry in self.previous.get("partitions") or []:
            if int(entry["partition"]) == p:
                return entry  # type: ignore[no-any-return]
        return {}

    def volume_name(self, p: int) -> str | None:
        claim = self.claims.get(names.volume_claim(self.spec.name, p)) or {}
        return (claim.get("spec") or {}).get("volumeName")


@dataclass(frozen=True)
class InvalidSpec:
    """A pipeline whose spec does not parse, as one pass read it."""

    namespace: str
    name: str
    message: str
    generation: int
    previous: Mapping[str, Any]  # the status as read


@dataclass(frozen=True)
class DeletedPipeline:
    """What one pass read of a deleted pipeline that still carries our finalizers."""

    namespace: str
    name: str
    finalizers: frozenset[str]
    topic: str  # the internal topic the operator names for it
    marked_nodes: tuple[str, ...] = ()  # taints with our mark, or in status.taintedNodes
    workers: tuple[tuple[str, str | None], ...] = ()  # (name, uid) of pods not deleting
    held_leases: tuple[str, ...] = ()  # partition Leases not run out on our clock
    spec_error: str | None = None  # the spec does not parse
    settings_error: str | None = None  # the Kafka settings cannot be read
    bootstrap: str = ""
    kafka_settings: Mapping[str, str] | None = None


# ------------------------------------------------------------------ the pipeline


def observe_pipeline(
    kube: ClusterReads,
    body: Mapping[str, Any],
    memory: PipelineMemory,
    watch: LeaseWatch,
    settings: ReconcileSettings,
    reuse_topic_check: bool = False,
) -> PipelineObservation | InvalidSpec:
    """Everything the pass decides on, read once (the pipeline itself as read at the
    pass's start). `reuse_topic_check`: the remembered check whatever its age (the pass
    just created the internal topic and checked what it made)."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    generation = int(meta.get("generation") or 1)
    previous: Mapping[str, Any] = body.get("status") or {}
    try:
        asked = PipelineSpec.parse(name, namespace, body["spec"])
    except SpecError as exc:
        return InvalidSpec(namespace, name, str(exc), generation, previous)
    annotations = meta.get("annotations") or {}
    switch_asked = annotations.get(names.ANNOTATION_SWITCH_TO_OWNERSHIP) == "true"
    state = ownership_generation.decide(asked, previous, switch_asked)
    spec = state.spec  # as the workers run it: partitions = the recorded worker count
    claims = kube.volume_claims(namespace, name)
    topic, topic_read, missing = _topics(kube, spec, memory, settings, reuse_topic_check)
    raw_leases = kube.leases(namespace, name)
    nodes = _nodes(kube, spec, watch)
    pods = _worker_pods(kube, spec)
    nodes.update(_lost_nodes(kube, spec, previous, nodes, raw_leases, watch))
    spark_operator = spec.reconciliation is not None and kube.has_crd(
        scheduled_audit.SCHEDULED_SPARK_APPLICATION_CRD
    )
    return PipelineObservation(
        spec=spec,
        generation=generation,
        previous=previous,
        claims=claims,
        pods=pods,
        leases=_partition_leases(kube, namespace, raw_leases, watch),
        nodes=nodes,
        attachments=kube.volume_attachments(
            (c.get("spec") or {}).get("volumeName") for c in claims.values()
        ),
        topic=topic,
        topic_read=topic_read,
        ownership=state,
        uid=meta["uid"],
        finalizers=frozenset(meta.get("finalizers") or []),
        recalled=memory.recalled(time.monotonic()),
        owned_topic=missing,
        spark_operator=spark_operator,
        audit=_audit_seen(kube, spec, spark_operator),
        shared=_shared(kube, body, settings),
    )


def _shared(
    kube: ClusterReads, body: Mapping[str, Any], settings: ReconcileSettings
) -> TopicCheck | None:
    """What an older pipeline in the watched namespaces holds on the same Kafka cluster
    that this one needs (from the pipelines' watch: no request per pass)."""
    me = shared_kafka.claims_of(body)
    if me is None:
        return None
    others = _CLAIMS.claims(kube.pipelines(settings.namespaces))
    return shared_kafka.shared_with_older(me, others)


_CLAIMS = shared_kafka.ClaimsMemo()  # the watched pipelines' claims, between passes


def _partition_leases(
    kube: ClusterReads, namespace: str, raw: Mapping[str, Any], watch: LeaseWatch
) -> dict[str, LeaseView]:
    """The pipeline's Leases as the Lease clock has seen them. Read from a watch, a
    Lease's unchanged time counts from the watch's unbroken start at most
    (`lease_clock.ContinuousView`'s rule): across a gap nobody may have been able to
    renew it (the API server down)."""
    views = {n: lease_view(o, watch.lease_clock) for n, o in raw.items()}
    since = kube.leases_watched_since(namespace)
    if since is None:
        return views
    watched_for = timedelta(seconds=max(0.0, time.monotonic() - since))
    return {
        n: replace(v, unchanged_for=min(v.unchanged_for, watched_for)) for n, v in views.items()
    }


def _nodes(kube: ClusterReads, spec: PipelineSpec, watch: LeaseWatch) -> dict[str, NodeView]:
    """Every Node with its heartbeat Lease (None: unreadable, the Ready condition
    decides), judged lost after the pipeline's nodeLostAfter (as judged for any pipeline
    of that nodeLostAfter in the last `memory.NODE_VIEWS_S`)."""
    lost_after = spec.failover.node_lost_after
    return watch.node_views(
        lost_after,
        lambda: _judge_nodes(kube, lost_after, watch),
        time.monotonic(),
        kube.node_writes,
    )


def _judge_nodes(
    kube: ClusterReads, lost_after: timedelta, watch: LeaseWatch
) -> dict[str, NodeView]:
    heartbeats = kube.node_leases()
    watched_for = None
    if heartbeats is not None:
        watched_for = watch.heartbeats_watched_for(kube.heartbeats_watched_since())
    views = (
        node_view(
            o,
            None if heartbeats is None else heartbeats.get(o["metadata"]["name"]),
            watch.lease_clock,
            lost_after,
            watched_for,
        )
        for o in kube.nodes()
    )
    return {n.name: n for n in views}


def _worker_pods(kube: ClusterReads, spec: PipelineSpec) -> dict[int, tuple[PodView, ...]]:
    """The pipeline's worker pods by partition (by their names)."""
    pods: dict[int, list[PodView]] = {}
    for raw in kube.pods(spec.namespace, spec.name):
        parsed = names.parse_worker_pod(raw["metadata"]["name"])
        if parsed is None or parsed[0] != spec.name:
            continue
        pods.setdefault(parsed[1], []).append(pod_view(raw, parsed[2], names.ANNOTATION_SPEC_HASH))
    return {p: tuple(views) for p, views in pods.items()}


def _lost_nodes(
    kube: ClusterReads,
    spec: PipelineSpec,
    previous: Mapping[str, Any],
    nodes: Mapping[str, NodeView],
    raw_leases: Mapping[str, Any],
    watch: LeaseWatch,
) -> dict[str, NodeView]:
    """A lost node this pipeline may taint, with the pods the taint would evict."""
    if spec.failover.release_volume != ReleaseVolume.OUT_OF_SERVICE_TAINT:
        return {}
    looked: dict[str, NodeView] = {}
    for entry in previous.get("partitions") or []:
        h_prev = entry.get("handover") or {}
        lost = looked.get(h_prev.get("fromNode") or "") or nodes.get(h_prev.get("fromNode") or "")
        if (
            h_prev.get("reason") == HandoverReason.NODE_LOST.value
            and lost is not None
            and lost.pods is None
            and not lost.up
            and not lost.out_of_service
        ):
            looked[lost.name] = _lost_node_pods(kube, lost, raw_leases, spec.namespace, watch)
    return looked


def _lost_node_pods(
    kube: ClusterReads,
    node: NodeView,
    leases: Mapping[str, Any],
    namespace: str,
    watch: LeaseWatch,
) -> NodeView:
    """The node with the pods bound to it (what the out-of-service taint would evict);
    each dedup worker with its Lease. Pods unreadable: left unknown (no taint)."""
    try:
        raw = kube.pods_on_node(node.name)
    except Exception as exc:  # e.g. no RBAC to list pods in every namespace
        log.warning("cannot list the pods on node %s: %s", node.name, exc)
        return node
    pods = []
    for pod in raw:
        lease_name = worker_lease_name(pod)
        if lease_name is None:
            pods.append(node_pod(pod))
            continue
        ns = pod["metadata"].get("namespace")
        try:
            if ns == namespace and lease_name in leases:
                lease = leases[lease_name]
            else:  # another pipeline's worker: its own Lease
                lease = kube.lease(ns, lease_name)
        except Exception as exc:  # unreadable: counted as another workload
            log.warning("cannot read Lease %s/%s: %s", ns, lease_name, exc)
            pods.append(node_pod(pod))
            continue
        pods.append(node_pod(pod, lease, worker=True, clock=watch.lease_clock))
    return replace(node, pods=tuple(pods))


def _audit_seen(kube: ClusterReads, spec: PipelineSpec, spark_operator: bool) -> AuditSeen:
    """The scheduled audit's result ConfigMap and the newest Spark operator run."""
    if spec.reconciliation is None:
        return AuditSeen()
    config_map = kube.config_map(spec.namespace, names.reconciliation_result(spec.name))
    run = None
    if scheduled_audit.uses_spark_operator(spec, spark_operator):
        apps = kube.spark_applications(spec.namespace, names.reconciliation_job(spec.name))
        run = audit_status.newest_spark_application(apps)
    return AuditSeen(config_map, run)


# ----------------------------------------------------------------- topics
def kafka_settings_of(kube: ClusterReads, spec: PipelineSpec) -> dict[str, str] | TopicCheck:
    """The operator's librdkafka settings for the pipeline's Kafka (the spec's, then the
    Secret's), or SecretMissing, or SecretInvalid (an entry that is not `key=value`)."""
    kafka_settings = dict(spec.kafka.config)
    ref = spec.kafka.security_ref
    if ref is not None:
        secret = kube.secret_value(spec.namespace, ref.secret_name, ref.key)
        if secret is None:
            return TopicCheck(
                False, "SecretMissing", f"Secret {ref.secret_name} (key {ref.key}) not found"
            )
        try:
            kafka_settings.update(parse_kafka_settings(secret))
        except KafkaSettingsError as invalid:  # the workers refuse it too: say which entry
            return TopicCheck(
                False,
                "SecretInvalid",
                f"Secret {ref.secret_name} (key {ref.key}): entry {invalid.position} is not "
                "key=value (not shown: it may hold a credential)",
            )
    return kafka_settings


def _memory_key(spec: PipelineSpec) -> tuple[Any, ...]:
    """The spec fields a remembered topic check holds for."""
    return (
        spec.kafka.bootstrap_servers,
        spec.kafka.input_topic,
        spec.kafka.output_topic,
        spec.window.duration,
        spec.partitions,
        spec.kafka.config,
        spec.kafka.security_ref,
        spec.ownership,
        spec.kafka.owned_topic,
    )


def topic_query(spec: PipelineSpec, kafka_settings: Mapping[str, str]) -> TopicQuery:
    return TopicQuery(
        bootstrap=spec.kafka.bootstrap_servers,
        kafka_settings=kafka_settings,
        input_topic=spec.kafka.input_topic,
        output_topic=spec.kafka.output_topic,
        owned_topic=spec.owned_topic if spec.ownership else None,
        owned_user_named=spec.kafka.owned_topic is not None,
        partitions=spec.partitions,
        window_ms=spec.window.duration_ms,
        ownership=spec.ownership,
        memory_key=_memory_key(spec),
    )


def read_topic_facts(query: TopicQuery) -> TopicFacts | TopicCheck:
    return read_topics(
        query.bootstrap,
        query.kafka_settings,
        query.input_topic,
        query.output_topic,
        owned_topic=query.owned_topic,
        owned_user_named=query.owned_user_named,
    )


def topic_check(query: TopicQuery, facts: TopicFacts | TopicCheck) -> TopicCheck:
    if isinstance(facts, TopicCheck):
        return facts
    return check_topics(facts, query.partitions, query.window_ms, ownership=query.ownership)


def _topics(
    kube: ClusterReads,
    spec: PipelineSpec,
    memory: PipelineMemory,
    settings: ReconcileSettings,
    reuse: bool,
) -> tuple[TopicCheck, tuple[Any, ...] | None, MissingOwnedTopic | None]:
    """(the topics' check; its memory key when it was read in this pass, to be
    remembered for topic_check_s, None when it is the remembered one; the internal
    topic when the pipeline's workers own ids, the operator names the topic and it does
    not exist yet: the act step creates it and remembers the check of what it made)."""
    key = _memory_key(spec)
    remembered = memory.topic
    if (
        remembered is not None
        and remembered[0] == key
        and (reuse or time.monotonic() - remembered[1] < settings.topic_check_s)
    ):
        return remembered[2], None, None
    kafka_settings = kafka_settings_of(kube, spec)
    if isinstance(kafka_settings, TopicCheck):
        return kafka_settings, key, None
    query = topic_query(spec, kafka_settings)
    facts = read_topic_facts(query)
    if (
        isinstance(facts, TopicFacts)
        and spec.creates_owned_topic
        and facts.owned_partitions is None
    ):
        wanted = owned_topic_settings(facts, spec.workers)
        if isinstance(wanted, OwnedTopicSettings):
            return topic_check(query, facts), None, MissingOwnedTopic(query, wanted)
        if facts.input_partitions is not None and facts.output_partitions is not None:
            facts = replace(facts, owned_why=f"not created: {wanted}")
    return topic_check(query, facts), key, None


# ----------------------------------------------------------- deleted pipeline
def observe_deleted(
    kube: ClusterReads, body: Mapping[str, Any], watch: LeaseWatch
) -> DeletedPipeline:
    """What finalizing a deleted pipeline decides on: the nodes whose out-of-service
    taint carries its mark (or that status.taintedNodes lists); for its internal topic,
    its workers, the partition Leases not yet run out on the operator's clock, and the
    Kafka settings to delete the topic with (read once no Lease is held)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    finalizers = frozenset(meta.get("finalizers") or [])
    seen = DeletedPipeline(namespace, name, finalizers, names.owned_topic(namespace, name))
    if names.FINALIZER_TAINTS in finalizers:
        listed = set((body.get("status") or {}).get("taintedNodes") or [])
        marked = set(kube.nodes_marked_by(taint_mark(namespace, name)))
        seen = replace(seen, marked_nodes=tuple(sorted(listed | marked)))
    if names.FINALIZER_OWNED_TOPIC not in finalizers:
        return seen
    workers = tuple(
        (pod["metadata"]["name"], pod["metadata"].get("uid"))
        for pod in kube.pods(namespace, name)
        if not pod["metadata"].get("deletionTimestamp")
    )
    held = tuple(
        lease_name
        for lease_name, lease in kube.leases(namespace, name).items()
        if not lease_view(lease, watch.lease_clock).expired()
    )
    seen = replace(seen, workers=workers, held_leases=held)
    if held:
        return seen
    return replace(seen, **_kafka_of_deleted(kube, namespace, name, body))


def _kafka_of_deleted(
    kube: ClusterReads, namespace: str, name: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    try:
        spec = PipelineSpec.parse(name, namespace, body["spec"])
    except SpecError as exc:  # cannot happen for a spec the topic was created from
        return {"spec_error": str(exc)}
    kafka_settings = kafka_settings_of(kube, spec)
    if isinstance(kafka_settings, TopicCheck):
        return {"settings_error": kafka_settings.message}
    return {"bootstrap": spec.kafka.bootstrap_servers, "kafka_settings": kafka_settings}
