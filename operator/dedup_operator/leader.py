"""One acting operator among replicas: leader election on a coordination.k8s.io Lease.

Every replica runs the kopf watches, but only the holder of the Lease
`dedup-operator-leader` reconciles. A replica takes the Lease when it is free or has
expired: seen unchanged for leaseDurationSeconds on this replica's monotonic clock
(`dedup_contract.lease_clock`, the one expiry rule; never the holder's wall-clock
renewTime against ours; a replica just started waits a full duration), renews it with a
compare-and-set on resourceVersion, and considers itself leader only until the renew
deadline after the start of its last successful renew, by its own monotonic clock
(`lease_clock.LeaseTiming`, the holder's timing the workers use too: renew every third
of the duration, held for two thirds): it stops acting before anyone else may start. On
a clean stop it releases the Lease so a successor takes over at once.

**Identity.** Each process is `<pod name>-<random UUID>` (`leader_identity`): the pod's
name from the downward API (`POD_NAME`), else the host name, and a UUID made when the
process starts. Neither a host name nor a PID tells two replicas apart: containers
repeat PIDs, `hostNetwork` replicas on one node share the node's host name, and a pod
restarted in place keeps its name. And a Lease that names this identity counts as ours
only while its resourceVersion is the one our own last write produced
(`may_take(..., written_by_me=...)`): whoever else wrote it, under whatever name, must
let it run out first.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_contract import lease_clock
from dedup_contract.timefmt import format_micro_time, parse_time

log = logging.getLogger("dedup_operator.leader")

LEASE_NAME = "dedup-operator-leader"
POD_NAME_ENV = "POD_NAME"  # the chart sets it from the downward API (metadata.name)


def leader_identity(pod_name: str | None = None) -> str:
    """This process's holder identity: the pod's name (`POD_NAME`), else the host name,
    then a UUID of this process. Two processes never share one, whatever their host
    names and PIDs."""
    base = pod_name or os.environ.get(POD_NAME_ENV) or socket.gethostname() or "dedup-operator"
    return f"{base}-{uuid.uuid4()}"


@dataclass(frozen=True)
class LeaseState:
    holder: str | None
    renew_time: datetime | None
    duration_s: int
    acquire_time: datetime | None = None


def may_take(state: LeaseState, me: str, unchanged_for_s: float, written_by_me: bool) -> bool:
    """Ours already, free, or seen unchanged for its duration (`lease_clock.expired`).
    Ours means our identity *and* the version our own last write produced
    (`written_by_me`): a Lease written under our name by anyone else is someone else's."""
    if state.holder in (None, ""):
        return True
    if state.holder == me and written_by_me:
        return True
    free = lease_clock.is_free(state.holder, state.renew_time, state.acquire_time, state.duration_s)
    return lease_clock.expired(free, unchanged_for_s, state.duration_s)


class LeaderElection:
    def __init__(
        self, api: client.ApiClient, namespace: str, identity: str, duration_s: int = 15
    ) -> None:
        self.leases = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.identity = identity
        self.duration_s = max(1, duration_s)
        self.timing = lease_clock.LeaseTiming.for_duration(self.duration_s)
        self._valid_until = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._was_leader = False
        self._clock = lease_clock.LeaseClock()  # when we saw the Lease change
        self._written: str | None = None  # the resourceVersion our last write produced

    def is_leader(self) -> bool:
        return time.monotonic() < self._valid_until

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and release the Lease if held."""
        self._stop.set()
        self._thread.join(timeout=self.duration_s)
        if self.is_leader():
            self._valid_until = 0.0
            try:
                lease = self.leases.read_namespaced_lease(LEASE_NAME, self.namespace)
                if lease.spec is not None and lease.spec.holder_identity == self.identity:
                    lease.spec.holder_identity = None
                    lease.spec.renew_time = None
                    self.leases.replace_namespaced_lease(LEASE_NAME, self.namespace, lease)
                    log.info("released leadership", extra={"identity": self.identity})
            except ApiException as exc:
                log.warning("could not release leadership: %s", exc.reason)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._try()
            except ApiException as exc:
                if exc.status != 409:  # 409: someone else wrote first
                    log.warning("leader election: %s %s", exc.status, exc.reason)
            except Exception as exc:
                log.warning("leader election: %s", exc)
            leader = self.is_leader()
            if leader != self._was_leader:
                log.info(
                    "became leader" if leader else "lost leadership",
                    extra={"identity": self.identity},
                )
                self._was_leader = leader
            every = self.timing.renew_every_s
            self._stop.wait(every if leader else min(1.0, every))

    def _try(self) -> None:
        started = time.monotonic()
        now = datetime.now(UTC)
        try:
            lease = self.leases.read_namespaced_lease(LEASE_NAME, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body: dict[str, Any] = {
                "metadata": {"name": LEASE_NAME},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": self.duration_s,
                    "acquireTime": format_micro_time(now),
                    "renewTime": format_micro_time(now),
                    "leaseTransitions": 0,
                },
            }
            made = self.leases.create_namespaced_lease(self.namespace, body)  # type: ignore[arg-type]
            self._written = made.metadata.resource_version if made.metadata else None
            self._valid_until = self.timing.held_until(started)
            return
        spec = lease.spec
        assert spec is not None
        state = LeaseState(
            holder=spec.holder_identity,
            renew_time=parse_time(spec.renew_time),
            duration_s=int(spec.lease_duration_seconds or self.duration_s),
            acquire_time=parse_time(spec.acquire_time),
        )
        version = lease.metadata.resource_version if lease.metadata else None
        stamp = lease_clock.LeaseStamp(state.holder, state.renew_time, version)
        written_by_me = version is not None and version == self._written
        if not may_take(
            state, self.identity, self._clock.observe(LEASE_NAME, stamp), written_by_me
        ):
            self._valid_until = 0.0
            return
        if spec.holder_identity != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = self.duration_s
        # replace carries the resourceVersion read above: a compare-and-set
        self._written = None  # unknown until the answer: a lost answer is not ours
        done = self.leases.replace_namespaced_lease(LEASE_NAME, self.namespace, lease)
        self._written = done.metadata.resource_version if done.metadata else None
        self._valid_until = self.timing.held_until(started)
