"""Which ownership generation a pipeline's workers run, decided from its status (pure).

Under ownership each id has one owner, `owner(id) = (murmur2(id) & 0x7fffffff) % workers`
(`dedup_contract.ownership`): worker w reads input partitions i with i % workers == w and
internal-topic partitions q with q % workers == w, publishes the ids it owns to output
partition w, and forwards the others through the internal topic. The worker count is
fixed once workers started (`status.ownership = {workers, reshards: 0}`, recorded before
a new pipeline's first worker; a later spec.partitions change: `ReshardPending`). A
pipeline whose workers ran before ownership keeps them as they were under `OwnershipOff`
(`status.ownership = {enabled: false}`) until it is switched (docs/design.md, "The
guarantee and what it assumes").

The switch (annotation `dedup.io/switch-to-ownership: "true"`, `dedupctl
switch-ownership`) is one step for the whole pipeline and one way: no worker starts under
ownership before every old one is stopped (docs/operations.md, "Switching a pipeline to
ownership"). Its phases (`SwitchPhase`):

1. `Begin`: `status.ownership = {enabled: false, switching: true}` and a handover of
   reason `OwnershipSwitch` for every partition are recorded before any action;
2. `Stopping`: each handover runs as a planned one up to, not including, starting the
   replacement (`stop_for_switch`); once every partition is there (`all_stopped`) the
   pass records `{workers: spec.partitions, reshards: 0, switched: <time>}`
   (`switched_record`), still starting nothing;
3. `Starting`: the internal topic is created, then every worker starts under ownership at
   its next epoch with DEDUP_OWNERSHIP_SWITCH=true (`PipelineSpec.ownership_switch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from dedup_contract.handover import STARTED, HandoverReason
from dedup_contract.ownership_status import OWNERSHIP_SWITCHING, STATUS_KEY, ran_before
from dedup_contract.timefmt import format_time
from dedup_operator.failover import (
    CreatePod,
    Decision,
    FailoverPolicy,
    PartitionObservation,
    Steady,
    begin_handover,
    partition_action,
)
from dedup_operator.spec import PipelineSpec
from dedup_operator.status_records import Condition

RESHARD_PENDING: Final = "ReshardPending"
OFF: Final = {"enabled": False}  # status.ownership of a pipeline that ran before it
OWNERSHIP_OFF: Final = "OwnershipOff"
# status.ownership while an OwnershipOff pipeline's workers are stopped for the switch
SWITCHING: Final = {"enabled": False, "switching": True}


class SwitchPhase(StrEnum):
    """Where the switch of an OwnershipOff pipeline to ownership stands."""

    BEGIN = "Begin"  # asked (the annotation) on an OwnershipOff pipeline: recorded now
    STOPPING = "Stopping"  # recorded: every worker stopped and fenced, none started
    STARTING = "Starting"  # ownership recorded (switched): workers start under it


@dataclass(frozen=True)
class OwnershipState:
    """What the pass renders the workers from, and what it says about it."""

    spec: PipelineSpec  # the spec as the workers run it (partitions = workers)
    # status.ownership to keep: as read, or {enabled: false} for a pipeline that ran
    # before ownership; None: a new pipeline before its first worker
    recorded: Mapping[str, Any] | None
    # status.ownership to write before the first worker is created (new pipelines only)
    to_record: Mapping[str, Any] | None
    condition: Condition | None  # ReshardPending or OwnershipOff
    switch: SwitchPhase | None = None  # the switch to ownership in progress, if any
    # the switch annotation on a pipeline already under ownership: ignored (an Event)
    switch_ignored: bool = False


def decide(
    spec: PipelineSpec, previous: Mapping[str, Any], switch_asked: bool = False
) -> OwnershipState:
    """The ownership state of a pipeline whose spec is `spec` and status `previous`;
    `switch_asked`: the pipeline carries `dedup.io/switch-to-ownership: "true"`."""
    recorded = previous.get(STATUS_KEY) or None
    if recorded and recorded.get("enabled") is not False:
        workers = int(recorded.get("workers") or spec.partitions)
        switched = bool(recorded.get("switched"))
        running = replace(spec, partitions=workers, ownership=True, ownership_switch=switched)
        condition = None
        if spec.partitions != workers:
            condition = Condition(
                RESHARD_PENDING,
                True,
                "WorkerCountFixed",
                f"spec.partitions is {spec.partitions}, the pipeline runs {workers} workers "
                f"(status.ownership.workers): the worker count cannot change yet (resharding "
                f"is not available), so the {workers} workers keep running unchanged. The "
                f"input topic can grow freely: worker w reads every input partition i with "
                f"i % {workers} == w, new ones included.",
            )
        phase = SwitchPhase.STARTING if switched and _still_switching(previous) else None
        return OwnershipState(
            running,
            dict(recorded),
            None,
            condition,
            switch=phase,
            switch_ignored=switch_asked and not switched,
        )
    if recorded or ran_before(previous):  # recorded: {enabled: false[, switching: true]}
        off = OwnershipState(
            replace(spec, ownership=False),
            OFF,
            None,
            Condition(
                OWNERSHIP_OFF,
                True,
                "PreOwnershipPipeline",
                "this pipeline's workers started before ownership existed: worker p "
                "publishes the ids of input partition p, so each id is published once only "
                "if every producer keys records by the id with Kafka's murmur2 partitioner "
                f"and the input topic has exactly spec.partitions ({spec.partitions}) "
                "partitions. Switch it to ownership (one owner per id, misrouted records "
                f"forwarded) with `dedupctl switch-ownership {spec.name} -n {spec.namespace}` "
                '(annotation dedup.io/switch-to-ownership: "true"): every worker stops, '
                "then all start under ownership; the output pauses meanwhile. One way.",
            ),
        )
        if recorded and recorded.get("switching"):
            return replace(off, recorded=SWITCHING, switch=SwitchPhase.STOPPING)
        if switch_asked:
            return replace(off, to_record=SWITCHING, switch=SwitchPhase.BEGIN)
        return off
    return OwnershipState(
        replace(spec, ownership=True),
        None,
        {"workers": spec.partitions, "reshards": 0},
        None,
        switch_ignored=switch_asked,
    )


def _still_switching(previous: Mapping[str, Any]) -> bool:
    """Whether a switched pipeline's workers are still starting: the status still says
    OwnershipSwitching, or a partition's switch handover is in progress."""
    for c in previous.get("conditions") or []:
        if c.get("type") == OWNERSHIP_SWITCHING and c.get("status") == "True":
            return True
    return any(
        (entry.get("handover") or {}).get("reason") == HandoverReason.OWNERSHIP_SWITCH.value
        for entry in previous.get("partitions") or []
    )


