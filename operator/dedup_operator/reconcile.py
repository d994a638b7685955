"""One level-based reconcile pass over a DedupPipeline: observe → decide → act → report.

- observe (`observe.observe_pipeline`): reads only — the pipeline's pods, Leases and
  PVCs, the topics (checked every topic_check_s), the cluster's Nodes, node heartbeats
  and VolumeAttachments (watched: cache.py), the audit's result;
- decide (`plan.plan_pass`, pure): every partition with `failover.partition_action`,
  what must be persisted first, and every action of the pass in order;
- act (`executor.execute`): the actions, the handover records (and nodes about to be
  tainted) into status *before* any partition's action;
- again at once, up to CHAINED_STEPS times, after a handover step whose effect the
  watches hold (the pass's own writes: a handover begun, a Lease fenced, a node
  marked): observe → decide → act on them;
- report (`_report`): the workers' counters (their /metrics, scraped at most once per
  `--status-counters-interval`, 60 s) into the status, its only write, when the status
  changed.
A plan that creates the internal topic stops there; the workers are then decided on
the topic as made, by a second observe → decide → act in the same pass. A deleted
pipeline with our finalizers is finalized the same way (`plan.plan_finalize`).

Running it twice changes nothing; an operator killed anywhere resumes from the cluster's
state. Every write to the pipeline (status, its finalizer) carries the resourceVersion
the pass read (then that of its own last write): a pipeline changed meanwhile — by a
successor leader above all — is a `Conflict`, and the pass is abandoned. The caller runs
the pass inside `Kube.acting(leader.is_leader)`: each mutating call re-checks leadership
first (`NotLeader`), so a replica paused past its leadership does not carry on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from dedup_contract import names, worker_metrics
from dedup_contract.worker_metrics import scrape, worker_counters
from dedup_operator import operator_metrics
from dedup_operator.cluster_api import Cluster, ClusterReads
from dedup_operator.executor import Acting, Recorder, execute
from dedup_operator.kube import Conflict, NotLeader
from dedup_operator.memory import LeaseWatch, PipelineMemory
from dedup_operator.observe import (
    InvalidSpec,
    PipelineObservation,
    observe_deleted,
    observe_pipeline,
)
from dedup_operator.observed import lease_view, node_view
from dedup_operator.pass_outcome import Outcome
from dedup_operator.plan import Plan, plan_finalize, plan_invalid, plan_pass
from dedup_operator.settings import ReconcileSettings
from dedup_operator.status import kept_counters, pipeline_status
from dedup_operator.status_records import WorkerCounters

log = logging.getLogger("dedup_operator.reconcile")


# the finalizers the reconcile pass over a deleted pipeline removes (kopf's
# FINALIZER_RETAIN_VOLUMES is kopf's own)
OUR_FINALIZERS = frozenset({names.FINALIZER_TAINTS, names.FINALIZER_OWNED_TOPIC})

# How many times one pass decides again at once after a handover step whose effect the
# watches hold (`executor.Acting.next_step_known`): begun -> fenced -> tainted ->
# released is three. Each waited behind every other pipeline's pass before: with 20
# pipelines handing over at once, 3-6 s from the decision to the fence.
CHAINED_STEPS = 3


def reconcile(
    kube: Cluster,
    namespace: str,
    name: str,
    recorder: Callable[[Mapping[str, Any]], Recorder],
    settings: ReconcileSettings,
    memory: PipelineMemory,
    watch: LeaseWatch,
) -> Outcome:
    """One pass over pipeline namespace/name. `memory` is the caller's, of this pipeline
    (passes over one pipeline never overlap: they hold its lock); `watch` the process's.
    Each pass reads the pipeline inside its turn, from the watch, which holds the
    operator's own status writes at once: the handover records the previous pass wrote
    are always seen (a read older than the pipeline loses its write to a Conflict)."""
    key = (namespace, name)
    with memory.lock, operator_metrics.RECONCILE_SECONDS.time():
        body = kube.pipeline(namespace, name)
        if body is None:
            return Outcome(key, "gone")
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            if set(meta.get("finalizers") or []) & OUR_FINALIZERS:
                return finalize(kube, body, recorder(body), memory, watch)
            return Outcome(key, "deleting")
        memory.meet(meta["uid"])
        acting = Acting(kube, recorder(body), memory, namespace, name, meta.get("resourceVersion"))
        try:
            outcome = _pass(kube, body, acting, settings, watch)
        except (Conflict, NotLeader) as exc:
            result = "conflict" if isinstance(exc, Conflict) else "not-leader"
            log.info("pass over %s/%s abandoned: %s", namespace, name, exc)
            operator_metrics.RECONCILES.labels(namespace, name, result).inc()
            return Outcome(key, result, tuple(acting.applied), acting.requeue_after)
        except Exception:
            operator_metrics.RECONCILES.labels(namespace, name, "error").inc()
            raise
        operator_metrics.RECONCILES.labels(namespace, name, outcome.result).inc()
        return outcome


def _pass(
    kube: ClusterReads,
    body: Mapping[str, Any],
    acting: Acting,
    settings: ReconcileSettings,
    watch: LeaseWatch,
) -> Outcome:
    """observe → decide (`plan.plan_pass`, pure) → act → report; a second observe →
    decide → act after the plan created the internal topic (its check is remembered:
    the second look reuses it)."""
    memory = acting.memory
    now = datetime.now(UTC)
    seen = observe_pipeline(kube, body, memory, watch, settings)
    if isinstance(seen, InvalidSpec):
        return _invalid(seen, acting, now)
    plan = _decide_and_act(seen, acting, settings, now)
    if plan.observe_again:
        seen = observe_pipeline(kube, body, memory, watch, settings, reuse_topic_check=True)
        assert not isinstance(seen, InvalidSpec)  # the same body as parsed above
        plan = _decide_and_act(seen, acting, settings, now)
    for _ in range(CHAINED_STEPS):
        # a handover's next step decided at once on what the pass itself just wrote
        again = kube.pipeline(acting.namespace, acting.name) if acting.next_step_known() else None
        if again is None:
            break
        looked = observe_pipeline(kube, again, memory, watch, settings, reuse_topic_check=True)
        if isinstance(looked, InvalidSpec):
            break  # edited meanwhile: the next pass says so
        seen, now = looked, datetime.now(UTC)
        plan = _decide_and_act(seen, acting, settings, now)
    status = _report(seen, plan, acting, settings, now)
    key = (acting.namespace, acting.name)
    rest = plan.rest(seen)
    return Outcome(key, "ok", tuple(acting.applied), plan.requeue_after(now), status, rest)


def _decide_and_act(
    seen: PipelineObservation, acting: Acting, settings: ReconcileSettings, now: datetime
) -> Plan:
    plan = plan_pass(seen, now, settings)
    acting.requeue_after = plan.requeue_after(now)
    acting.tainted = list(plan.relying_on)
    execute(plan.actions, acting)
    return plan


def _invalid(seen: InvalidSpec, acting: Acting, now: datetime) -> Outcome:
    """A spec that does not parse: told, and the status says so (always written)."""
    decided = plan_invalid(seen, now)
    execute(decided.actions, acting)
    acting.kube.patch_status(
        seen.namespace, seen.name, decided.status, resource_version=acting.version
    )
    key = (seen.namespace, seen.name)
    return Outcome(key, "invalid_spec", tuple(acting.applied), None, decided.status)


def _report(
    obs: PipelineObservation,
    plan: Plan,
    acting: Acting,
    settings: ReconcileSettings,
    now: datetime,
) -> dict[str, Any]:
    """The workers' counters (their /metrics, scraped at most every `counters_s`:
    `status.kept_counters`) and the audit's last result into the status, written only
    when it changed (an unchanged status: no write)."""
    spec = obs.spec
    memory = acting.memory
    ready = {p for p, e in plan.partitions.items() if e.ready and e.pod}
    scraped_at = time.monotonic()
    counters = kept_counters(memory.counters, ready, scraped_at, settings.counters_s)
    if counters is None:
        counters = _worker_counters(obs, plan, settings)
        memory.counters = (scraped_at, counters)
    status = pipeline_status(
        obs, plan, counters, acting.tainted, plan.last_audit, plan.audit_condition, now
    )
    operator_metrics.PARTITIONS_NOT_RUNNING.labels(spec.namespace, spec.name).set(
        spec.partitions - status["readyPartitions"]
    )
    if any(obs.previous.get(key) != value for key, value in status.items()):
        acting.kube.patch_status(spec.namespace, spec.name, status, resource_version=acting.version)
    return status


def _worker_counters(
    obs: PipelineObservation, plan: Plan, settings: ReconcileSettings
) -> dict[int, WorkerCounters]:
    """Each Ready partition's counters, from its worker's /metrics (one that does not
    answer: none)."""
    pod_ips = {v.name: v.ip for views in obs.pods.values() for v in views if v.ip}
    counters: dict[int, WorkerCounters] = {}
    for p, entry in plan.partitions.items():
        if not (entry.ready and entry.pod and entry.pod in pod_ips):
            continue
        text = scrape(pod_ips[entry.pod], timeout_s=settings.scrape_timeout_s)
        if text is None:
            continue
        c = worker_counters(
            text,
            (
                worker_metrics.DUPLICATES_TOTAL,
                worker_metrics.RECORDS_IN_TOTAL,
                worker_metrics.RECORDS_OUT_TOTAL,
                worker_metrics.CONSUMER_LAG,
            ),
        )
        counters[p] = WorkerCounters(
            duplicates=int(c[worker_metrics.DUPLICATES_TOTAL]),
            records_in=int(c[worker_metrics.RECORDS_IN_TOTAL]),
            records_out=int(c[worker_metrics.RECORDS_OUT_TOTAL]),
            lag=int(c[worker_metrics.CONSUMER_LAG]),
        )
    return counters


def finalize(
    kube: Cluster,
    body: Mapping[str, Any],
    record: Recorder,
    memory: PipelineMemory,
    watch: LeaseWatch,
) -> Outcome:
    """A deleted pipeline's pass (`plan.plan_finalize`): observe → decide → act.
    `finalized` once every finalizer of ours is gone."""
    seen = observe_deleted(kube, body, watch)
    decided = plan_finalize(seen)
    acting = Acting(kube, record, memory, seen.namespace, seen.name, None)
    done = execute(decided.actions, acting) and decided.complete
    key = (seen.namespace, seen.name)
    return Outcome(key, "finalized" if done else "finalizing", tuple(acting.applied))


def watch_leases(kube: ClusterReads, namespace: str, name: str, watch: LeaseWatch) -> None:
    """A standby replica's pass: read the pipeline's partition Leases and the node
    heartbeats only to remember when each changed (the Lease clock and the unbroken
    view), acting on nothing. A standby that becomes leader then judges a Lease with the
    history it has watched instead of starting from zero and waiting a full duration (as
    client-go's standby candidates keep observing the leader Lease).

    What a synced watch follows is on the clock already (the caches note each renewal as
    it arrives): the pass reads only what was listed (no watch: its renewals are seen
    here) and the nodes without a heartbeat (their Ready condition's changes). Reading
    every node's heartbeat again in every pipeline's pass cost the standby as much CPU
    as the leader at 100 pipelines on 50 nodes."""
    if kube.leases_watched_since(namespace) is None:
        for lease in kube.leases(namespace, name).values():
            lease_view(lease, watch.lease_clock)
    heartbeats = kube.node_leases()
    if heartbeats is None:
        return
    since = kube.heartbeats_watched_since()
    watched_for = watch.heartbeats_watched_for(since)
    for node in kube.nodes():
        heartbeat = heartbeats.get(node["metadata"]["name"])
        if heartbeat is not None and since is not None:
            continue  # followed by the watch
        node_view(node, heartbeat, watch.lease_clock, None, watched_for)
