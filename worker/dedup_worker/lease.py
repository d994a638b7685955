"""The partition Lease's rules, as pure decisions (no API server, no clocks of their own).

One `coordination.k8s.io/v1` Lease per partition fences its workers (docs/design.md, "The
partition Lease"):

- `spec.holderIdentity` is the pod holding it, `<pipeline>-p<N>-e<epoch>`;
- `spec.leaseTransitions` is the epoch: the worker started for epoch E writes E when it
  takes the Lease, so a worker of an older epoch can tell it was superseded;
- others judge expiry by `dedup_contract.lease_clock`: a full `leaseDurationSeconds` with no
  change seen, on the reader's own monotonic clock (never the holder's wall clock);
- the holder judges its own hold by its *monotonic* clock: held only while
  `now < (when the last successful renew request was sent) + renew deadline`, with the
  renew deadline shorter than the duration, so the holder stops committing before anyone
  else may consider the Lease expired (the margin absorbs clock-rate drift and the time
  between a `held()` check and the commit it guards); it then pauses, and resumes when a
  renew succeeds again at its own epoch (`Hold`, `next_state` below).

The shell that reads and writes the Lease (compare-and-set on `resourceVersion`) and
renews it in the background is `dedup_worker.fencing.LeaseToken`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum

from dedup_contract import lease_clock


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease the rules read and write."""

    holder: str | None
    transitions: int  # spec.leaseTransitions: the epoch of the last taker
    renew_time: datetime | None
    duration_s: int | None
    acquire_time: datetime | None = None
    resource_version: str | None = None

    def free(self) -> bool:
        """Nobody holds it: no holder, or released (`lease_clock.is_free`)."""
        return not self.duration_s or lease_clock.is_free(
            self.holder, self.renew_time, self.acquire_time, self.duration_s
        )

    def stamp(self) -> lease_clock.LeaseStamp:
        """What a reader's `LeaseClock` watches for changes."""
        return lease_clock.LeaseStamp(self.holder, self.renew_time, self.resource_version)

    def expired(self, unchanged_for_s: float) -> bool:
        """Free, or seen unchanged for its duration (`lease_clock.expired`, the operator's
        rule too)."""
        return lease_clock.expired(self.free(), unchanged_for_s, float(self.duration_s or 0))


@dataclass(frozen=True)
class Claim:
    """Who this worker is in the Lease and the epoch it was started for."""

    identity: str
    epoch: int
    duration_s: int

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("the holder identity must not be empty")
        if self.epoch < 1:
            raise ValueError(f"the epoch must be >= 1, got {self.epoch}")
        if self.duration_s < 1:
            raise ValueError(f"the lease duration must be >= 1s, got {self.duration_s}s")


@dataclass(frozen=True)
class Acquire:
    """Take (or re-take) the Lease: write `taken(...)` with compare-and-set."""


@dataclass(frozen=True)
class Wait:
    """Held, unexpired, by a worker of an older epoch: wait until it expires."""

    holder: str
    remaining_s: float  # with no change seen, on the reader's monotonic clock


@dataclass(frozen=True)
class Superseded:
    """A worker of this epoch or a newer one took the partition: never take it."""

    reason: str


Decision = Acquire | Wait | Superseded


def decide(lease: LeaseRecord, claim: Claim, unchanged_for_s: float) -> Decision:
    """What a worker starting for `claim` does about the observed `lease`, which it has
    seen unchanged for `unchanged_for_s` seconds on its own monotonic clock
    (`lease_clock.LeaseClock`: 0 at first sight)."""
    if lease.holder == claim.identity:
        if lease.transitions <= claim.epoch:
            return Acquire()  # ours already: a restart of the same pod's worker
        return Superseded(
            f"it names us ({claim.identity}) but with epoch {lease.transitions} > ours "
            f"({claim.epoch})"
        )
    if lease.transitions >= claim.epoch:
        by = f" (holder {lease.holder})" if lease.holder else ""
        return Superseded(
            f"its epoch is {lease.transitions}{by}, not older than ours ({claim.epoch})"
        )
    if lease.expired(unchanged_for_s):
        return Acquire()
    assert lease.holder is not None
    remaining = lease_clock.remaining_s(False, unchanged_for_s, float(lease.duration_s or 0))
    return Wait(holder=lease.holder, remaining_s=remaining)


