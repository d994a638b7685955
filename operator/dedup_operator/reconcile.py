"""One level-based reconcile pass over a DedupPipeline: observe → decide → act → report.

- observe (`_observe`): the pipeline's pods, Leases and PVCs, the input topic (cached),
  and the cluster's Nodes, node heartbeats and VolumeAttachments (watched: cache.py);
- decide (`plan.plan_pass`, pure): every partition with `failover.partition_action`, and
  what must be persisted first;
- act (`_act`): the handover records (and nodes about to be tainted) into status
  *before* any action, then each action with its Events;
- report (`_report`): the status, with counters scraped from the workers' /metrics.

Running it twice changes nothing; an operator killed anywhere resumes from the cluster's
state.

Optimistic concurrency: every write to the pipeline (status, its finalizer) carries the
resourceVersion the pass read at its start (then that of its own last write), so a pass
whose pipeline was changed meanwhile — by a successor leader above all — writes nothing
(`Conflict`: re-read and re-decided next pass). The caller runs the pass inside
`Kube.acting(leader.is_leader)`: each mutating call re-checks leadership first
(`NotLeader`), so a replica paused past its leadership (SIGSTOP, a long GC, a frozen VM)
does not carry on with a stale decision.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from dedup_operator import audit_result, metrics, names, ownership
from dedup_operator.desired import audit as desired_audit
from dedup_operator.desired import partition as desired_partition
from dedup_operator.desired.owner import Owner
from dedup_operator.desired.pipeline import disruption_budget, pipeline_objects, role
from dedup_operator.failover import (
    BeginHandover,
    CompleteHandover,
    CreateLease,
    CreatePod,
    DeletePods,
    FenceLease,
    HandoverReason,
    NodeView,
    PodView,
    ReleaseVolume,
    TaintOutOfService,
)
from dedup_operator.kube import (
    Conflict,
    Kube,
    NotLeader,
    create_topic,
    delete_topic,
    parse_kafka_settings,
    read_topics,
    scrape,
    worker_counters,
)
from dedup_operator.observed import (
    lease_view,
    node_pod,
    node_view,
    pod_view,
    worker_lease_name,
)
from dedup_operator.plan import (
    PipelineObservation,
    Plan,
    WorkerCounters,
    pipeline_status,
    plan_pass,
    taint_mark,
)
from dedup_operator.spec import PipelineSpec, SpecError, quantity
from dedup_operator.status import Condition, merge_conditions
from dedup_operator.topics import (
    OwnedTopicSettings,
    TopicCheck,
    TopicFacts,
    check_topics,
    owned_topic_settings,
)
from dedup_worker import faults
from dedup_worker.lease_clock import ContinuousView, LeaseClock

log = logging.getLogger("dedup_operator.reconcile")


class Recorder(Protocol):
    """(type "Normal"|"Warning", reason, message) -> an Event on the pipeline and a log
    line; `error`: the pipeline cannot keep its promise (its log line is ERROR)."""

    def __call__(self, type_: str, reason: str, message: str, error: bool = False) -> None: ...


@dataclass
class ReconcileSettings:
    interval_s: float = 5.0
    topic_check_s: float = 30.0  # how often the input topic is re-checked
    ensure_s: float = 30.0  # how often per-pipeline objects are re-checked
    scrape_timeout_s: float = 1.0


@dataclass
class _Memory:
    """What one operator process remembers between passes (all of it re-derivable)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    uid: str | None = None
    ensured: tuple[int, float] | None = None  # (generation, monotonic time)
    topic: tuple[tuple[Any, ...], float, TopicCheck] | None = None
    audit_error: str | None = None  # the last unreadable-summary message (said once)
    next_pass_in: float | None = None  # the last pass's plan: when the next one is due
    switch_ignored: bool = False  # the ignored switch annotation was told (once)


_memories: dict[tuple[str, str], _Memory] = {}
_memories_lock = threading.Lock()

# When this operator process saw each Lease (partitions', nodes') change, on its monotonic
# clock: a Lease has run out once unchanged for its duration (dedup_worker.lease_clock).
# A restarted operator starts empty, so every held Lease is fresh at first sight: it waits
# a full duration (nodeLostAfter for a node) before acting on one. Safe, and that slow.
_lease_clock = LeaseClock()
# Since when this process has seen the node heartbeats without a gap: a heartbeat is
# never older than that (after a control-plane outage no node is to blame for the
# renewals nobody could write). Without a watch, reads more than HEARTBEAT_GAP_S apart
# break the view.
HEARTBEAT_GAP_S = 15.0
_heartbeat_view = ContinuousView(HEARTBEAT_GAP_S)


