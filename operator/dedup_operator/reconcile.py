"""One level-based reconcile pass over a DedupPipeline.

Reads what the cluster holds, decides per partition with `failover.partition_action`,
persists the handover records into status *before* acting, carries out each action,
and writes the status (with counters scraped from the workers' /metrics). Running it
twice changes nothing; an operator killed anywhere resumes from the cluster's state.

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
from datetime import UTC, datetime
from typing import Any

from dedup_operator import audit_result, metrics, names
from dedup_operator.desired import audit as desired_audit
from dedup_operator.desired import partition as desired_partition
from dedup_operator.desired.owner import Owner
from dedup_operator.desired.pipeline import pipeline_objects, role
from dedup_operator.failover import (
    BeginHandover,
    CancelHandover,
    CompleteHandover,
    CreateLease,
    CreatePod,
    Decision,
    DeletePods,
    FenceLease,
    Handover,
    HandoverReason,
    NodeView,
    PartitionObservation,
    PodView,
    Release,
    ReleaseVolume,
    Steady,
    TaintOutOfService,
    join_out_of_service_taint,
    partition_action,
    remove_out_of_service_taint,
)
from dedup_operator.kube import (
    Conflict,
    Kube,
    NotLeader,
    TopicCheck,
    check_input_topic,
    parse_kafka_settings,
    scrape,
    worker_counters,
)
from dedup_operator.observed import (
    attachments_of,
    lease_view,
    node_pod,
    node_view,
    pod_view,
    worker_lease_name,
)
from dedup_operator.spec import PipelineSpec, SpecError, quantity
from dedup_operator.status import (
    Condition,
    PartitionStatus,
    merge_conditions,
    phase_of,
    rfc3339,
    summary_conditions,
)
from dedup_worker import faults
from dedup_worker.lease_clock import LeaseClock

log = logging.getLogger("dedup_operator.reconcile")

# (type "Normal"|"Warning", reason, message) -> an Event on the pipeline
Recorder = Callable[[str, str, str], None]


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


_memories: dict[tuple[str, str], _Memory] = {}
_memories_lock = threading.Lock()

# When this operator process saw each Lease (partitions', nodes') change, on its monotonic
# clock: a Lease has run out once unchanged for its duration (dedup_worker.lease_clock).
# A restarted operator starts empty, so every held Lease is fresh at first sight: it waits
# a full duration (nodeLostAfter for a node) before acting on one. Safe, and that slow.
_lease_clock = LeaseClock()


def _memory(namespace: str, name: str) -> _Memory:
    with _memories_lock:
        return _memories.setdefault((namespace, name), _Memory())


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
            if names.FINALIZER_TAINTS in (body["metadata"].get("finalizers") or []):
                finalize(kube, body, recorder(body))
            return None
        if memory.uid != body["metadata"]["uid"]:  # a new pipeline of the same name
            memory.uid, memory.ensured, memory.topic = body["metadata"]["uid"], None, None
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


def finalize(kube: Kube, body: Mapping[str, Any], record: Recorder) -> None:
    """A deleted pipeline lifts its marks from the out-of-service taints it relies on
    (and each taint with its last mark), then lets itself go (its finalizer)."""
    meta = body["metadata"]
    us = f"{meta['namespace']}/{meta['name']}"
    listed = set((body.get("status") or {}).get("taintedNodes") or [])
    for node_name in sorted(listed | set(kube.nodes_marked_by(us))):
        if kube.release_out_of_service(node_name, us):
            record(
                "Normal",
                "NodeBackInService",
                f"removed the out-of-service taint from {node_name} (pipeline deleted)",
            )
    kube.set_finalizer(meta["namespace"], meta["name"], names.FINALIZER_TAINTS, present=False)
    forget(meta["namespace"], meta["name"])


_RELEASE_EVENTS = {
    Release.GRACEFUL: ("Normal", "ReleasedGracefully"),
    Release.OUT_OF_SERVICE_TAINT: ("Normal", "ReleaseByOutOfServiceTaint"),
    Release.TAINT_BLOCKED: ("Warning", "OutOfServiceTaintBlocked"),
    Release.WAIT_FOR_DETACH: ("Normal", "WaitingForDetach"),
    Release.EXTERNAL: ("Normal", "WaitingForOutOfServiceTaint"),
}


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
    meta = body["metadata"]
    name, namespace, generation = meta["name"], meta["namespace"], int(meta.get("generation") or 1)
    us = f"{namespace}/{name}"  # how our out-of-service taints are marked
    previous: Mapping[str, Any] = body.get("status") or {}
    now = datetime.now(UTC)
    # the pipeline's version this pass decides on; each of its own writes moves it on
    version: str | None = meta.get("resourceVersion")

    try:
        spec = PipelineSpec.parse(name, namespace, body["spec"])
    except SpecError as exc:
        return _invalid(kube, body, record, str(exc), generation, now)
    owner = Owner(name, namespace, meta["uid"])

    # -- per-pipeline objects and volumes (on spec changes and every ensure_s)
    claims = kube.volume_claims(namespace, name)
    due = memory.ensured is None or memory.ensured[0] != generation
    if due or time.monotonic() - memory.ensured[1] > settings.ensure_s:  # type: ignore[index]
        for obj in pipeline_objects(spec, owner):
            kube.ensure(obj)
        kube.replace_role_rules(role(spec, owner))
        _schedule_audit(kube, spec, owner, cleanup=due)
        memory.ensured = (generation, time.monotonic())
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
            kube.resize_volume_claim(namespace, claim_name, spec.storage.size)
            record("Normal", "VolumeResized", f"{claim_name}: {asked} -> {spec.storage.size}")

    # -- what only the operator can check: the input topic
    topic = _topic(kube, spec, memory, settings)
    previous_conditions = previous.get("conditions") or []
    was = next((c for c in previous_conditions if c.get("type") == "TopicReady"), None)
    if not topic.ok and (was is None or was.get("reason") != topic.reason):
        record("Warning", topic.reason, topic.message)
    topic_condition = Condition("TopicReady", topic.ok, topic.reason, topic.message)

    def startable(p: int) -> bool:
        if topic.reason == "TopicMissing":
            return False
        return topic.partitions is None or p < topic.partitions

    # -- observe
    raw_pods = kube.pods(namespace, name)
    leases = kube.leases(namespace, name)
    heartbeats = kube.node_leases()  # None: unreadable, the Ready condition decides
    lost_after = spec.failover.node_lost_after
    nodes = {
        n.name: n
        for n in (
            node_view(
                o,
                None if heartbeats is None else heartbeats.get(o["metadata"]["name"]),
                _lease_clock,
                lost_after,
            )
            for o in kube.nodes()
        )
    }
    vas = kube.volume_attachments()
    pods_by_partition: dict[int, list[PodView]] = {}
    pod_ips: dict[str, str] = {}
    for raw in raw_pods:
        parsed = names.parse_worker_pod(raw["metadata"]["name"])
        if parsed is None or parsed[0] != name:
            continue
        view = pod_view(raw, parsed[2], names.ANNOTATION_SPEC_HASH)
        pods_by_partition.setdefault(parsed[1], []).append(view)
        ip = (raw.get("status") or {}).get("podIP")
        if ip:
            pod_ips[view.name] = ip
    previous_parts = {int(p["partition"]): p for p in previous.get("partitions") or []}
    # A lost node this pipeline may taint: what the taint would evict is looked at first.
    if spec.failover.release_volume == ReleaseVolume.OUT_OF_SERVICE_TAINT:
        for entry in previous_parts.values():
            h_prev = entry.get("handover") or {}
            lost = nodes.get(h_prev.get("fromNode") or "")
            if (
                h_prev.get("reason") == HandoverReason.NODE_LOST.value
                and lost is not None
                and lost.pods is None
                and not lost.up
                and not lost.out_of_service
            ):
                nodes[lost.name] = _lost_node_pods(kube, lost, leases, namespace)

    any_handover = any(p.get("handover") for p in previous_parts.values())
    all_ready = all(
        any(
            v.ready and v.phase == "Running" and not v.deleting
            for v in pods_by_partition.get(p, [])
        )
        for p in range(spec.partitions)
    )
    may_roll = all_ready and not any_handover

    # -- decide every partition, persist handovers, then act
    decisions: dict[int, Decision] = {}
    for p in range(spec.partitions):
        prev = previous_parts.get(p, {})
        handover = Handover.from_status(prev["handover"]) if prev.get("handover") else None
        claim = claims.get(names.volume_claim(spec.name, p)) or {}
        pv = (claim.get("spec") or {}).get("volumeName")
        lease_obj = leases.get(names.lease(spec.name, p))
        obs = PartitionObservation(
            partition=p,
            pods=tuple(pods_by_partition.get(p, [])),
            nodes=nodes,
            lease=lease_view(lease_obj, _lease_clock) if lease_obj else None,
            attachments=attachments_of(vas, pv),
            handover=handover,
            desired_hash=desired_partition.template_hash(spec, p),
            may_roll=may_roll,
        )
        decision = partition_action(obs, spec.failover.policy(), now)
        decisions[p] = decision
        if isinstance(decision.action, BeginHandover):
            may_roll = False  # one partition rolls at a time
    changed = any(
        _handover_status(d) != (previous_parts.get(p, {}).get("handover") or None)
        for p, d in decisions.items()
    )
    parts = {
        p: _partition_status(p, pods_by_partition.get(p, []), d, previous_parts.get(p, {}))
        for p, d in decisions.items()
    }
    for p, d in decisions.items():
        if isinstance(d.action, CompleteHandover):  # recorded with the handover's end
            parts[p] = _with(
                parts[p],
                last_handover={**d.action.handover.to_status(), "toPod": d.action.pod},
                last_failover=rfc3339(now),
            )
    # Nodes about to be tainted are recorded first: a restarted operator must know which
    # taints are its own to lift.
    tainted = list(previous.get("taintedNodes") or [])
    to_taint = {
        d.action.node for d in decisions.values() if isinstance(d.action, TaintOutOfService)
    }
    to_join = {
        d.handover.from_node
        for d in decisions.values()
        if d.handover is not None
        and d.handover.from_node
        and join_out_of_service_taint(nodes.get(d.handover.from_node), us, d.handover)
    }
    marking = sorted(n for n in to_taint | to_join if n not in tainted)
    tainted += marking
    if to_taint | to_join:
        # the finalizer first: a pipeline deleted from now on lifts its marks
        version = kube.set_finalizer(
            namespace, name, names.FINALIZER_TAINTS, present=True, resource_version=version
        )
    if changed or marking:
        faults.maybe_stop("operator-before-handover-record")
        version = kube.patch_status(
            namespace,
            name,
            {"partitions": [s.to_status() for s in parts.values()], "taintedNodes": tainted},
            resource_version=version,
        )

    failovers = int(previous.get("failovers") or 0)
    for p, decision in decisions.items():
        action = decision.action
        if isinstance(action, CreateLease):
            kube.ensure(desired_partition.lease(spec, p, owner))
        elif isinstance(action, CreatePod):
            if not startable(p):
                parts[p] = _with(parts[p], waiting_for=f"input topic ({topic.reason})")
                continue
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
                kube.delete_pod(namespace, pod_name, action.force)
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
        elif isinstance(action, TaintOutOfService):
            if action.node in to_join:
                pass  # joined below
            elif kube.taint_out_of_service(action.node, us):
                record(
                    "Warning",
                    "NodeOutOfService",
                    f"partition {p}: tainted lost node {action.node} out-of-service to "
                    "release its volume (it runs only fenced dedup workers)",
                )
            elif action.node in tainted:  # someone else's taint got there first
                tainted.remove(action.node)
        elif isinstance(action, BeginHandover):
            h = action.handover
            metrics.FAILOVERS_STARTED.labels(namespace, name, h.reason.value).inc()
            record(
                "Warning" if h.reason != HandoverReason.SPEC_CHANGED else "Normal",
                "FailoverStarted" if h.reason != HandoverReason.SPEC_CHANGED else "RollStarted",
                f"partition {p}: {h.reason.value}: moving from {h.from_pod or '-'} on "
                f"{h.from_node or '-'} (epoch {h.from_epoch})",
            )
        elif isinstance(action, CompleteHandover):
            h = action.handover
            seconds = h.steps.get("ready", 0.0)
            metrics.FAILOVERS.labels(namespace, name, h.reason.value).inc()
            metrics.FAILOVER_SECONDS.labels(h.reason.value).observe(seconds)
            for step, at in h.steps.items():
                metrics.FAILOVER_STEP_SECONDS.labels(namespace, name, str(p), step).set(at)
            if h.reason != HandoverReason.SPEC_CHANGED:
                failovers += 1
            steps = ", ".join(f"{k} {v:.1f}s" for k, v in h.steps.items())
            record(
                "Normal",
                "FailoverCompleted" if h.reason != HandoverReason.SPEC_CHANGED else "RollCompleted",
                f"partition {p}: {action.pod} is Ready after {seconds:.1f}s ({steps})",
            )
        elif isinstance(action, CancelHandover):
            record("Normal", "FailoverCancelled", f"partition {p}: {action.why}")
        if decision.degraded and not (previous_parts.get(p, {}).get("waitingFor") or "").startswith(
            "DEGRADED"
        ):
            record("Warning", decision.degraded_reason or "Degraded", decision.degraded)
        h_now = decision.handover
        h_was = previous_parts.get(p, {}).get("handover") or {}
        if (
            h_now is not None
            and h_now.release is not None
            and (h_was.get("release"), h_was.get("releaseWhy"))
            != (h_now.release.value, h_now.release_why)
        ):
            type_, reason = _RELEASE_EVENTS[h_now.release]
            record(type_, reason, f"partition {p}: {h_now.release_why}")
    for node_name in sorted(to_join):
        if kube.taint_out_of_service(node_name, us):
            record(
                "Normal",
                "NodeOutOfService",
                f"relying on the out-of-service taint on lost node {node_name} too",
            )
        elif node_name in tainted:
            tainted.remove(node_name)

    # -- lift out-of-service taints from nodes that are back and hold none of our volumes
    our_pvs = {
        (c.get("spec") or {}).get("volumeName")
        for c in claims.values()
        if (c.get("spec") or {}).get("volumeName")
    }
    for node_name in list(tainted):
        node = nodes.get(node_name)
        if node_name in to_taint | to_join:
            continue  # marked in this pass, after `nodes` was read
        if node is None or us not in node.tainted_by:
            tainted.remove(node_name)  # gone, or untainted by someone: not ours to lift
            continue
        here = sum(
            1
            for va in vas
            if (va.get("spec") or {}).get("nodeName") == node_name
            and ((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName") in our_pvs
        )
        if remove_out_of_service_taint(node, here, us):
            if kube.release_out_of_service(node_name, us):
                record(
                    "Normal",
                    "NodeBackInService",
                    f"removed the out-of-service taint from {node_name}",
                )
            tainted.remove(node_name)
    if not tainted and names.FINALIZER_TAINTS in (meta.get("finalizers") or []):
        version = kube.set_finalizer(
            namespace, name, names.FINALIZER_TAINTS, present=False, resource_version=version
        )

    # -- counters from the workers' own metrics
    totals = {"dups": 0, "in": 0, "out": 0, "lag": 0}
    for p, entry in parts.items():
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
        parts[p] = _with(
            entry, lag=int(c["dedup_consumer_lag"]), duplicates=int(c["dedup_duplicates_total"])
        )
        totals["dups"] += int(c["dedup_duplicates_total"])
        totals["in"] += int(c["dedup_records_in_total"])
        totals["out"] += int(c["dedup_records_out_total"])
        totals["lag"] += int(c["dedup_consumer_lag"])

    # -- status
    entries = [parts[p] for p in range(spec.partitions)]
    degraded = [d.degraded for d in decisions.values() if d.degraded]
    if not topic.ok and topic.reason != "KafkaUnreachable":
        degraded.append(topic.message)
    spec_current = all(
        all(
            v.spec_hash == desired_partition.template_hash(spec, p)
            for v in pods_by_partition.get(p, [])
            if not v.deleting
        )
        for p in range(spec.partitions)
    )
    conditions = summary_conditions(
        entries, spec.partitions, topic_condition, degraded, spec_current
    )
    last_audit = _audit_result(kube, spec, owner, previous, record, memory)
    if spec.reconciliation is not None and last_audit and "time" in last_audit:
        conditions.append(audit_result.condition(last_audit))
    ready_count = sum(1 for e in entries if e.ready)
    phase = phase_of(entries, bool(degraded), previous.get("phase"))
    if phase == "Running" and previous.get("phase") != "Running":
        record("Normal", "PipelineReady", f"all {spec.partitions} partitions are running")
    metrics.PARTITIONS_NOT_RUNNING.labels(namespace, name).set(spec.partitions - ready_count)
    status: dict[str, Any] = {
        "phase": phase,
        "observedGeneration": generation,
        "readyPartitions": ready_count,
        "duplicatesDropped": totals["dups"],
        "recordsIn": totals["in"],
        "recordsOut": totals["out"],
        "consumerLag": totals["lag"],
        "failovers": failovers,
        "taintedNodes": tainted,
        "conditions": merge_conditions(previous_conditions, conditions, generation, now),
        "partitions": [e.to_status() for e in entries],
    }
    if last_audit:
        status["lastReconciliation"] = last_audit
    if any(previous.get(key) != value for key, value in status.items()):
        # unchanged status: no write, no event
        kube.patch_status(namespace, name, status, resource_version=version)
    return {**status, "_result": "ok"}


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


def _topic(
    kube: Kube, spec: PipelineSpec, memory: _Memory, settings: ReconcileSettings
) -> TopicCheck:
    key = (
        spec.kafka.bootstrap_servers,
        spec.kafka.input_topic,
        spec.partitions,
        spec.kafka.config,
        spec.kafka.security_ref,
    )
    cached = memory.topic
    if (
        cached is not None
        and cached[0] == key
        and time.monotonic() - cached[1] < settings.topic_check_s
    ):
        return cached[2]
    kafka_settings = dict(spec.kafka.config)
    ref = spec.kafka.security_ref
    if ref is not None:
        secret = kube.secret_value(spec.namespace, ref.secret_name, ref.key)
        if secret is None:
            check = TopicCheck(
                False, "SecretMissing", f"Secret {ref.secret_name} (key {ref.key}) not found"
            )
            memory.topic = (key, time.monotonic(), check)
            return check
        kafka_settings.update(parse_kafka_settings(secret))
    check = check_input_topic(
        spec.kafka.bootstrap_servers, kafka_settings, spec.kafka.input_topic, spec.partitions
    )
    memory.topic = (key, time.monotonic(), check)
    return check


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


def _handover_status(decision: Decision) -> dict[str, Any] | None:
    return decision.handover.to_status() if decision.handover else None


def _partition_status(
    p: int, pods: list[PodView], decision: Decision, previous: Mapping[str, Any]
) -> PartitionStatus:
    current = max((v for v in pods if not v.deleting), key=lambda v: v.epoch, default=None)
    if current is None:
        current = max(pods, key=lambda v: v.epoch, default=None)
    action = decision.action
    waiting = None
    if isinstance(action, Steady):
        waiting = action.waiting_for
    if decision.degraded:
        waiting = f"DEGRADED: {decision.degraded}"
    ready = bool(
        current is not None
        and current.ready
        and current.phase == "Running"
        and not current.deleting
        and decision.handover is None
    )
    return PartitionStatus(
        partition=p,
        pod=current.name if current else None,
        node=current.node if current else None,
        epoch=current.epoch if current else 0,
        phase=("FailingOver" if decision.handover else (current.phase if current else "Missing")),
        ready=ready,
        waiting_for=waiting,
        handover=_handover_status(decision),
        last_handover=previous.get("lastHandover"),
        last_failover=previous.get("lastFailover"),
    )


def _with(entry: PartitionStatus, **changes: Any) -> PartitionStatus:
    return replace(entry, **changes)
