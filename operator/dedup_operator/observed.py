"""Views of the API objects a failover decision reads, from their JSON form.

Pure conversions from the objects as the API server serves them (camelCase dicts: kopf
bodies, `ApiClient.sanitize_for_serialization(...)`, or raw watch events) to the small
frozen views of `dedup_operator.failover`. Missing fields read as the API's defaults.

Leases (the partitions', the nodes' in `kube-node-lease`) are the one exception to
"pure": their views say how long the operator has seen them unchanged, which only the
operator process can know. The caller passes its `LeaseClock` (the observation memory,
`dedup_contract.lease_clock`); without one every Lease reads as renewed just now.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from dedup_contract import names
from dedup_contract.exit_codes import EXIT_STORE
from dedup_contract.lease_clock import LeaseClock, LeaseStamp, is_free
from dedup_contract.store_format import STORE_TOO_NEW
from dedup_contract.timefmt import parse_time
from dedup_operator.failover import (
    OUT_OF_SERVICE_TAINT,
    SHUTDOWN_TAINT,
    AttachmentView,
    LeaseView,
    NodePod,
    NodeView,
    PodView,
)

Obj = Mapping[str, Any]


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def node_view(
    node: Obj,
    heartbeat: Obj | None = None,
    clock: LeaseClock | None = None,
    lost_after: timedelta | None = None,
    watched_for: timedelta | None = None,
) -> NodeView:
    """`heartbeat`: the node's Lease in kube-node-lease (None: not read, the Ready
    condition decides); `lost_after`: the policy's node_lost_after, for `heartbeat_stale`;
    `watched_for`: how long the operator's view of the heartbeats has been unbroken
    (`lease_clock.ContinuousView`): no heartbeat is older than that."""
    status = node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    taints = (node.get("spec") or {}).get("taints") or []
    by = (_meta(node).get("annotations") or {}).get(names.ANNOTATION_TAINT_BY) or ""
    age = None if heartbeat is None else lease_view(heartbeat, clock).unchanged_for
    if age is not None and watched_for is not None:
        age = min(age, watched_for)
    condition_age = None
    if heartbeat is None and clock is not None and ready is not None:
        # no heartbeat to read: the Ready condition's changes, on the operator's clock too
        stamp = LeaseStamp(
            str(ready.get("status")), parse_time(ready.get("lastTransitionTime")), None
        )
        seen = clock.observe(("node-ready", str(_meta(node)["name"])), stamp)
        condition_age = timedelta(seconds=seen)
    return NodeView(
        name=str(_meta(node)["name"]),
        ready=str(ready.get("status", "Unknown")) if ready else "Unknown",
        ready_since=parse_time(ready.get("lastTransitionTime")) if ready else None,
        out_of_service=any(t.get("key") == OUT_OF_SERVICE_TAINT for t in taints),
        shut_down=any(t.get("key") == SHUTDOWN_TAINT for t in taints),
        cordoned=bool((node.get("spec") or {}).get("unschedulable")),
        tainted_by=taint_owners(by),
        heartbeat_age=age,
        heartbeat_stale=age is not None and lost_after is not None and age >= lost_after,
        condition_age=condition_age,
    )


def taint_owners(annotation: str | None) -> tuple[str, ...]:
    """The pipelines named in a node's `dedup.io/out-of-service-taint-by` annotation."""
    return tuple(sorted({o.strip() for o in (annotation or "").split(",") if o.strip()}))


def tolerates_out_of_service(pod: Obj) -> bool:
    """Does the pod tolerate `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`
    for ever (a toleration with tolerationSeconds is evicted when they are up)?"""
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        key, op = t.get("key") or "", t.get("operator") or "Equal"
        if key not in ("", OUT_OF_SERVICE_TAINT) or (not key and op != "Exists"):
            continue
        if op == "Equal" and (t.get("value") or "") != "nodeshutdown":
            continue
        if t.get("effect") not in (None, "", "NoExecute") or t.get("tolerationSeconds") is not None:
            continue
        return True
    return False


def worker_lease_name(pod: Obj) -> str | None:
    """The Lease of a dedup worker pod (by its labels), in the pod's namespace; None for
    any other pod."""
    labels = _meta(pod).get("labels") or {}
    if labels.get(names.LABEL_COMPONENT) != names.COMPONENT_WORKER:
        return None
    pipeline, partition = labels.get(names.LABEL_PIPELINE), labels.get(names.LABEL_PARTITION)
    if not pipeline or partition is None or not str(partition).isdigit():
        return None
    return names.lease(str(pipeline), int(partition))