def _memory(namespace: str, name: str) -> _Memory:
    with _memories_lock:
        return _memories.setdefault((namespace, name), _Memory())


def next_pass_in(namespace: str, name: str) -> float | None:
    """When the pipeline's next pass is due (seconds; None: the regular interval), as
    its last pass's plan said (`Plan.next_pass_in`)."""
    with _memories_lock:
        memory = _memories.get((namespace, name))
    return memory.next_pass_in if memory is not None else None


def forget(namespace: str, name: str) -> None:
    with _memories_lock:
        _memories.pop((namespace, name), None)


def reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    recorder: Callable[[Mapping[str, Any]], Recorder],
    settings: ReconcileSettings,
) -> dict[str, Any] | None:
    """One pass over pipeline namespace/name; returns the status written (None if the
    pipeline is gone or being deleted). Passes over one pipeline never overlap, and
    each reads the pipeline afresh inside its turn: the handover records the previous
    pass wrote are always seen."""
    memory = _memory(namespace, name)
    with memory.lock, metrics.RECONCILE_SECONDS.time():
        body = kube.pipeline(namespace, name)
        if body is None:
            return None
        if body["metadata"].get("deletionTimestamp"):
            if set(body["metadata"].get("finalizers") or []) & OUR_FINALIZERS:
                finalize(kube, body, recorder(body))
            return None
        if memory.uid != body["metadata"]["uid"]:  # a new pipeline of the same name
            memory.uid, memory.ensured, memory.topic = body["metadata"]["uid"], None, None
            memory.switch_ignored = False
        try:
            status = _reconcile(kube, body, recorder(body), settings, memory)
        except (Conflict, NotLeader) as exc:
            result = "conflict" if isinstance(exc, Conflict) else "not-leader"
            log.info("pass over %s/%s abandoned: %s", namespace, name, exc)
            metrics.RECONCILES.labels(namespace, name, result).inc()
            return None
        except Exception:
            metrics.RECONCILES.labels(namespace, name, "error").inc()
            raise
        metrics.RECONCILES.labels(namespace, name, status["_result"]).inc()
        status.pop("_result")
        return status


def observe_heartbeat(lease: Mapping[str, Any]) -> None:
    """A node Lease as the watch delivers it: its renewal noted on the Lease clock when it
    happens, not at the next pass (up to an interval later, which would be added to every
    node-loss judgement)."""
    lease_view(lease, _lease_clock)


def watch_leases(kube: Kube, namespace: str, name: str) -> None:
    """A standby replica's pass: read the pipeline's partition Leases and the node
    heartbeats only to remember when each changed (the Lease clock and the unbroken
    view), acting on nothing. A standby that becomes leader then judges a Lease with the
    history it has watched instead of starting from zero and waiting a full duration (as
    client-go's standby candidates keep observing the leader Lease)."""
    for lease in kube.leases(namespace, name).values():
        lease_view(lease, _lease_clock)
    heartbeats = kube.node_leases()
    if heartbeats is None:
        return
    watched_for = timedelta(seconds=_heartbeat_view.looked(since=kube.heartbeats_watched_since()))
    for node in kube.nodes():
        node_view(node, heartbeats.get(node["metadata"]["name"]), _lease_clock, None, watched_for)


# the finalizers the reconcile pass over a deleted pipeline removes (kopf's
# FINALIZER_RETAIN_VOLUMES is kopf's own)
OUR_FINALIZERS = frozenset({names.FINALIZER_TAINTS, names.FINALIZER_OWNED_TOPIC})


