"""The part of a pass's plan (`plan.py`) for the pipeline's own objects (pure): the
workers' ServiceAccount, Role, RoleBinding, Service and disruption budget, a volume
claim per partition (grown with spec.storage.size), the scheduled audit's objects
(`setup_actions`, with `objects_applied`, the digest status.objectsApplied records),
and the audit's result taken into the status (`plan_audit`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dedup_contract import names
from dedup_operator import audit_status, events
from dedup_operator.actions import (
    AdoptAuditResult,
    ApplyAuditSchedule,
    CountAuditResult,
    CreateVolumeClaim,
    DeleteAuditObject,
    EnsureObject,
    Note,
    PassAction,
    RememberAuditUnreadable,
    RememberObjectsEnsured,
    ReplaceDisruptionBudget,
    ReplaceRoleRules,
    ResizeVolumeClaim,
    Tell,
)
from dedup_operator.desired import partition as desired_partition
from dedup_operator.desired import scheduled_audit
from dedup_operator.desired.pipeline import disruption_budget, pipeline_objects, role
from dedup_operator.observe import PipelineObservation
from dedup_operator.settings import ReconcileSettings
from dedup_operator.spec import quantity
from dedup_operator.status_records import Condition


def objects_applied(obs: PipelineObservation) -> str:
    """A digest of the pipeline's own objects as this operator writes them (the
    workers' ServiceAccount, Role, RoleBinding, Service, budget, the scheduled audit's
    objects): recorded in `status.objectsApplied` once written, so that a new process
    (a restart, a new leader) writes nothing where they are what it would write."""
    spec, owner = obs.spec, obs.owner
    objects = [
        *pipeline_objects(spec, owner),
        role(spec, owner),
        disruption_budget(spec, owner),
        *(
            [
                *scheduled_audit.reconciliation_objects(spec, owner, obs.spark_operator),
                scheduled_audit.role(spec, owner),
            ]
            if spec.reconciliation is not None
            else []
        ),
    ]
    text = json.dumps(objects, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def setup_actions(obs: PipelineObservation, settings: ReconcileSettings) -> list[PassAction]:
    """The pipeline's own objects (on spec changes and every ensure_s; their Role's
    rules and the budget's minAvailable written on spec changes and at the process's
    first pass only, as they change with nothing else; not at the first pass when the
    status records them as this process would write them) and a volume claim per
    partition, grown when spec.storage.size grows (from the claims as read: the next
    pass sees those created here)."""
    spec, owner = obs.spec, obs.owner
    ensured = obs.recalled.ensured
    changed = ensured is None or ensured[0] != obs.generation
    actions: list[PassAction] = []
    digest = None
    if changed:
        digest = objects_applied(obs)
        if ensured is None and obs.previous.get("objectsApplied") == digest:
            # a new process (restart, new leader): as recorded, nothing to write; their
            # existence is checked every ensure_s from now on
            changed, digest = False, None
            actions.append(RememberObjectsEnsured(obs.generation))
    if changed or (ensured is not None and ensured[1] > settings.ensure_s):
        actions += [EnsureObject(o) for o in pipeline_objects(spec, owner)]
        if changed:  # a spec change, or this process's first pass: writes, so not timed
            actions.append(ReplaceRoleRules(role(spec, owner)))
            actions.append(ReplaceDisruptionBudget(disruption_budget(spec, owner)))
        actions += _audit_schedule(obs, cleanup=changed)
        actions.append(RememberObjectsEnsured(obs.generation, digest))
    for p in range(spec.partitions):
        claim_name = names.volume_claim(spec.name, p)
        claim = obs.claims.get(claim_name)
        if claim is None:
            body = desired_partition.volume_claim(spec, p, owner)
            actions.append(CreateVolumeClaim(body, events.volume_created(p, claim_name)))
            continue
        asked = (
            ((claim.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
        )
        if asked and quantity(asked) < quantity(spec.storage.size):
            size = spec.storage.size
            told = events.volume_resized(claim_name, asked, size)
            actions.append(ResizeVolumeClaim(spec.namespace, claim_name, size, told))
    return actions


def _audit_schedule(obs: PipelineObservation, cleanup: bool) -> list[PassAction]:
    """Keep the scheduled audit's objects in step with spec.reconciliation: the CronJob,
    or the ScheduledSparkApplication when the Spark operator's CRD is installed (the
    other one deleted, so installing the Spark operator later switches over); all of
    them deleted when the spec has no reconciliation (checked on spec changes and at
    start only: `cleanup`)."""
    spec, owner = obs.spec, obs.owner
    job = names.reconciliation_job(spec.name)
    kinds = ("CronJob", "ScheduledSparkApplication", "RoleBinding", "Role", "ServiceAccount")
    if spec.reconciliation is None:
        return [DeleteAuditObject(kind, spec.namespace, job) for kind in kinds] if cleanup else []
    actions: list[PassAction] = []
    for obj in scheduled_audit.reconciliation_objects(spec, owner, obs.spark_operator):
        if obj["kind"] not in ("CronJob", "ScheduledSparkApplication"):
            actions.append(EnsureObject(obj))
            continue
        actions.append(ApplyAuditSchedule(obj))
        other = "CronJob" if obj["kind"] != "CronJob" else "ScheduledSparkApplication"
        if other == "CronJob" or obs.spark_operator:  # the CRD may come or go
            actions.append(DeleteAuditObject(other, spec.namespace, job))
    actions.append(ReplaceRoleRules(scheduled_audit.role(spec, owner)))
    return actions


@dataclass(frozen=True)
class AuditPlan:
    actions: tuple[PassAction, ...]
    last: Mapping[str, Any] | None  # status.lastReconciliation after this pass
    condition: Condition | None


def plan_audit(obs: PipelineObservation) -> AuditPlan:
    """status.lastReconciliation after this pass: the previous one, or the audit's newer
    result (with its Event and metrics), plus the newest Spark operator run's state; the
    result ConfigMap adopted by the pipeline."""
    spec = obs.spec
    before = obs.previous.get("lastReconciliation") or None
    if spec.reconciliation is None:
        return AuditPlan((), before, None)
    name = names.reconciliation_result(spec.name)
    actions: list[PassAction] = []
    text = None
    config_map = obs.audit.config_map
    if config_map is not None:
        actions.append(AdoptAuditResult(spec.namespace, config_map, obs.owner.reference()))
        text = (config_map.get("data") or {}).get(names.RECONCILIATION_SUMMARY_KEY)
    try:
        out = audit_status.outcome(text, name, before, obs.audit.run)
    except audit_status.SummaryError as exc:
        actions += _audit_unreadable(obs, f"ConfigMap {name}: {exc}")
        out = audit_status.outcome(None, name, before, obs.audit.run)
    else:
        if obs.recalled.audit_unreadable is not None:
            actions.append(RememberAuditUnreadable(None))
    if out.new_result and out.last is not None:
        dup, missing = out.last["duplicates"], out.last["missing"]
        counted = CountAuditResult(spec.namespace, spec.name, bool(out.passed), dup, missing)
        actions += [Tell(events.audit_result(out.last)), counted]
    last = out.last if out.last is not None else before
    condition = audit_status.condition(last) if last and "time" in last else None
    return AuditPlan(tuple(actions), last, condition)


def _audit_unreadable(obs: PipelineObservation, why: str) -> list[PassAction]:
    """An unreadable audit summary, told once (until it changes or reads again)."""
    if obs.recalled.audit_unreadable == why:
        return []
    line = events.audit_unreadable_line(obs.spec.namespace, obs.spec.name, why)
    return [
        Note(logging.WARNING, line),
        Tell(events.reconciliation_unreadable(why)),
        RememberAuditUnreadable(why),
    ]