def is_ours(lease: LeaseRecord, claim: Claim) -> bool:
    """Whether the Lease still names this worker at its epoch (after a write conflict,
    a re-read that says so means a harmless concurrent change, not a takeover)."""
    return lease.holder == claim.identity and lease.transitions == claim.epoch


def taken(lease: LeaseRecord, claim: Claim, now: datetime) -> LeaseRecord:
    """The Lease as this worker writes it when taking it."""
    same_holder = lease.holder == claim.identity and lease.acquire_time is not None
    return LeaseRecord(
        holder=claim.identity,
        transitions=claim.epoch,
        renew_time=now,
        duration_s=claim.duration_s,
        acquire_time=lease.acquire_time if same_holder else now,
    )


def renewed(lease: LeaseRecord, now: datetime) -> LeaseRecord:
    return replace(lease, renew_time=now)


def released(lease: LeaseRecord, now: datetime) -> LeaseRecord:
    """The Lease as a cleanly stopping holder leaves it: holder and epoch kept (the record
    of who had it last), `renewTime` one duration before `acquireTime`
    (`lease_clock.release_times`) so that every reader counts it as free at once,
    whatever its clock: the operator may start the next epoch at once, and the same pod's
    worker, restarted, takes it back as its own."""
    acquired, renew = lease_clock.release_times(lease.acquire_time, lease.duration_s or 0, now)
    return replace(lease, renew_time=renew, acquire_time=acquired)


def held(held_until: float | None, monotonic_now: float) -> bool:
    """The holder's own rule: held strictly before the deadline of its last good renew."""
    return held_until is not None and monotonic_now < held_until


# -- the holder's state machine: pause, don't die --------------------------------------
#
# A missed renew deadline proves only that *this* worker could not reach the API server
# (an API-server restart, a control-plane upgrade, a network blip), not that anyone else
# has the Lease. So the holder pauses (aborts its open transaction, consumes and commits
# nothing, keeps its store, producer and consumer) and keeps renewing; a renew that
# succeeds on the Lease as it last wrote it (compare-and-set on `resourceVersion`), or on
# a re-read that still names it at its epoch (`is_ours`), proves the hold again and it
# resumes at once. Only a Lease naming another holder or a newer epoch means fenced
# (exit 3): then someone else may commit, and this worker never will again.


class Hold(Enum):
    """What the holder can prove about its Lease right now."""

    HELD = "held"  # a renew answered within the renew deadline: may commit
    LAPSED = "lapsed"  # no successful renew within the deadline, no other holder seen
    LOST = "lost"  # another holder or a newer epoch has it: never held again


class WorkerState(Enum):
    RUNNING = "running"  # consuming and committing
    PAUSED = "paused"  # open transaction aborted; nothing consumed or committed
    FENCED = "fenced"  # stops without committing, exit 3


def hold_state(lost: bool, held_until: float | None, monotonic_now: float) -> Hold:
    """The holder's hold from its renews: lost for good, held, or lapsed for now."""
    if lost:
        return Hold.LOST
    return Hold.HELD if held(held_until, monotonic_now) else Hold.LAPSED


def after_renew_conflict(lease: LeaseRecord, claim: Claim) -> Hold:
    """A renew refused with 409 Conflict, then `lease` re-read: still ours at our epoch (a
    harmless concurrent change, e.g. the operator's labels) -> renew on top of it;
    anyone else, or our name with another epoch -> lost."""
    return Hold.HELD if is_ours(lease, claim) else Hold.LOST


def next_state(current: WorkerState, hold: Hold) -> WorkerState:
    """The worker's state after observing `hold`: fenced is final; otherwise it runs
    while held and pauses while the hold has lapsed."""
    if current is WorkerState.FENCED or hold is Hold.LOST:
        return WorkerState.FENCED
    return WorkerState.RUNNING if hold is Hold.HELD else WorkerState.PAUSED
