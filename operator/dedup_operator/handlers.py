"""kopf handlers: thin; every one of them runs the same idempotent `reconcile` pass.

- create / resume / update (spec): a pass at once;
- a pass scheduler (`pass_queue`): each pipeline's own next pass, on `--pass-threads`
  threads, one pass at a time per pipeline (its memory's lock, kopf's passes included):
  every `--interval` seconds or sooner when its pass asks (a handover's next step); a
  pipeline at rest (nothing pending) at the resync (`--resync-interval`), or at once
  when something it reads changes or a node of its workers falls silent
  (`dedup_operator.wakeups`, fed by the watches' events; a timer thread asks it for the
  silent nodes). A thread lists the pipelines each interval and keeps the scheduler's
  set to them. Not kopf daemons or timers: those put a finalizer on every pipeline;
- delete: for pipelines that keep their volumes (`storage.retainOnDelete`, the
  default), kopf's finalizer `dedup.io/retain-volumes`: the PVCs lose their owner
  reference before the garbage collector runs, so only they survive. A pipeline that
  relies on an out-of-service taint it added to a node carries the operator's own
  finalizer `dedup.io/out-of-service-taints` (set by the reconcile pass before it taints,
  dropped once it relies on none): the resync pass over a deleted pipeline lifts its
  marks and taints, then the finalizer. A pipeline whose internal topic the operator
  created carries `dedup.io/owned-topic` (set before the topic is created): the resync
  pass over a deleted pipeline deletes its workers, waits for their Leases to run out,
  deletes the topic, then the finalizer. Otherwise owner references cascade.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dedup_contract import names
from dedup_operator import events, operator_metrics, storage_version
from dedup_operator.cache import SYNCED
from dedup_operator.executor import Recorder
from dedup_operator.kube import Kube, api_client
from dedup_operator.kube_calls import NotLeader
from dedup_operator.leader import LeaderElection
from dedup_operator.memory import LeaseWatch, PipelineMemories
from dedup_operator.pass_outcome import Outcome
from dedup_operator.pass_queue import PassScheduler
from dedup_operator.reconcile import OUR_FINALIZERS, reconcile, watch_leases
from dedup_operator.settings import ReconcileSettings
from dedup_operator.wakeups import Obj, Wakeups

log = logging.getLogger("dedup_operator")


@dataclass
class Runtime:
    """Set by the CLI before kopf starts; `memories` and `lease_watch` are what the
    process remembers between passes (per pipeline, and of every Lease it saw)."""

    kube: Kube | None = None
    settings: ReconcileSettings = field(default_factory=ReconcileSettings)
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    leader: LeaderElection | None = None  # None: no election, always act
    stop: threading.Event = field(default_factory=threading.Event)
    memories: PipelineMemories = field(default_factory=PipelineMemories)
    lease_watch: LeaseWatch = field(default_factory=LeaseWatch)
    pass_threads: int = 4  # passes over different pipelines at once
    scheduler: PassScheduler | None = None  # set by `configure`
    wakeups: Wakeups = field(default_factory=Wakeups)  # guarded by `wakeups_lock`
    wakeups_lock: threading.Lock = field(default_factory=threading.Lock)


RUNTIME = Runtime()


def _kube() -> Kube:
    if RUNTIME.kube is None:
        raise kopf.PermanentError("no API client configured (start it with dedup-operator)")
    return RUNTIME.kube


def recorder(kube: Kube, body: Mapping[str, Any]) -> Recorder:
    """Each decision as an Event on the pipeline and a log line."""
    meta = body["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"

    def record(type_: str, reason: str, message: str, error: bool = False) -> None:
        kube.event(body, type_, reason, message)
        level = logging.INFO
        if error:
            level = logging.ERROR
        elif type_ == "Warning":
            level = logging.WARNING
        log.log(level, "%s: %s", reason, message, extra={"pipeline": where, "reason": reason})

    return record


def reconcile_one(kube: Kube, namespace: str, name: str) -> Outcome | None:
    """A pass over the pipeline (None: this replica is a standby, it only watched)."""
    leader = RUNTIME.leader
    if leader is not None and not leader.is_leader():
        # another replica acts; this one watches the Leases, to take over with history
        watch_leases(kube, namespace, name, RUNTIME.lease_watch)
        return None
    memory = RUNTIME.memories.of(namespace, name)

    def one_pass() -> Outcome:
        return reconcile(
            kube,
            namespace,
            name,
            lambda body: recorder(kube, body),
            RUNTIME.settings,
            memory,
            RUNTIME.lease_watch,
        )

    if leader is None:
        outcome = one_pass()
    else:
        # and before each mutating call of the pass, again (a pass may outlive leadership)
        with kube.acting(leader.is_leader):
            outcome = one_pass()
    if outcome.finalized:
        RUNTIME.memories.forget(namespace, name)
    return outcome


FOLLOW_UP_S = 1.0  # the shortest wait between two passes over one pipeline, except:
STEP_FOLLOW_UP_S = 0.1  # after a pass that took a handover step, the next step at once
STEPS_IN_A_ROW = 8  # ... this many times in a row at most (a step repeated, not moving)
HANDOVER_STEPS: Final = frozenset(
    {"WriteHandoverRecord", "FenceWorkerLease", "MarkOutOfService", "DeleteWorkers", "CreateWorker"}
)
NEXT_PASS_GONE: Final = frozenset({"gone", "deleting", "finalized"})
"""Outcomes after which a pipeline gets no next pass (listed again, it gets one)."""


def next_pass_in(
    outcome: Outcome | None,
    interval_s: float,
    leading: bool,
    steps_in_a_row: int = 0,
    rest_s: float | None = None,
) -> float | None:
    """Seconds until a pipeline's next pass after `outcome` (None: no next pass): its
    `requeue_after` when this replica leads (a handover's next step, something due),
    never sooner than FOLLOW_UP_S nor later than the interval; `rest_s` (default: the
    interval) for a pipeline at rest, whose passes a change calls for sooner
    (`wakeups`); the interval otherwise (a standby watching, a pass that raised);
    FOLLOW_UP_S after a pass that lost its write to a Conflict (its read was older than
    the pipeline). A pass that took a handover step is followed at STEP_FOLLOW_UP_S
    (what it wrote is what the next step decides on), unless `steps_in_a_row` passes
    before it already were."""
    if outcome is None or not leading:
        return interval_s
    if outcome.result in NEXT_PASS_GONE:
        return None
    if outcome.result == "conflict":  # the pipeline changed under the pass: look again
        return FOLLOW_UP_S
    due = outcome.requeue_after
    if due is None:
        return rest_s if outcome.rest is not None and rest_s is not None else interval_s
    if due == 0.0 and steps_in_a_row < STEPS_IN_A_ROW and HANDOVER_STEPS & set(outcome.actions):
        return STEP_FOLLOW_UP_S
    return max(FOLLOW_UP_S, min(interval_s, due))


def run_pass(key: tuple[str, str]) -> float | None:
    """(A pass thread of the scheduler.) One pass over the pipeline; the seconds until
    its next."""
    namespace, name = key
    settings = RUNTIME.settings
    interval = settings.interval_s
    try:
        outcome = reconcile_one(_kube(), namespace, name)
    except Exception as exc:  # one bad pass must not stop the others
        log.exception("reconcile of %s/%s failed: %s", namespace, name, exc)
        _note_rest(key, None)
        return interval
    leading = RUNTIME.leader is None or RUNTIME.leader.is_leader()
    _note_rest(key, outcome if leading else None)
    if outcome is None or outcome.result in NEXT_PASS_GONE:
        return next_pass_in(outcome, interval, leading)
    memory = RUNTIME.memories.of(namespace, name)
    after = next_pass_in(outcome, interval, leading, memory.steps_in_a_row, settings.rest_s())
    memory.steps_in_a_row = memory.steps_in_a_row + 1 if after == STEP_FOLLOW_UP_S else 0
    return after


def _note_rest(key: tuple[str, str], outcome: Outcome | None) -> None:
    """What the pass left the pipeline as, for what wakes it: at rest, busy, or neither
    (gone, or this replica is not acting: passes at the interval)."""
    with RUNTIME.wakeups_lock:
        wakeups = RUNTIME.wakeups
        if outcome is None or outcome.result in NEXT_PASS_GONE:
            wakeups.forget(key)
        elif outcome.rest is not None and outcome.requeue_after is None:
            wakeups.rested(key, outcome.rest, time.monotonic())
        else:
            wakeups.busy(key)
        resting = wakeups.resting()
    operator_metrics.PIPELINES_AT_REST.set(resting)


def on_watch_event(kind: str, event: str, held: Obj | None, obj: Obj | None) -> None:
    """(A watch's thread.) A pass at once over the pipelines the event concerns; a node's
    heartbeat renewed starts its silence timers again."""
    now = time.monotonic()
    if kind == "node-leases":
        if obj is not None and event != "DELETED" and _renewed(held, obj):
            with RUNTIME.wakeups_lock:
                RUNTIME.wakeups.heartbeat(str(obj["metadata"]["name"]), now)
        return
    with RUNTIME.wakeups_lock:
        keys = RUNTIME.wakeups.on_event(kind, event, held, obj)
    _wake(keys, "relist" if event == SYNCED else kind)


def _renewed(held: Obj | None, obj: Obj) -> bool:
    """A heartbeat Lease seen for the first time or with a new renewTime."""
    renew = (obj.get("spec") or {}).get("renewTime")
    return held is None or (held.get("spec") or {}).get("renewTime") != renew


def _wake(keys: set[tuple[str, str]], cause: str) -> None:
    scheduler = RUNTIME.scheduler
    if keys and scheduler is not None:
        woken = scheduler.wake(keys)
        if woken:
            operator_metrics.PASSES_WOKEN.labels(cause).inc(woken)


WAKE_TICK_S = 0.25  # how often the silent nodes' timers are looked at


def wake_forever() -> None:
    """Until RUNTIME.stop is set: passes over the pipelines at rest on a node that has
    fallen silent for their nodeLostAfter (`Wakeups.due`)."""
    while not RUNTIME.stop.wait(WAKE_TICK_S):
        with RUNTIME.wakeups_lock:
            keys = RUNTIME.wakeups.due(time.monotonic())
        _wake(keys, "silent-node")


STORAGE_MIGRATION_FIRST_S = 5.0  # after the start: the watches have synced by then
STORAGE_MIGRATION_RETRY_S = 30.0


def migrate_storage_forever() -> None:
    """Until it is done or RUNTIME.stop is set: the pipelines' storage-version migration
    (`storage_version.migrate`), by the leader; after an error, again 30 s later."""
    wait = STORAGE_MIGRATION_FIRST_S
    while not RUNTIME.stop.wait(wait):
        wait = STORAGE_MIGRATION_RETRY_S
        if RUNTIME.leader is not None and not RUNTIME.leader.is_leader():
            continue
        try:
            done = storage_version.migrate(_kube(), RUNTIME.namespaces)
        except ApiException as exc:
            if exc.status == 403:
                log.warning(
                    "cannot move the DedupPipelines to the storage version %s: %s (the "
                    "chart's RBAC grants it; docs/operations.md#rbac)",
                    names.STORAGE_VERSION,
                    exc.reason,
                )
                return
            log.warning("storage-version migration: %s; again in %.0fs", exc.reason, wait)
            continue
        except NotLeader:
            continue
        except Exception as exc:  # the API server unreachable a while: the thread stays
            log.warning("storage-version migration: %s; again in %.0fs", exc, wait)
            continue
        log.info("storage-version migration: %s", done.why)
        if done.why != storage_version.UNFINISHED:
            return


def list_forever(scheduler: PassScheduler) -> None:
    """Until RUNTIME.stop is set, list the pipelines every interval and keep the
    scheduler's set to them: a new one gets a pass at once, a deleted one none (except
    while our finalizers are on it: its taints and topic are cleaned up by passes). The
    scheduler runs each pipeline's passes at its own due times (`pass_queue`)."""
    kube = _kube()
    while True:
        try:
            pipelines = kube.pipelines(RUNTIME.namespaces)
        except Exception as exc:
            log.error("cannot list pipelines: %s", exc)
        else:
            scheduler.keep_only(
                (body["metadata"]["namespace"], body["metadata"]["name"])
                for body in pipelines
                if not body["metadata"].get("deletionTimestamp")
                or set(body["metadata"].get("finalizers") or []) & OUR_FINALIZERS
            )
        if RUNTIME.stop.wait(RUNTIME.settings.interval_s):
            return


def connection_info(api: ApiClient, trust_env: bool = False) -> kopf.ConnectionInfo:
    """kopf's credentials from the operator's own API client configuration, so that kopf
    reaches the server the rest of the operator reaches, by the same rules."""
    cfg = api.configuration
    # the bearer token: BearerToken in newer clients, authorization in older ones; the
    # in-cluster config's refresh hook re-reads the projected token file on the way
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else None)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        trust_env=trust_env,
    )


