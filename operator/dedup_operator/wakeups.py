"""What calls for a pipeline's pass before its resync (pure; `now` passed in, on the
monotonic clock). The handlers' shell feeds it the watches' events and asks it, a few
times a second, which silent nodes are due.

A pipeline *at rest* (`pass_outcome.Rest`, `plan.Plan.at_rest`: nothing pending that
time alone resolves) has its next pass at the resync (`--resync-interval`), unless
something it reads changes first:

* one of its worker pods or volume claims is added, changed or deleted; one of its
  partition Leases changes hands (holder, transitions) or goes: a renewal is not a
  change (the Lease clock notes it, `memory.LeaseWatch`); the pipeline itself changes
  (spec, metadata), not its status alone (which the operator writes);
* a node its workers run on changes in what a pass judges of it (`node_judged`: Ready,
  taints, cordon, the operator's taint marks);
* a node its workers run on has been silent for the pipeline's nodeLostAfter: no
  renewal of its heartbeat seen since (a timer, re-armed by each renewal);
* a watch lists its kind again (410, a broken connection): what it missed is unknown.

A pipeline not at rest (*busy*: a handover, a pod starting, a volume detaching) passes
at its interval or sooner, as it asks; a VolumeAttachment deleted (a volume detached)
calls for the pass of the pipeline whose claim is bound to that volume (`volume_owner`),
or of every busy pipeline where that is not known (the claims not in sync). As
controller-runtime's watches enqueue a reconcile for the object an event maps to, with
a periodic resync behind them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dedup_contract import names
from dedup_operator.cache import SYNCED
from dedup_operator.pass_outcome import Rest

Key = tuple[str, str]
"""A pipeline: (namespace, name)."""

Obj = Mapping[str, Any]

PIPELINE_KINDS = frozenset({"pods", "volumeclaims"})  # any change wakes their pipeline


def pipeline_of(obj: Obj) -> Key | None:
    """The pipeline a worker pod, volume claim or partition Lease belongs to: its
    namespace and `dedup.io/pipeline` label (None: no such label)."""
    meta = obj.get("metadata") or {}
    pipeline = (meta.get("labels") or {}).get(names.LABEL_PIPELINE)
    return (str(meta.get("namespace") or ""), str(pipeline)) if pipeline else None


def changed_hands(held: Obj | None, obj: Obj | None) -> bool:
    """A Lease added, deleted, or given to another holder or epoch (not a renewal)."""
    if held is None or obj is None:
        return True
    a, b = held.get("spec") or {}, obj.get("spec") or {}
    return (a.get("holderIdentity"), a.get("leaseTransitions")) != (
        b.get("holderIdentity"),
        b.get("leaseTransitions"),
    )


def node_judged(node: Obj) -> tuple[Any, ...]:
    """What a pass judges of a Node besides its heartbeat: its Ready condition's status,
    its taints, its cordon and the operator's taint marks (`observed.node_view`)."""
    status = node.get("status") or {}
    spec = node.get("spec") or {}
    ready = next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    taints = sorted(
        (str(t.get("key")), str(t.get("value")), str(t.get("effect")))
        for t in spec.get("taints") or []
    )
    marks = ((node.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_TAINT_BY)
    return (ready, tuple(taints), bool(spec.get("unschedulable")), marks)


def pipeline_changed(held: Obj | None, obj: Obj | None) -> bool:
    """A DedupPipeline added, deleted, or changed other than in its status alone."""
    if held is None or obj is None:
        return True

    def shape(o: Obj) -> tuple[Any, ...]:
        meta = o.get("metadata") or {}
        return (
            meta.get("generation"),
            meta.get("deletionTimestamp"),
            tuple(meta.get("finalizers") or ()),
            tuple(sorted((meta.get("annotations") or {}).items())),
            tuple(sorted((meta.get("labels") or {}).items())),
        )

    return shape(held) != shape(obj)


@dataclass
class Wakeups:
    """The pipelines at rest and the nodes they wait on; the busy ones; the node timers."""

    _resting: dict[Key, Rest] = field(default_factory=dict)
    _on_node: dict[str, set[Key]] = field(default_factory=dict)  # node -> resting there
    _busy: set[Key] = field(default_factory=set)
    _renewed: dict[str, float] = field(default_factory=dict)  # node -> heartbeat last seen
    # (due, order, node, nodeLostAfter, the heartbeat it was armed from): lazily dropped
    _timers: list[tuple[float, int, str, float, float | None]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)
    # The pipeline a VolumeAttachment's volume is claimed by (None: not known). A node
    # lost with 20 pipelines' volumes detached 20 of them, each waking all 20 handing
    # over: 400 passes that found nothing new, queued before those that would.
    volume_owner: Callable[[Obj], Key | None] | None = None

    # --------------------------------------------------------- after each pass
    def rested(self, key: Key, rest: Rest, now: float) -> None:
        """`key`'s pass left it at rest: wake it when a node of its workers has been
        silent for its nodeLostAfter (counted from the silence its pass judged, or from
        the last heartbeat seen if that came later: a renewal between the pass's
        judgement and its end would otherwise arm a timer that fires at the next
        renewal's due time, a spurious pass whenever that renewal is late)."""
        self._leave(key)
        self._busy.discard(key)
        self._resting[key] = rest
        for node, silent in rest.nodes.items():
            self._on_node.setdefault(node, set()).add(key)
            if silent is not None:
                at = now + max(0.0, rest.lost_after_s - silent)
                renewed = self._renewed.get(node)
                if renewed is not None:  # a heartbeat seen after the pass judged the node
                    at = max(at, renewed + rest.lost_after_s)
                self._arm(node, rest.lost_after_s, at)

    def busy(self, key: Key) -> None:
        """`key`'s pass left something pending: it passes at its interval or sooner."""
        self._leave(key)
        self._busy.add(key)

    def forget(self, key: Key) -> None:
        self._leave(key)
        self._busy.discard(key)

    def resting(self) -> int:
        return len(self._resting)

    # ------------------------------------------------------------ from watches
    def heartbeat(self, node: str, now: float) -> None:
        """A node's heartbeat Lease seen renewed at `now`: its timers start again."""
        self._renewed[node] = now
        for lost_after in {self._resting[k].lost_after_s for k in self._on_node.get(node, ())}:
            self._arm(node, lost_after, now + lost_after)

    def on_event(self, kind: str, event: str, held: Obj | None, obj: Obj | None) -> set[Key]:
        """The pipelines a watch event of `kind` calls a pass for: `event` is ADDED,
        MODIFIED, DELETED or SYNCED (listed again: every pipeline); `held` what the watch
        held before (None: nothing), `obj` the object (None with SYNCED)."""
        if event == SYNCED:
            return set(self._resting) | self._busy
        subject = obj if obj is not None else held
        if subject is None:
            return set()
        if kind in PIPELINE_KINDS or (kind == "leases" and changed_hands(held, obj)):
            key = pipeline_of(subject)
            return {key} if key is not None else set()
        if kind == "pipelines" and pipeline_changed(held, obj):
            meta = subject.get("metadata") or {}
            return {(str(meta.get("namespace") or ""), str(meta.get("name")))}
        if kind == "nodes" and (
            held is None or obj is None or node_judged(held) != node_judged(obj)
        ):
            return set(self._on_node.get(str((subject.get("metadata") or {}).get("name")), ()))
        if kind == "volumeattachments" and event == "DELETED":
            owner = self.volume_owner(subject) if self.volume_owner is not None else None
            return {owner} if owner is not None else set(self._busy)
        return set()

    # -------------------------------------------------------------- the timers
    def due(self, now: float) -> set[Key]:
        """The pipelines at rest on a node silent for their nodeLostAfter by `now`."""
        woken: set[Key] = set()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, node, lost_after, armed_from = heapq.heappop(timers)
            if self._renewed.get(node) != armed_from:
                continue  # renewed since: a later timer stands for it
            woken |= {
                k
                for k in self._on_node.get(node, ())
                if self._resting[k].lost_after_s == lost_after
            }
        return woken

    def next_due(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def _arm(self, node: str, lost_after: float, at: float) -> None:
        entry = (at, next(self._order), node, lost_after, self._renewed.get(node))
        heapq.heappush(self._timers, entry)

    def _leave(self, key: Key) -> None:
        rest = self._resting.pop(key, None)
        if rest is None:
            return
        for node in rest.nodes:
            keys = self._on_node.get(node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._on_node[node]
