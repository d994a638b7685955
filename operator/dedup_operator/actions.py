"""The actions of a reconcile pass's plan: what its act step applies, in order (plain data).

The decide step (`plan.py`) turns its decisions into these, every object, name and
Event they need already composed (`events.py`); the executor (`executor.py`) applies
each with the one function its type has. An Event that goes with a write whose outcome
matters (a pod created, a Lease fenced, a node tainted, a taint lifted) is the action's
own and is posted only when the write did something; every other Event is a `Tell`.

Not to be confused with `failover.PartitionAction`: that is one partition's decision
(fence, release, create a pod...), which the plan translates into these API steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dedup_operator.events import Event
from dedup_operator.observed import Obj
from dedup_operator.topics import OwnedTopicSettings, TopicCheck


# ------------------------------------------------------------------ told
@dataclass(frozen=True)
class Tell:
    """Post an Event on the pipeline (and its log line); `error`: the pipeline cannot
    keep its promise, the log line is an ERROR."""

    event: Event
    error: bool = False


@dataclass(frozen=True)
class Note:
    """A log line of the operator's only (no Event)."""

    level: int
    message: str


# ------------------------------------------------- the pipeline's own objects
@dataclass(frozen=True)
class EnsureObject:
    """Create the object unless one of its name exists (the pipeline's own objects, a
    partition's Lease, the audit's ServiceAccount, Role and RoleBinding)."""

    body: Obj


@dataclass(frozen=True)
class ReplaceRoleRules:
    body: Obj


@dataclass(frozen=True)
class ReplaceDisruptionBudget:
    """The workers' PodDisruptionBudget spec in step with the spec's."""

    body: Obj


@dataclass(frozen=True)
class ApplyAuditSchedule:
    """The scheduled audit's CronJob or ScheduledSparkApplication, replaced when its
    spec hash changed."""

    body: Obj


@dataclass(frozen=True)
class DeleteAuditObject:
    """One of the scheduled audit's objects, deleted if present."""

    kind: str
    namespace: str
    name: str


@dataclass(frozen=True)
class RememberObjectsEnsured:
    """The pipeline's own objects of `generation` are ensured (the next ensure is due
    after ReconcileSettings.ensure_s, or at once on a spec change); `applied`: the
    digest of what was written (`plan_objects.objects_applied`), for status.objectsApplied."""

    generation: int
    applied: str | None = None


@dataclass(frozen=True)
class CreateVolumeClaim:
    body: Obj
    created: Event


@dataclass(frozen=True)
class ResizeVolumeClaim:
    namespace: str
    name: str
    size: str
    resized: Event


@dataclass(frozen=True)
class AdoptAuditResult:
    """The audit's result ConfigMap gets the pipeline's owner reference (kept when it
    has it)."""

    namespace: str
    config_map: Obj
    owner_reference: Mapping[str, Any]


@dataclass(frozen=True)
class CountAuditResult:
    """A new audit result, in the operator's metrics."""

    namespace: str
    name: str
    passed: bool
    duplicates: int
    missing: int


@dataclass(frozen=True)
class RememberAuditUnreadable:
    """The unreadable audit summary told (None: the summary reads again)."""

    why: str | None


@dataclass(frozen=True)
class RememberSwitchIgnoredTold:
    """The ignored switch annotation was told (once per pipeline)."""


@dataclass(frozen=True)
class RememberTopicTold:
    """TopicReady failing for `reason` was told as an ERROR (None: it is ready again)."""

    reason: str | None


# ----------------------------------------------------------- the topics
@dataclass(frozen=True)
class TopicQuery:
    """How the pipeline's topics are read and checked (`observe.read_topic_facts`)."""

    bootstrap: str
    kafka_settings: Mapping[str, str]
    input_topic: str
    output_topic: str
    owned_topic: str | None  # None: not read (a pipeline without ownership)
    owned_user_named: bool
    partitions: int
    window_ms: int | None
    ownership: bool
    memory_key: tuple[Any, ...]  # the spec fields a remembered check holds for