@kopf.on.login()
def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """Log in as the operator's own client does (`kube.api_client`): the kubeconfig the
    CLI was given (KUBECONFIG), else the pod's service account at the address the kubelet
    gives (KUBERNETES_SERVICE_HOST/PORT) with the pod's token and CA. Not kopf's
    `login_with_service_account`, which asks https://kubernetes.default.svc: that name
    needs cluster DNS, and without it kopf gave up after 9 attempts and the operator
    exited (a crash loop on clusters without that name). Called again on a 401."""
    return connection_info(api_client(os.environ.get("KUBECONFIG")), settings.networking.trust_env)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # kopf's bookkeeping goes in annotations: the status schema is ours alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="dedup.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="dedup.io", key="last-handled-configuration"
    )
    settings.persistence.finalizer = names.FINALIZER_RETAIN_VOLUMES
    settings.posting.enabled = False  # our Events are posted by `recorder`
    # No runtime observation of CRDs and namespaces: the watched namespaces are exact
    # names (-n) or all (-A), and the CRD was checked by the preflight. Without it kopf
    # would list/watch every namespace and CRD, which the chart's RBAC does not grant.
    settings.scanning.disabled = True
    settings.watching.server_timeout = 60
    settings.networking.request_timeout = 30
    RUNTIME.stop.clear()
    if RUNTIME.leader is not None:
        RUNTIME.leader.start()
    scheduler = PassScheduler(run_pass, RUNTIME.pass_threads)
    RUNTIME.scheduler = scheduler
    scheduler.start()
    threading.Thread(target=list_forever, args=(scheduler,), name="resync", daemon=True).start()
    threading.Thread(target=wake_forever, name="wakeups", daemon=True).start()
    threading.Thread(target=migrate_storage_forever, name="storage-version", daemon=True).start()


