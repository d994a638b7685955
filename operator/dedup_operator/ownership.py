"""Which ownership generation a pipeline's workers run, decided from its status (pure).

Under ownership each id has one owner, `owner(id) = (murmur2(id) & 0x7fffffff) % workers`
(`dedup_contract.ownership`): worker w reads input partitions i with i % workers == w and
internal-topic partitions q with q % workers == w, publishes the ids it owns to output
partition w, and forwards the others through the internal topic. The worker count is part
of every store and of the internal topic's layout, so it is fixed once workers started:

- a new pipeline gets ownership, with `workers = spec.partitions`; the operator records
  `status.ownership = {workers, reshards: 0}` before it creates the first worker (the
  plan's record, written before any action), and renders every worker from that record
  from then on;
- a later change of spec.partitions is refused until resharding exists: condition
  `ReshardPending`, the workers keep running with the recorded count (the input topic
  may grow freely meanwhile: worker i % workers reads a new partition i);
- a pipeline that ran before ownership existed (its status shows workers started, and
  no `status.ownership`) is not switched silently: its workers' stores are of the old
  format, which the new worker refuses, and an old and a new worker side by side would
  publish ids twice. It keeps its workers as they were (no DEDUP_OWNED_TOPIC /
  DEDUP_WORKERS, worker p reads input partition p, the input must have spec.partitions
  partitions) under condition `OwnershipOff` until it is switched. The decision is
  recorded as `status.ownership = {enabled: false}` with the first status written after
  it: the partition entries it was read from are rewritten from the pods each pass (a
  pipeline whose pods are all gone would otherwise look new).

The switch (annotation `dedup.io/switch-to-ownership: "true"`, `dedupctl
switch-ownership`) is one step for the whole pipeline and one way. An old and a new worker
side by side would publish an id twice (the old one to its own partition, the new one
through its owner), so no worker starts under ownership before every old one is stopped:

1. `Begin`: the pass records `status.ownership = {enabled: false, switching: true}` and a
   handover of reason `OwnershipSwitch` for every partition, before any action (Event
   `OwnershipSwitchStarted`, condition `OwnershipSwitching`);
2. `Stopping`: each partition's handover runs as a planned one (the old pod deleted
   gracefully, its Lease free or run out on the operator's clock and then cleared, its
   volume detached) up to, not including, starting the replacement
   (`stop_for_switch`). Once *every* partition is there (`all_stopped`), the pass records
   `status.ownership = {workers: spec.partitions, reshards: 0, switched: <time>}`
   (`switched_record`), still starting nothing;
3. `Starting`: the pipeline is under ownership: the internal topic is created as for a
   new pipeline (no worker starts without it), and the handovers start every worker
   under ownership at its next epoch, with DEDUP_OWNERSHIP_SWITCH=true (the worker
   completes its pre-ownership store: `PipelineSpec.ownership_switch`, kept from then
   on). `OwnershipSwitching` goes once every partition is Ready with no handover
   (Event `OwnershipSwitchCompleted`).

The annotation on a pipeline already under ownership is ignored (an Event says so); on a
switched one it has no further effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from dedup_contract.timefmt import format_time
from dedup_operator.failover import (
    CreatePod,
    Decision,
    FailoverPolicy,
    HandoverReason,
    PartitionObservation,
    Steady,
    begin_handover,
    partition_action,
)
from dedup_operator.spec import PipelineSpec
from dedup_operator.status import Condition

STATUS_KEY: Final = "ownership"
RESHARD_PENDING: Final = "ReshardPending"
OFF: Final = {"enabled": False}  # status.ownership of a pipeline that ran before it
OWNERSHIP_OFF: Final = "OwnershipOff"
# status.ownership while an OwnershipOff pipeline's workers are stopped for the switch
SWITCHING: Final = {"enabled": False, "switching": True}
OWNERSHIP_SWITCHING: Final = "OwnershipSwitching"


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


def ran_before(previous: Mapping[str, Any]) -> bool:
    """Whether the status shows workers started: some partition had a pod (epoch >= 1)."""
    for entry in previous.get("partitions") or []:
        if int(entry.get("epoch") or 0) > 0 or entry.get("pod"):
            return True
    return False


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
        h = replace(h, steps={k: v for k, v in h.steps.items() if k != "started"})
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