def finalize(kube: Kube, body: Mapping[str, Any], record: Recorder) -> None:
    """A deleted pipeline lifts its marks from the out-of-service taints it relies on
    (and each taint with its last mark), and deletes the internal topic the operator
    created for it once no worker can still write to it; then lets itself go (each
    finalizer once its part is done)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    finalizers = set(meta.get("finalizers") or [])
    if names.FINALIZER_TAINTS in finalizers:
        us = taint_mark(namespace, name)
        listed = set((body.get("status") or {}).get("taintedNodes") or [])
        for node_name in sorted(listed | set(kube.nodes_marked_by(us))):
            if kube.release_out_of_service(node_name, us):
                record(
                    "Normal",
                    "NodeBackInService",
                    f"removed the out-of-service taint from {node_name} (pipeline deleted)",
                )
        kube.set_finalizer(namespace, name, names.FINALIZER_TAINTS, present=False)
    if names.FINALIZER_OWNED_TOPIC in finalizers:
        if not _delete_owned_topic(kube, body, record):
            return  # the next pass tries again
        kube.set_finalizer(namespace, name, names.FINALIZER_OWNED_TOPIC, present=False)
    forget(namespace, name)


def _delete_owned_topic(kube: Kube, body: Mapping[str, Any], record: Recorder) -> bool:
    """Delete the internal topic the operator created (`names.owned_topic`: the
    finalizer is set only for that name, never for a `kafka.ownedTopic` of the user's).
    First the workers go (deleted gracefully) and every partition Lease must have run out
    on the operator's clock: a worker still producing to a deleted topic could have it
    auto-created again with the broker's defaults. True once the topic is gone."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    for pod in kube.pods(namespace, name):
        pod_meta = pod["metadata"]
        if not pod_meta.get("deletionTimestamp"):
            kube.delete_pod(namespace, pod_meta["name"], False, pod_meta.get("uid"))
    held = [
        lease_name
        for lease_name, lease in kube.leases(namespace, name).items()
        if not lease_view(lease, _lease_clock).expired()
    ]
    if held:
        log.info(
            "%s/%s deleted: waiting for the Leases %s to run out before deleting its "
            "internal topic",
            namespace,
            name,
            ", ".join(sorted(held)),
        )
        return False
    try:
        spec = PipelineSpec.parse(name, namespace, body["spec"])
    except SpecError as exc:  # cannot happen for a spec the topic was created from
        log.error("%s/%s: cannot delete its internal topic: %s", namespace, name, exc)
        return False
    topic = names.owned_topic(namespace, name)
    settings = _kafka_settings(kube, spec)
    if isinstance(settings, TopicCheck):
        log.error("%s/%s: cannot delete internal topic %s: %s", namespace, name, topic,
                  settings.message)  # fmt: skip
        return False
    error = delete_topic(spec.kafka.bootstrap_servers, settings, topic)
    if error is not None:
        log.error("%s/%s: cannot delete internal topic %s: %s", namespace, name, topic, error)
        return False
    record("Normal", "OwnedTopicDeleted", f"deleted internal topic {topic} (pipeline deleted)")
    return True


def _lost_node_pods(
    kube: Kube,
    node: NodeView,
    leases: Mapping[str, Any],
    namespace: str,
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
        pods.append(node_pod(pod, lease, worker=True, clock=_lease_clock))
    return replace(node, pods=tuple(pods))


def _reconcile(
    kube: Kube,
    body: Mapping[str, Any],
    record: Recorder,
    settings: ReconcileSettings,
    memory: _Memory,
) -> dict[str, Any]:
    """observe → decide (`plan.plan_pass`, pure) → act → report."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    generation = int(meta.get("generation") or 1)
    now = datetime.now(UTC)
    try:
        asked = PipelineSpec.parse(name, namespace, body["spec"])
    except SpecError as exc:
        return _invalid(kube, body, record, str(exc), generation, now)
    previous: Mapping[str, Any] = body.get("status") or {}
    annotations = meta.get("annotations") or {}
    switch_asked = annotations.get(names.ANNOTATION_SWITCH_TO_OWNERSHIP) == "true"
    state = ownership.decide(asked, previous, switch_asked)
    spec = state.spec  # as the workers run it: partitions = the recorded worker count
    _tell_ownership(state, previous, record)
    if state.switch_ignored and not memory.switch_ignored:
        record(
            "Normal",
            "OwnershipSwitchIgnored",
            f"annotation {names.ANNOTATION_SWITCH_TO_OWNERSHIP} ignored: the pipeline "
            "already runs under ownership",
        )
        memory.switch_ignored = True
    owner = Owner(name, namespace, meta["uid"])
    claims = _ensure_objects(kube, spec, owner, generation, record, settings, memory)
    # `version`: the pipeline's resourceVersion after the pass's own writes (each moves it on)
    topic, version = _topic(kube, spec, meta, record, memory, settings)
    obs = _observe(kube, spec, body, claims, topic, state, record)
    the_plan = plan_pass(obs, now)
    memory.next_pass_in = the_plan.next_pass_in(now)
    version, tainted = _act(kube, spec, meta, version, the_plan, record)
    return _report(
        kube, spec, owner, obs, the_plan, tainted, version, record, settings, memory, now
    )


def _tell_ownership(
    state: ownership.OwnershipState, previous: Mapping[str, Any], record: Recorder
) -> None:
    """A Warning Event when ReshardPending or OwnershipOff appears (or its reason changes)."""
    c = state.condition
    if c is None:
        return
    was = next((x for x in previous.get("conditions") or [] if x.get("type") == c.type), None)
    if was is None or was.get("reason") != c.reason or was.get("status") != "True":
        record("Warning", c.type, c.message)


def _ensure_objects(
    kube: Kube,
    spec: PipelineSpec,
    owner: Owner,
    generation: int,
    record: Recorder,
    settings: ReconcileSettings,
    memory: _Memory,
) -> dict[str, Any]:
    """The pipeline's own objects (on spec changes and every ensure_s) and a volume
    claim per partition, grown when spec.storage.size grows. Returns the claims as read
    (before any created here: the next pass sees those)."""
    due = memory.ensured is None or memory.ensured[0] != generation
    if due or time.monotonic() - memory.ensured[1] > settings.ensure_s:  # type: ignore[index]
        for obj in pipeline_objects(spec, owner):
            kube.ensure(obj)
        kube.replace_role_rules(role(spec, owner))
        kube.replace_disruption_budget_spec(disruption_budget(spec, owner))
        _schedule_audit(kube, spec, owner, cleanup=due)
        memory.ensured = (generation, time.monotonic())
    claims = kube.volume_claims(spec.namespace, spec.name)
    for p in range(spec.partitions):
        claim_name = names.volume_claim(spec.name, p)
        claim = claims.get(claim_name)
        if claim is None:
            kube.ensure(desired_partition.volume_claim(spec, p, owner))
            record("Normal", "VolumeCreated", f"partition {p}: created PVC {claim_name}")
            continue
        asked = (
            ((claim.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
        )
        if asked and quantity(asked) < quantity(spec.storage.size):
            kube.resize_volume_claim(spec.namespace, claim_name, spec.storage.size)
            record("Normal", "VolumeResized", f"{claim_name}: {asked} -> {spec.storage.size}")
    return claims


def _observe(
    kube: Kube,
    spec: PipelineSpec,
    body: Mapping[str, Any],
    claims: Mapping[str, Any],
    topic: TopicCheck,
    state: ownership.OwnershipState,
    record: Recorder,
) -> PipelineObservation:
    """Everything the pass decides on, read once: the topics' check (`_topic`), pods,
    Leases, nodes with their heartbeats, VolumeAttachments; and for a lost node this
    pipeline may taint, the pods the taint would evict."""
    namespace, name = spec.namespace, spec.name
    previous: Mapping[str, Any] = body.get("status") or {}
    was = next((c for c in previous.get("conditions") or [] if c.get("type") == "TopicReady"), None)
    if not topic.ok and (was is None or was.get("reason") != topic.reason):
        # TopicReady failing: no promise can be kept until it is fixed, an ERROR line
        record("Warning", topic.reason, topic.message, error=True)

    raw_leases = kube.leases(namespace, name)
    heartbeats = kube.node_leases()  # None: unreadable, the Ready condition decides
    watched_for = None
    if heartbeats is not None:
        watched_for = timedelta(
            seconds=_heartbeat_view.looked(since=kube.heartbeats_watched_since())
        )
    lost_after = spec.failover.node_lost_after
    nodes = {
        n.name: n
        for n in (
            node_view(
                o,
                None if heartbeats is None else heartbeats.get(o["metadata"]["name"]),
                _lease_clock,
                lost_after,
                watched_for,
            )
            for o in kube.nodes()
        )
    }
    pods: dict[int, list[PodView]] = {}
    for raw in kube.pods(namespace, name):
        parsed = names.parse_worker_pod(raw["metadata"]["name"])
        if parsed is None or parsed[0] != name:
            continue
        pods.setdefault(parsed[1], []).append(pod_view(raw, parsed[2], names.ANNOTATION_SPEC_HASH))
    if spec.failover.release_volume == ReleaseVolume.OUT_OF_SERVICE_TAINT:
        # A lost node this pipeline may taint: what the taint would evict is looked at first.
        for entry in previous.get("partitions") or []:
            h_prev = entry.get("handover") or {}
            lost = nodes.get(h_prev.get("fromNode") or "")
            if (
                h_prev.get("reason") == HandoverReason.NODE_LOST.value
                and lost is not None
                and lost.pods is None
                and not lost.up
                and not lost.out_of_service
            ):
                nodes[lost.name] = _lost_node_pods(kube, lost, raw_leases, namespace)
    return PipelineObservation(
        spec=spec,
        generation=int(body["metadata"].get("generation") or 1),
        previous=previous,
        claims=claims,
        pods={p: tuple(views) for p, views in pods.items()},
        leases={n: lease_view(o, _lease_clock) for n, o in raw_leases.items()},
        nodes=nodes,
        attachments=kube.volume_attachments(),
        topic=topic,
        ownership=state,
    )


def _act(
    kube: Kube,
    spec: PipelineSpec,
    meta: Mapping[str, Any],
    version: str | None,
    the_plan: Plan,
    record: Recorder,
) -> tuple[str | None, list[str]]:
    """Carry out the plan: the taint finalizer and the plan's record (with
    status.ownership before the first worker) persisted first, then each partition's
    action with its Events, the taints joined, and our taints lifted from nodes that are
    back. `version`: the pipeline's resourceVersion after the pass's writes so far.
    Returns it after the pass's own writes and status.taintedNodes as it now stands."""
    namespace, name = spec.namespace, spec.name
    us = taint_mark(namespace, name)
    tainted = list(the_plan.tainted)
    if the_plan.set_finalizer:
        # the finalizer first: a pipeline deleted from now on lifts its marks
        version = kube.set_finalizer(
            namespace, name, names.FINALIZER_TAINTS, present=True, resource_version=version
        )
    if the_plan.record is not None:
        if "partitions" in the_plan.record:  # not the ownership generation's record alone
            faults.maybe_stop("operator-before-handover-record")
        version = kube.patch_status(namespace, name, the_plan.record, resource_version=version)
    for event in the_plan.events:  # the pipeline's own steps, once recorded
        record(*event)

    owner = Owner(name, namespace, meta["uid"])
    for step in the_plan.steps:
        p, action = step.partition, step.action
        if isinstance(action, CreateLease):
            kube.ensure(desired_partition.lease(spec, p, owner))
        elif isinstance(action, CreatePod):
            pod = desired_partition.worker_pod(spec, p, action.epoch, owner, action.avoid_node)
            if kube.create_pod(pod):
                away = f", away from {action.avoid_node}" if action.avoid_node else ""
                record(
                    "Normal",
                    "WorkerCreated",
                    f"partition {p}: created {pod['metadata']['name']} (epoch {action.epoch}{away})",
                )
        elif isinstance(action, DeletePods):
            for pod_name in action.names:
                kube.delete_pod(namespace, pod_name, action.force, the_plan.pod_uids.get(pod_name))
            record(
                "Normal",
                "WorkerDeleted",
                f"partition {p}: deleted {', '.join(action.names)}"
                f"{' (force)' if action.force else ''}: {action.why}",
            )
        elif isinstance(action, FenceLease):
            lease_name = names.lease(spec.name, p)
            if kube.fence_lease(namespace, lease_name, action.resource_version):
                record(
                    "Normal",
                    "WorkerFenced",
                    f"partition {p}: Lease {lease_name} of {action.holder} not renewed for its "
                    "duration (on the operator's clock): holder cleared",
                )
        elif isinstance(action, TaintOutOfService) and action.node not in the_plan.to_join:
            if kube.taint_out_of_service(action.node, us):
                # the handover's release reason says which signal made it safe
                h_now = step.decision.handover
                why = ((h_now.release_why if h_now else None) or "").split(": ", 1)[-1]
                record(
                    "Warning",
                    "NodeOutOfService",
                    f"partition {p}: tainted lost node {action.node} out-of-service to "
                    f"release its volume ({why or 'its dedup workers are fenced'})",
                )
            elif action.node in tainted:  # someone else's taint got there first
                tainted.remove(action.node)
        elif isinstance(action, BeginHandover):
            metrics.FAILOVERS_STARTED.labels(namespace, name, action.handover.reason.value).inc()
        elif isinstance(action, CompleteHandover):
            h = action.handover
            metrics.FAILOVERS.labels(namespace, name, h.reason.value).inc()
            metrics.FAILOVER_SECONDS.labels(h.reason.value).observe(h.steps.get("ready", 0.0))
            for step_name, at in h.steps.items():
                metrics.FAILOVER_STEP_SECONDS.labels(namespace, name, str(p), step_name).set(at)
        for event in step.events:
            record(*event)
    for node_name in sorted(the_plan.to_join):
        if kube.taint_out_of_service(node_name, us):
            record(
                "Normal",
                "NodeOutOfService",
                f"relying on the out-of-service taint on lost node {node_name} too",
            )
        elif node_name in tainted:
            tainted.remove(node_name)
    for node_name in the_plan.forget:
        tainted.remove(node_name)
    for node_name in the_plan.lift:
        if kube.release_out_of_service(node_name, us):
            record(
                "Normal", "NodeBackInService", f"removed the out-of-service taint from {node_name}"
            )
        tainted.remove(node_name)
    if not tainted and names.FINALIZER_TAINTS in (meta.get("finalizers") or []):
        version = kube.set_finalizer(
            namespace, name, names.FINALIZER_TAINTS, present=False, resource_version=version
        )
    return version, tainted


def _report(
    kube: Kube,
    spec: PipelineSpec,
    owner: Owner,
    obs: PipelineObservation,
    the_plan: Plan,
    tainted: list[str],
    version: str | None,
    record: Recorder,
    settings: ReconcileSettings,
    memory: _Memory,
    now: datetime,
) -> dict[str, Any]:
    """The workers' counters (their /metrics) and the audit's last result into the
    status, written only when it changed."""
    pod_ips = {v.name: v.ip for views in obs.pods.values() for v in views if v.ip}
    counters: dict[int, WorkerCounters] = {}
    for p, entry in the_plan.partitions.items():
        if not (entry.ready and entry.pod and entry.pod in pod_ips):
            continue
        text = scrape(pod_ips[entry.pod], timeout_s=settings.scrape_timeout_s)
        if text is None:
            continue
        c = worker_counters(
            text,
            (
                "dedup_duplicates_total",
                "dedup_records_in_total",
                "dedup_records_out_total",
                "dedup_consumer_lag",
            ),
        )
        counters[p] = WorkerCounters(
            duplicates=int(c["dedup_duplicates_total"]),
            records_in=int(c["dedup_records_in_total"]),
            records_out=int(c["dedup_records_out_total"]),
            lag=int(c["dedup_consumer_lag"]),
        )
    last_audit = _audit_result(kube, spec, owner, obs.previous, record, memory)
    audit_condition = None
    if spec.reconciliation is not None and last_audit and "time" in last_audit:
        audit_condition = audit_result.condition(last_audit)
    status = pipeline_status(obs, the_plan, counters, tainted, last_audit, audit_condition, now)
    previous = obs.previous
    if status["phase"] == "Running" and previous.get("phase") != "Running":
        record("Normal", "PipelineReady", f"all {spec.partitions} partitions are running")
    if _has_condition(previous, ownership.OWNERSHIP_SWITCHING) and not _has_condition(
        status, ownership.OWNERSHIP_SWITCHING
    ):
        record(
            "Normal",
            "OwnershipSwitchCompleted",
            f"switched to ownership: all {spec.partitions} workers are Ready under ownership",
        )
    metrics.PARTITIONS_NOT_RUNNING.labels(spec.namespace, spec.name).set(
        spec.partitions - status["readyPartitions"]
    )
    if any(previous.get(key) != value for key, value in status.items()):
        # unchanged status: no write, no event
        kube.patch_status(spec.namespace, spec.name, status, resource_version=version)
    return {**status, "_result": "ok"}


def _has_condition(status: Mapping[str, Any], type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _invalid(
    kube: Kube,
    body: Mapping[str, Any],
    record: Recorder,
    message: str,
    generation: int,
    now: datetime,
) -> dict[str, Any]:
    previous: Mapping[str, Any] = body.get("status") or {}
    if previous.get("phase") != "Failed" or previous.get("observedGeneration") != generation:
        record("Warning", "InvalidSpec", message)
    conditions = [
        Condition("Ready", False, "InvalidSpec", message),
        Condition("Degraded", True, "InvalidSpec", message),
    ]
    status = {
        "phase": "Failed",
        "observedGeneration": generation,
        "conditions": merge_conditions(
            previous.get("conditions") or [], conditions, generation, now
        ),
    }
    meta = body["metadata"]
    kube.patch_status(
        meta["namespace"], meta["name"], status, resource_version=meta.get("resourceVersion")
    )
    return {**status, "_result": "invalid_spec"}


def _kafka_settings(kube: Kube, spec: PipelineSpec) -> dict[str, str] | TopicCheck:
    """The operator's librdkafka settings for the pipeline's Kafka (the spec's, then the
    Secret's), or SecretMissing."""
    kafka_settings = dict(spec.kafka.config)
    ref = spec.kafka.security_ref
    if ref is not None:
        secret = kube.secret_value(spec.namespace, ref.secret_name, ref.key)
        if secret is None:
            return TopicCheck(
                False, "SecretMissing", f"Secret {ref.secret_name} (key {ref.key}) not found"
            )
        kafka_settings.update(parse_kafka_settings(secret))
    return kafka_settings


def _topic(
    kube: Kube,
    spec: PipelineSpec,
    meta: Mapping[str, Any],
    record: Recorder,
    memory: _Memory,
    settings: ReconcileSettings,
) -> tuple[TopicCheck, str | None]:
    """The topics' check (cached for topic_check_s), after creating the internal topic
    when the pipeline's workers own ids, the operator names the topic and it does not
    exist yet: the finalizer that deletes it with the pipeline goes on first. Returns the
    check and the pipeline's resourceVersion after this pass's writes."""
    version: str | None = meta.get("resourceVersion")
    key = (
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
    cached = memory.topic
    if (
        cached is not None
        and cached[0] == key
        and time.monotonic() - cached[1] < settings.topic_check_s
    ):
        return cached[2], version
    kafka_settings = _kafka_settings(kube, spec)
    if isinstance(kafka_settings, TopicCheck):
        memory.topic = (key, time.monotonic(), kafka_settings)
        return kafka_settings, version

    def read() -> TopicFacts | TopicCheck:
        return read_topics(
            spec.kafka.bootstrap_servers,
            kafka_settings,
            spec.kafka.input_topic,
            spec.kafka.output_topic,
            owned_topic=spec.owned_topic if spec.ownership else None,
            owned_user_named=spec.kafka.owned_topic is not None,
        )

    facts = read()
    if (
        isinstance(facts, TopicFacts)
        and spec.creates_owned_topic
        and facts.owned_partitions is None
    ):
        wanted = owned_topic_settings(facts, spec.workers)
        if isinstance(wanted, OwnedTopicSettings):
            if names.FINALIZER_OWNED_TOPIC not in (meta.get("finalizers") or []):
                # before the topic exists: a pipeline deleted from now on deletes it
                version = kube.set_finalizer(
                    spec.namespace,
                    spec.name,
                    names.FINALIZER_OWNED_TOPIC,
                    present=True,
                    resource_version=version,
                )
            facts = _create_owned_topic(spec, kafka_settings, wanted, record, read)
        elif facts.input_partitions is not None and facts.output_partitions is not None:
            facts = replace(facts, owned_why=f"not created: {wanted}")
    check = (
        facts
        if isinstance(facts, TopicCheck)
        else check_topics(facts, spec.partitions, spec.window.duration_ms, ownership=spec.ownership)
    )
    memory.topic = (key, time.monotonic(), check)
    return check, version


def _create_owned_topic(
    spec: PipelineSpec,
    kafka_settings: Mapping[str, str],
    wanted: OwnedTopicSettings,
    record: Recorder,
    read: Callable[[], TopicFacts | TopicCheck],
) -> TopicFacts | TopicCheck:
    """Create the internal topic and read the topics again (until its metadata shows,
    a few seconds at most)."""
    error = create_topic(spec.kafka.bootstrap_servers, kafka_settings, wanted)
    if error is not None:
        facts = read()
        if isinstance(facts, TopicFacts) and facts.owned_partitions is None:
            facts = replace(facts, owned_why=f"creating it failed: {error}")
        return facts
    configs = ", ".join(f"{k}={v}" for k, v in wanted.config.items())
    record(
        "Normal",
        "OwnedTopicCreated",
        f"created internal topic {wanted.name}: {wanted.partitions} partitions (one per "
        f"worker), replication factor {wanted.replication}, {configs}",
    )
    facts = read()
    for _ in range(10):
        if not isinstance(facts, TopicFacts) or facts.owned_partitions is not None:
            break
        time.sleep(0.5)
        facts = read()
    return facts


def _schedule_audit(kube: Kube, spec: PipelineSpec, owner: Owner, cleanup: bool) -> None:
    """Keep the scheduled audit's objects in step with spec.reconciliation: the CronJob,
    or the ScheduledSparkApplication when the Spark operator's CRD is installed (the
    other one deleted, so installing the Spark operator later switches over); all of
    them deleted when the spec has no reconciliation (checked on spec changes and at
    start only: `cleanup`)."""
    job = names.reconciliation_job(spec.name)
    kinds = ("CronJob", "ScheduledSparkApplication", "RoleBinding", "Role", "ServiceAccount")
    if spec.reconciliation is None:
        if cleanup:
            for kind in kinds:
                kube.delete_if_present(kind, spec.namespace, job)
        return
    spark_operator = kube.has_crd(desired_audit.SCHEDULED_SPARK_APPLICATION_CRD)
    for obj in desired_audit.reconciliation_objects(spec, owner, spark_operator):
        if obj["kind"] in ("CronJob", "ScheduledSparkApplication"):
            kube.apply_by_hash(obj)
            other = "CronJob" if obj["kind"] != "CronJob" else "ScheduledSparkApplication"
            if other == "CronJob" or spark_operator:  # the CRD may come or go
                kube.delete_if_present(other, spec.namespace, job)
        else:
            kube.ensure(obj)
    kube.replace_role_rules(desired_audit.role(spec, owner))


def _audit_result(
    kube: Kube,
    spec: PipelineSpec,
    owner: Owner,
    previous: Mapping[str, Any],
    record: Recorder,
    memory: _Memory,
) -> dict[str, Any] | None:
    """status.lastReconciliation after this pass: the previous one, or the audit's newer
    result (with its Event and metrics), plus the newest Spark operator run's state."""
    before = previous.get("lastReconciliation") or None
    if spec.reconciliation is None:
        return before
    name = names.reconciliation_result(spec.name)
    cm = kube.config_map(spec.namespace, name)
    text = None
    if cm is not None:
        kube.add_owner_reference(spec.namespace, cm, owner.reference())
        text = (cm.get("data") or {}).get(names.RECONCILIATION_SUMMARY_KEY)
    run = None
    if desired_audit.uses_spark_operator(
        spec, kube.has_crd(desired_audit.SCHEDULED_SPARK_APPLICATION_CRD)
    ):
        apps = kube.spark_applications(spec.namespace, names.reconciliation_job(spec.name))
        run = audit_result.newest_spark_application(apps)
    try:
        out = audit_result.outcome(text, name, before, run)
    except audit_result.SummaryError as exc:
        why = f"ConfigMap {name}: {exc}"
        if memory.audit_error != why:
            log.warning("cannot read the audit result of %s/%s: %s", spec.namespace, spec.name, why)
            record("Warning", "ReconciliationUnreadable", why)
            memory.audit_error = why
        out = audit_result.outcome(None, name, before, run)
    else:
        memory.audit_error = None
    if out.event is not None and out.last is not None:
        record(*out.event)
        ns = spec.namespace
        metrics.RECONCILIATIONS.labels(ns, spec.name, "passed" if out.passed else "failed").inc()
        metrics.RECONCILIATION_DUPLICATES.labels(ns, spec.name).set(out.last["duplicates"])
        metrics.RECONCILIATION_MISSING.labels(ns, spec.name).set(out.last["missing"])
    return out.last if out.last is not None else before