@dataclass(frozen=True)
class HeldStart(Steady):
    """A partition stopped for the switch: its old worker is gone and fenced, its volume
    free; its replacement waits until every partition is there."""


HELD: Final = (
    "every worker of the pipeline to stop (switch to ownership: no worker starts before "
    "all the old ones are gone)"
)


def stop_for_switch(obs: PartitionObservation, policy: FailoverPolicy, now: datetime) -> Decision:
    """A partition's decision while the switch stops the workers (`Begin`, `Stopping`):
    a handover of reason OwnershipSwitch begins where none is in progress and a worker
    ran; every handover then carries on as usual (the old pods deleted gracefully, the
    Lease free or run out on the operator's clock and cleared, the volume detached) up
    to, not including, creating the replacement: that becomes `HeldStart`."""
    if obs.lease is not None and obs.handover is None:
        current = max(obs.pods, key=lambda v: v.epoch, default=None)
        if current is not None or obs.lease.epoch > 0 or obs.lease.holder:
            return begin_handover(HandoverReason.OWNERSHIP_SWITCH, current, obs, now)
    decision = partition_action(obs, policy, now)
    if not isinstance(decision.action, CreatePod):
        return decision
    h = decision.handover
    if h is not None:  # not started: the replacement is created later
        h = replace(h, steps={k: v for k, v in h.steps.items() if k != STARTED})
    return Decision(HeldStart(waiting_for=HELD), h)


def all_stopped(decisions: Mapping[int, Decision]) -> bool:
    """Every partition stopped for the switch: no old worker can commit again, and none
    has started under ownership."""
    return bool(decisions) and all(isinstance(d.action, HeldStart) for d in decisions.values())


def switched_record(workers: int, now: datetime) -> dict[str, Any]:
    """status.ownership once every worker stopped: the generation the workers start
    with, and when the pipeline was switched."""
    return {"workers": workers, "reshards": 0, "switched": format_time(now)}


def switching_condition(state: OwnershipState | None, workers_ready: bool) -> Condition | None:
    """OwnershipSwitching while the switch runs; None before it and once every worker
    is Ready under ownership (`workers_ready`, in the `Starting` phase)."""
    if state is None or state.switch is None:
        return None
    if state.switch == SwitchPhase.STARTING:
        if workers_ready:
            return None
        reason, now_doing = "StartingWorkers", "every old worker is stopped; the workers start"
    else:
        reason, now_doing = "StoppingWorkers", "the workers are being stopped"
    return Condition(
        OWNERSHIP_SWITCHING,
        True,
        reason,
        f"switching to ownership: all {state.spec.partitions} workers stop, then start under "
        f"ownership (the internal topic created first; each worker completes its store from "
        f"the output over the window); the output pauses meanwhile. Now: {now_doing}.",
    )
