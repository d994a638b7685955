"""What one operator process remembers between reconcile passes (all of it re-derivable).

- `PipelineMemory`: one pipeline's (its pass lock, when its objects were last ensured,
  its cached topic check, its workers' counters as last scraped, what was told once).
  Owned by the caller of `reconcile.reconcile` (the handlers' runtime keeps one per
  (namespace, name) in `PipelineMemories`) and passed in to every pass; `recalled` is
  the snapshot the decide step reads.
- `LeaseWatch`: the process's own view of Lease renewals, shared by every pipeline: when
  it saw each Lease (partitions', nodes') change, on its monotonic clock (a Lease has
  run out once unchanged for its duration: dedup_contract.lease_clock), and since when
  it has seen the node heartbeats without a gap. A restarted operator starts empty, so
  every held Lease is fresh at first sight: it waits a full duration (nodeLostAfter for
  a node) before acting on one. Safe, and that slow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from dedup_contract.lease_clock import ContinuousView, LeaseClock
from dedup_operator.observed import observe_lease
from dedup_operator.status_records import ScrapedCounters
from dedup_operator.topics import TopicCheck

# Without a watch, node heartbeats read more than this apart break the unbroken view:
# a heartbeat is never older than the view (after a control-plane outage no node is to
# blame for the renewals nobody could write).
HEARTBEAT_GAP_S = 15.0
NODE_VIEWS_S = 0.25  # how long the nodes as judged serve the passes: a node-loss judgement
# (nodeLostAfter, 20 s by default) is at most this late

# (the spec fields the check depends on, monotonic time of the check, the check)
TopicMemory = tuple[tuple[Any, ...], float, TopicCheck]


@dataclass(frozen=True)
class Recalled:
    """A pass's snapshot of its pipeline's memory: what the decide step reads of it."""

    # (generation, seconds since) the pipeline's own objects were last ensured
    ensured: tuple[int, float] | None = None
    audit_unreadable: str | None = None  # the unreadable-summary message already told
    switch_ignored_told: bool = False  # the ignored switch annotation was told
    topic_told: str | None = None  # the failing TopicReady reason told as an ERROR
    applied: str | None = None  # the digest of the pipeline's own objects as written


@dataclass
class PipelineMemory:
    """What the process remembers of one pipeline; passes over it hold `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    uid: str | None = None
    ensured: tuple[int, float] | None = None  # (generation, monotonic time)
    topic: TopicMemory | None = None
    audit_unreadable: str | None = None  # the last unreadable-summary message (said once)
    switch_ignored_told: bool = False  # the ignored switch annotation was told (once)
    # the failing TopicReady reason told as an ERROR line (once per reason, even when the
    # status that records it was not written: a pass abandoned on a Conflict)
    topic_told: str | None = None
    counters: ScrapedCounters | None = None  # the workers' counters, as last scraped
    applied: str | None = None  # the digest of its own objects as this process wrote them
    steps_in_a_row: int = 0  # passes in a row followed at once (handlers.next_pass_in)

    def meet(self, uid: str) -> None:
        """The pipeline as a pass reads it: a new one of the same name (another uid)
        has its objects ensured and its topics checked afresh."""
        if self.uid != uid:
            self.uid, self.ensured, self.topic, self.counters = uid, None, None, None
            self.topic_told = None
            self.switch_ignored_told = False
            self.applied = None

    def recalled(self, monotonic: float) -> Recalled:
        ensured = self.ensured
        return Recalled(
            ensured=None if ensured is None else (ensured[0], monotonic - ensured[1]),
            audit_unreadable=self.audit_unreadable,
            switch_ignored_told=self.switch_ignored_told,
            topic_told=self.topic_told,
            applied=self.applied,
        )


class PipelineMemories:
    """Every pipeline's memory in this process, by (namespace, name); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_pipeline: dict[tuple[str, str], PipelineMemory] = {}

    def of(self, namespace: str, name: str) -> PipelineMemory:
        with self._lock:
            return self._by_pipeline.setdefault((namespace, name), PipelineMemory())

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._by_pipeline.pop((namespace, name), None)


class LeaseWatch:
    """This process's Lease clock and unbroken view of the node heartbeats, and the
    nodes as last judged (`node_views`: shared by the passes of every pipeline)."""

    def __init__(self) -> None:
        self.lease_clock = LeaseClock()
        self.heartbeat_view = ContinuousView(HEARTBEAT_GAP_S)
        self._lock = threading.Lock()
        # nodeLostAfter -> (when judged, the operator's node writes by then, the views)
        self._node_views: dict[timedelta, tuple[float, int, dict[str, Any]]] = {}

    def node_views(
        self,
        lost_after: timedelta,
        judge: Callable[[], dict[str, Any]],
        now: float,
        written: int = 0,
    ) -> dict[str, Any]:
        """The nodes judged by `judge()` for `lost_after`, or as judged less than
        NODE_VIEWS_S ago (a pass of each of a hundred pipelines every few seconds would
        otherwise judge every node each time) and since the operator's last node write
        (`written`: how many it made; `Kube.node_writes`); a copy the caller may change."""
        with self._lock:
            held = self._node_views.get(lost_after)
        if held is None or now - held[0] >= NODE_VIEWS_S or held[1] != written:
            held = (now, written, judge())
            with self._lock:
                self._node_views[lost_after] = held
        return dict(held[2])

    def observe_lease(self, lease: Mapping[str, Any]) -> None:
        """A node heartbeat or partition Lease as the watch delivers it: its renewal noted
        on the Lease clock when it happens, not at the next pass (up to an interval later,
        which would be added to every node-loss and expiry judgement)."""
        observe_lease(lease, self.lease_clock)

    def heartbeats_watched_for(self, watched_since: float | None) -> timedelta:
        """How long the heartbeats have been seen without a gap, counting this read;
        `watched_since`: the watch's unbroken start (None: no watch)."""
        return timedelta(seconds=self.heartbeat_view.looked(since=watched_since))