def node_pod(
    pod: Obj,
    worker_lease: Obj | None = None,
    worker: bool = False,
    clock: LeaseClock | None = None,
) -> NodePod:
    """A pod on a node as the out-of-service taint sees it; `worker` (with its Lease, None
    if it has none) only for a dedup worker whose Lease the caller could read."""
    meta = _meta(pod)
    owners = meta.get("ownerReferences") or []
    return NodePod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta["name"]),
        daemon_set=any(o.get("kind") == "DaemonSet" and o.get("controller") for o in owners),
        mirror="kubernetes.io/config.mirror" in (meta.get("annotations") or {}),
        tolerates_out_of_service=tolerates_out_of_service(pod),
        finished=(pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        worker=worker,
        worker_lease=(
            lease_view(worker_lease, clock) if worker and worker_lease is not None else None
        ),
    )


def pod_view(pod: Obj, epoch: int, spec_hash_annotation: str | None = None) -> PodView:
    """`epoch` comes from the pod's label (the operator's naming rule owns the key)."""
    meta = _meta(pod)
    status = pod.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    annotations = meta.get("annotations") or {}
    scheduled = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None
    )
    unschedulable = (
        scheduled is not None
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable"
    )
    return PodView(
        name=str(meta["name"]),
        epoch=epoch,
        node=(pod.get("spec") or {}).get("nodeName") or None,
        phase=str(status.get("phase") or "Pending"),
        ready=bool(ready and ready.get("status") == "True"),
        deleting=meta.get("deletionTimestamp") is not None,
        spec_hash=annotations.get(spec_hash_annotation) if spec_hash_annotation else None,
        unschedulable=(
            str(scheduled.get("message") or "Unschedulable")
            if scheduled and unschedulable
            else None
        ),
        unschedulable_since=(
            parse_time(scheduled.get("lastTransitionTime")) if scheduled and unschedulable else None
        ),
        ip=status.get("podIP") or None,
        uid=meta.get("uid"),
        store_too_new=store_too_new(status),
    )


def store_too_new(status: Obj) -> str | None:
    """The worker's refusal of a store that a newer release wrote, when its container's
    current or last termination was that refusal (exit code 5 and the `StoreTooNew` mark
    in its termination message, its last log lines): the refusal's text."""
    for container in status.get("containerStatuses") or []:
        if container.get("name") != names.CONTAINER:
            continue
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            terminated = state.get("terminated") or {}
            if terminated.get("exitCode") != EXIT_STORE:
                continue
            for line in reversed(str(terminated.get("message") or "").splitlines()):
                if STORE_TOO_NEW in line:
                    return _log_message(line)
    return None


def _log_message(line: str) -> str:
    """A worker's log line's message (its lines are JSON objects; else the line)."""
    try:
        record = json.loads(line)
    except ValueError:
        return line.strip()
    return str(record.get("message", line)).strip() if isinstance(record, dict) else line


def lease_view(lease: Obj, clock: LeaseClock | None = None) -> LeaseView:
    """The Lease, with how long `clock` (the operator's observation memory) has seen its
    (holder, renewTime, resourceVersion) unchanged; zero without a clock or at first
    sight. renewTime is never compared with the operator's wall clock."""
    spec = lease.get("spec") or {}
    meta = _meta(lease)
    stamp = _lease_stamp(spec, meta)
    duration_s = int(spec.get("leaseDurationSeconds") or 0)
    unchanged_s = 0.0
    if clock is not None:
        unchanged_s = clock.observe(_lease_key(meta), stamp)
    return LeaseView(
        holder=stamp.holder,
        epoch=int(spec.get("leaseTransitions") or 0),
        duration=timedelta(seconds=duration_s),
        unchanged_for=timedelta(seconds=unchanged_s),
        free=is_free(
            stamp.holder, stamp.renew_time, parse_time(spec.get("acquireTime")), duration_s
        ),
        resource_version=meta.get("resourceVersion"),
    )


def observe_lease(lease: Obj, clock: LeaseClock) -> None:
    """The Lease noted on `clock` as `lease_view` notes it, without the view: what the
    watches call at each renewal (200 a second at 1,000 partitions)."""
    meta = _meta(lease)
    clock.observe(_lease_key(meta), _lease_stamp(lease.get("spec") or {}, meta))


def _lease_key(meta: Obj) -> tuple[str, str]:
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _lease_stamp(spec: Obj, meta: Obj) -> LeaseStamp:
    """One renewal of the Lease (lease_clock.LeaseStamp): the one rule of what a change is."""
    return LeaseStamp(
        spec.get("holderIdentity") or None,
        parse_time(spec.get("renewTime")),
        meta.get("resourceVersion"),
    )


def attachment_view(va: Obj) -> AttachmentView:
    spec = va.get("spec") or {}
    return AttachmentView(
        name=str(_meta(va)["name"]),
        node=str(spec.get("nodeName", "")),
        attached=bool((va.get("status") or {}).get("attached")),
    )


def attachments_of(
    volume_attachments: Iterable[Obj], pv_name: str | None
) -> tuple[AttachmentView, ...]:
    """The VolumeAttachments of one PersistentVolume (none while the claim is unbound)."""
    if not pv_name:
        return ()
    return tuple(
        attachment_view(va)
        for va in volume_attachments
        if ((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName") == pv_name
    )
