"""Which ownership generation a pipeline's workers run, decided from its status (pure).

Under ownership each id has one owner, `owner(id) = (murmur2(id) & 0x7fffffff) % workers`
(`dedup_worker.ownership`): worker w reads input partitions i with i % workers == w and
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
  partitions) under condition `OwnershipOff`, until the switch exists. The decision is
  recorded as `status.ownership = {enabled: false}` with the first status written after
  it: the partition entries it was read from are rewritten from the pods each pass (a
  pipeline whose pods are all gone would otherwise look new).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from dedup_operator.spec import PipelineSpec
from dedup_operator.status import Condition

STATUS_KEY: Final = "ownership"
RESHARD_PENDING: Final = "ReshardPending"
OFF: Final = {"enabled": False}  # status.ownership of a pipeline that ran before it
OWNERSHIP_OFF: Final = "OwnershipOff"


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


def ran_before(previous: Mapping[str, Any]) -> bool:
    """Whether the status shows workers started: some partition had a pod (epoch >= 1)."""
    for entry in previous.get("partitions") or []:
        if int(entry.get("epoch") or 0) > 0 or entry.get("pod"):
            return True
    return False


def decide(spec: PipelineSpec, previous: Mapping[str, Any]) -> OwnershipState:
    """The ownership state of a pipeline whose spec is `spec` and status `previous`."""
    recorded = previous.get(STATUS_KEY) or None
    if recorded and recorded.get("enabled") is not False:
        workers = int(recorded.get("workers") or spec.partitions)
        running = replace(spec, partitions=workers, ownership=True)
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
        return OwnershipState(running, dict(recorded), None, condition)
    if recorded or ran_before(previous):  # recorded: {enabled: false}
        return OwnershipState(
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
                "partitions. Switching it to ownership (one owner per id, misrouted records "
                "forwarded) is not available yet; its workers keep running as they are.",
            ),
        )
    return OwnershipState(
        replace(spec, ownership=True),
        None,
        {"workers": spec.partitions, "reshards": 0},
        None,
    )