@kopf.on.cleanup()
def stop_resync(**_: Any) -> None:
    RUNTIME.stop.set()
    if RUNTIME.scheduler is not None:
        RUNTIME.scheduler.stop()
    if RUNTIME.kube is not None:
        RUNTIME.kube.stop_posting_events()  # the last passes' Events, while still leader
    if RUNTIME.leader is not None:
        RUNTIME.leader.stop()


@kopf.on.resume(names.GROUP, names.VERSION, names.PLURAL)
@kopf.on.create(names.GROUP, names.VERSION, names.PLURAL)
@kopf.on.update(names.GROUP, names.VERSION, names.PLURAL, field="spec")
def on_change(name: str, namespace: str | None, **_: Any) -> None:
    assert namespace is not None  # DedupPipelines are namespaced
    # A pass at once, in kopf's handler thread, not queued to the scheduler: kopf writes
    # its bookkeeping annotations on the pipeline after the handler returns, and a pass
    # running meanwhile would lose its status write to that (a Conflict), and tell its
    # first-seen problems again on the next pass. One at a time per pipeline still: every
    # pass holds the pipeline's memory lock.
    reconcile_one(_kube(), namespace, name)


def _retains_volumes(spec: Mapping[str, Any], **_: Any) -> bool:
    return bool((spec.get("storage") or {}).get("retainOnDelete", True))


@kopf.on.delete(names.GROUP, names.VERSION, names.PLURAL, when=_retains_volumes)  # type: ignore[arg-type]
def keep_volumes(body: kopf.Body, name: str, namespace: str, uid: str, **_: Any) -> None:
    kube = _kube()
    kept = kube.release_volume_claims(namespace, name)
    RUNTIME.memories.forget(namespace, name)
    if kept:
        kube.event(body, *events.volumes_retained(kept))