@dataclass(frozen=True)
class RememberTopicCheck:
    """The topics' check read in this pass, remembered for topic_check_s."""

    memory_key: tuple[Any, ...]
    check: TopicCheck


@dataclass(frozen=True)
class CreateOwnedTopic:
    """Create the internal topic, then read the topics again until its metadata shows;
    the check of what was made is what the pipeline's memory holds next."""

    query: TopicQuery
    wanted: OwnedTopicSettings
    created: Event


@dataclass(frozen=True)
class DeleteOwnedTopic:
    """Delete a deleted pipeline's internal topic; when Kafka refuses, the line
    `refused: <why>` and nothing after this action is applied (the next pass retries)."""

    bootstrap: str
    kafka_settings: Mapping[str, str]
    topic: str
    deleted: Event
    refused: str


# ------------------------------------------------------- the pipeline object
@dataclass(frozen=True)
class SetFinalizer:
    """Add or remove one of the pipeline's finalizers; `guarded`: only on the version
    the pass read (or its own last write), else Conflict."""

    finalizer: str
    present: bool
    guarded: bool = True


@dataclass(frozen=True)
class ReleaseTaintFinalizer:
    """The taint finalizer goes when the pipeline relies on no taint any more (as
    acting left status.taintedNodes)."""


@dataclass(frozen=True)
class WriteHandoverRecord:
    """Persist the plan's record into the status before any partition's action;
    `fault_point`: the record holds handover entries (the test fault point
    `operator-before-handover-record` may stop the operator just before)."""

    record: Mapping[str, Any]
    fault_point: bool


# -------------------------------------------------------------- workers
@dataclass(frozen=True)
class CreateWorker:
    pod: Obj
    created: Event  # posted when this pass created it


@dataclass(frozen=True)
class DeleteWorkers:
    """Delete pods, each only while it has the uid seen (None: any); `deleted`: the
    Event that says so."""

    namespace: str
    pods: tuple[tuple[str, str | None], ...]  # (name, uid)
    force: bool
    deleted: Event | None


@dataclass(frozen=True)
class FenceWorkerLease:
    """Clear the holder of a Lease that ran out, compare-and-set on `resource_version`."""

    namespace: str
    lease: str
    resource_version: str | None
    fenced: Event  # posted when the holder was cleared


@dataclass(frozen=True)
class CountHandoverBegun:
    namespace: str
    name: str
    reason: str


@dataclass(frozen=True)
class CountHandoverCompleted:
    namespace: str
    name: str
    partition: int
    reason: str
    steps: Mapping[str, float]


# ---------------------------------------------------------------- nodes
@dataclass(frozen=True)
class MarkOutOfService:
    """Taint a lost node out-of-service (or mark the taint there as relied on too) with
    the pipeline's mark; when someone else's taint got there first the node is off the
    pipeline's list."""

    node: str
    mark: str
    marked: Event


@dataclass(frozen=True)
class LiftOutOfService:
    """Remove the pipeline's mark from a node's out-of-service taint (the taint with the
    last mark)."""

    node: str
    mark: str
    lifted: Event


PassAction = (
    Tell | Note | EnsureObject | ReplaceRoleRules | ReplaceDisruptionBudget
    | ApplyAuditSchedule | DeleteAuditObject | RememberObjectsEnsured | CreateVolumeClaim
    | ResizeVolumeClaim | AdoptAuditResult | CountAuditResult | RememberAuditUnreadable
    | RememberSwitchIgnoredTold | RememberTopicTold | RememberTopicCheck | CreateOwnedTopic
    | DeleteOwnedTopic
    | SetFinalizer | ReleaseTaintFinalizer | WriteHandoverRecord | CreateWorker | DeleteWorkers
    | FenceWorkerLease | CountHandoverBegun | CountHandoverCompleted | MarkOutOfService
    | LiftOutOfService
)  # fmt: skip
