"""What one reconcile pass did, as its caller sees it (`reconcile.reconcile` returns it).

The caller schedules the pipeline's next pass by `requeue_after` (or, for a pipeline at
`rest`, when something it reads changes: `dedup_operator.wakeups`) and keeps
per-pipeline state (its `memory.PipelineMemory`) by `pipeline`; an Outcome says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rest:
    """A pipeline with nothing pending that time alone resolves (`plan.Plan.at_rest`):
    what can still call for its next pass before the resync. Its workers' nodes, each
    with how long its heartbeat had been silent as this pass judged it (None: no node
    Lease, the Ready condition decides), and its `nodeLostAfter`: a node silent that
    long is lost, with nothing else changing."""

    nodes: Mapping[str, float | None]
    lost_after_s: float


@dataclass(frozen=True)
class Outcome:
    pipeline: tuple[str, str]  # (namespace, name)
    # ok | invalid_spec | conflict | not-leader (the reconciles metric's result label);
    # gone (not found), deleting (deleted, none of our finalizers), finalizing (ours
    # still on it: the next pass tries again), finalized (ours removed)
    result: str
    actions: tuple[str, ...] = ()  # the kinds of the actions applied, in order
    # seconds until the next pass is due (0: at once, a handover's next step); None:
    # the regular interval
    requeue_after: float | None = None
    status: Mapping[str, Any] | None = None  # the status the pass composed
    rest: Rest | None = None  # at rest (None: something is pending, or not an "ok" pass)

    @property
    def finalized(self) -> bool:
        """The deleted pipeline let go: what the process remembers of it can go too."""
        return self.result == "finalized"
