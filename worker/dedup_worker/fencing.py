"""The fencing token a worker must hold to commit.

In Kubernetes the partition's Lease provides it (`LeaseToken`, rules in
`dedup_worker.lease`); standalone, the token is always held and Kafka's transactional
fencing (`init_transactions` bumping the producer epoch) is the only fence. With a Lease,
Kafka's fence stays as the second line.

`LeaseToken` talks to the API server through the kubernetes client, imported only when a
Lease is used: a standalone worker does not pay for it at start-up.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from dedup_contract.lease_clock import LeaseClock, LeaseTiming, skewed_utc_now
from dedup_contract.timefmt import format_micro_time
from dedup_worker.lease import (
    Acquire,
    Claim,
    Hold,
    LeaseRecord,
    Superseded,
    Wait,
    after_renew_conflict,
    decide,
    hold_state,
    is_ours,
    released,
    renewed,
    taken,
)

log = logging.getLogger(__name__)


class Fenced(RuntimeError):
    """This worker no longer owns its partition; it must stop without committing."""


# While lapsed, a failed renew is retried after at most this long (jittered), so a worker
# resumes within about a second of the API server answering again, whatever the duration.
LAPSED_RETRY_MAX_S = 1.0


class FencingToken(Protocol):
    def held(self) -> bool:
        """True while this worker can prove it still owns the partition. Cheap: called
        before every commit."""
        ...

    def state(self) -> Hold:
        """Held; lapsed for now (pause, it may come back); or lost for good (fenced).
        Cheap, as `held()`."""
        ...

    def why_not_held(self) -> str:
        """Why `held()` is false, for the one log line a fenced worker leaves."""
        ...


class AlwaysHeld:
    """Standalone mode: no lease; Kafka's transactional fencing alone guards the output."""

    def held(self) -> bool:
        return True

    def state(self) -> Hold:
        return Hold.HELD

    def why_not_held(self) -> str:
        return "held"


def _utc_now() -> datetime:
    """What the worker writes into its Lease: UTC now, or, with the test-only
    DEDUP_FAULT_CLOCK_SKEW_S, a clock that far off (nobody reads it as a deadline)."""
    return skewed_utc_now()


def _api_errors() -> tuple[type[BaseException], ...]:
    """What a request to the API server raises when it fails: an HTTP status
    (ApiException), or no answer at all (urllib3's errors, sockets)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return (ApiException, HTTPError, OSError)


def api_client(kubeconfig: Path | None) -> Any:
    """An API client (`kube_client.api_client`) from `kubeconfig`, else the pod's
    in-cluster service account, never a default kubeconfig. Raises ValueError when
    neither is available. urllib3 retries are off: the token's own loops retry, each
    request bounded by its timeout."""
    from kubernetes.config.config_exception import ConfigException

    from dedup_contract import kube_client

    if kubeconfig is not None and not kubeconfig.is_file():
        raise ValueError(f"--kubeconfig {kubeconfig}: no such file")
    if kubeconfig is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise ValueError(
            "--lease-name needs the API server: set --kubeconfig (DEDUP_KUBECONFIG) or "
            "run in a pod (in-cluster config, KUBERNETES_SERVICE_HOST)"
        )
    try:
        return kube_client.api_client(kubeconfig, default_kubeconfig=False, retries=False)
    except ConfigException as exc:
        raise ValueError(f"cannot configure the API client: {exc}") from None


def _record(lease: Any) -> LeaseRecord:
    spec = lease.spec
    return LeaseRecord(
        holder=spec.holder_identity or None,
        transitions=int(spec.lease_transitions or 0),
        renew_time=spec.renew_time,
        duration_s=spec.lease_duration_seconds,
        acquire_time=spec.acquire_time,
        resource_version=lease.metadata.resource_version if lease.metadata else None,
    )


class LeaseToken:
    """A FencingToken backed by the partition's Lease.

    `acquire()` takes it (or raises Fenced), `start_renewing()` renews it from a daemon
    thread every `timing.renew_every_s`, `held()`/`state()` are a monotonic-clock
    comparison (no API call), `release()` on a clean stop leaves the Lease expired
    (`lease.released`). Past the renew deadline the token is lapsed, not lost: renewing
    goes on (about every second) and the first renew that succeeds holds it again.
    Every write is a replace carrying the last seen `resourceVersion`: a concurrent
    writer makes it fail with 409 Conflict, and a re-read decides whether the Lease is
    still ours (renew again) or was taken over (lost for good).
    """

    def __init__(
        self,
        api: Any,  # kubernetes.client.CoordinationV1Api
        namespace: str,
        name: str,
        claim: Claim,
        timing: LeaseTiming,
        wall: Callable[[], datetime] = _utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.claim = claim
        self.timing = timing
        self._wall = wall
        self._monotonic = monotonic
        self._clock = LeaseClock(monotonic)  # when we saw the Lease change (takeover rule)
        self._errors = _api_errors()
        self._lease: Any = None  # the V1Lease as last read or written
        self._held_until: float | None = None
        self._lost: str | None = None  # taken over (or renewing broke): never held again
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def connect(
        cls,
        namespace: str,
        name: str,
        claim: Claim,
        timing: LeaseTiming,
        kubeconfig: Path | None = None,
    ) -> LeaseToken:
        from kubernetes import client

        return cls(client.CoordinationV1Api(api_client(kubeconfig)), namespace, name, claim, timing)

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    # -- FencingToken ------------------------------------------------------------------

    def held(self) -> bool:
        return self.state() is Hold.HELD

    def state(self) -> Hold:
        return hold_state(self._lost is not None, self._held_until, self._monotonic())

    def why_not_held(self) -> str:
        if self._lost is not None:
            return self._lost
        if self._held_until is None:
            return f"{self.where} not taken"
        return (
            f"{self.where} not renewed within the renew deadline "
            f"({self.timing.renew_deadline_s:g}s; last error: {self._last_error or 'none'})"
        )

    # -- taking, renewing, releasing ---------------------------------------------------

    def acquire(self, timeout_s: float, stopping: threading.Event | None = None) -> bool:
        """Take the Lease, waiting (at most `timeout_s`) for an older epoch's hold to
        expire. True once held; False if `stopping` was set meanwhile. Raises Fenced when
        a worker of this epoch or a newer one has it, or when it cannot be taken in time."""
        stopping = stopping or threading.Event()
        deadline = self._monotonic() + timeout_s
        problem = "no answer yet"
        while True:
            delay = self.timing.renew_every_s
            try:
                lease = self._read_or_create()
                record = _record(lease)
                sent = self._monotonic()  # before the renewTime we may write: never later
                now = self._wall()
                unchanged_for = self._clock.observe(self.where, record.stamp())
                decision = decide(record, self.claim, unchanged_for)
                if isinstance(decision, Superseded):
                    raise Fenced(f"{self.where} is not ours to take: {decision.reason}")
                if isinstance(decision, Acquire):
                    self._write(lease, taken(record, self.claim, now))
                    self._held_until = self.timing.held_until(sent)
                    log.info(
                        "took the Lease",
                        extra={
                            "lease": self.where,
                            "holder": self.claim.identity,
                            "epoch": self.claim.epoch,
                            "previous_holder": record.holder,
                            "previous_epoch": record.transitions,
                        },
                    )
                    return True
                assert isinstance(decision, Wait)
                problem = (
                    f"held by {decision.holder}, not seen unchanged for its duration yet "
                    f"({decision.remaining_s:.1f}s to go)"
                )
                delay = min(delay, max(0.05, decision.remaining_s))
            except self._errors as exc:
                status = getattr(exc, "status", None)
                if status == 409:
                    problem = "write conflict"
                    delay = 0.05  # someone else wrote it meanwhile: look again
                elif status in (401, 403):
                    raise Fenced(
                        f"{self.where}: the API server refused us ({_brief(exc)})"
                    ) from None
                else:
                    problem = f"API server: {_brief(exc)}"
            if self._monotonic() + delay > deadline:
                raise Fenced(f"{self.where} not taken within {timeout_s:g}s: {problem}")
            if stopping.wait(delay):
                return False

    def start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timing.request_timeout_s * 3)
            self._thread = None

    def release(self) -> None:
        """On a clean stop: leave the Lease expired, if it is still ours."""
        self.stop_renewing()
        lease, self._held_until = self._lease, None
        if lease is None or self._lost is not None:
            return
        try:
            try:
                self._write(lease, released(_record(lease), self._wall()))
            except self._errors as exc:
                if getattr(exc, "status", None) != 409:
                    raise
                lease = self._read()
                if not is_ours(_record(lease), self.claim):
                    return
                self._write(lease, released(_record(lease), self._wall()))
            log.info("released the Lease", extra={"lease": self.where})
        except self._errors as exc:
            log.warning(
                "could not release the Lease; it expires by itself",
                extra={
                    "lease": self.where,
                    "duration_s": self.claim.duration_s,
                    "error": _brief(exc),
                },
            )

    def _renew_loop(self) -> None:
        delay = self.timing.renew_every_s
        try:
            while not self._stop.wait(delay):
                ok = self._renew_once()
                if self._lost is not None:
                    return
                # after a failure, try again sooner: several attempts fit in the deadline,
                # and once lapsed (paused) a returning API server is noticed within ~1 s
                delay = self.timing.renew_every_s
                if not ok:
                    delay = min(delay / 2, LAPSED_RETRY_MAX_S) * random.uniform(0.5, 1.0)
        except Exception as exc:  # a bug must not leave a token that looks renewable
            self._lost = f"renewing {self.where} failed unexpectedly: {exc!r}"
            log.error("lease renewal stopped", extra={"lease": self.where, "error": repr(exc)})

    def _renew_once(self) -> bool:
        for _ in range(3):
            sent = self._monotonic()
            try:
                self._write(self._lease, renewed(_record(self._lease), self._wall()))
            except self._errors as exc:
                if getattr(exc, "status", None) != 409:
                    return self._renew_failed(exc)
                try:
                    fresh = self._read()
                except self._errors as read_exc:
                    return self._renew_failed(read_exc)
                record = _record(fresh)
                if after_renew_conflict(record, self.claim) is Hold.LOST:
                    self._lost = (
                        f"{self.where} was taken over by {record.holder or 'nobody'} "
                        f"(epoch {record.transitions}; ours {self.claim.epoch})"
                    )
                    log.warning("lost the Lease", extra={"lease": self.where, "reason": self._lost})
                    return False
                self._lease = fresh  # a harmless concurrent change: renew on top of it
                continue
            until = self.timing.held_until(sent)
            self._held_until = max(self._held_until or until, until)
            if self._last_error is not None:
                log.info("renewing the Lease again", extra={"lease": self.where})
                self._last_error = None
            return True
        return False

    def _renew_failed(self, exc: BaseException) -> bool:
        first = self._last_error is None
        self._last_error = _brief(exc)
        if first:
            log.warning(
                "renewing the Lease failed; retrying (past the renew deadline: paused)",
                extra={"lease": self.where, "error": self._last_error},
            )
        return False

    # -- API calls -----------------------------------------------------------------------

    def _read(self) -> Any:
        return self.api.read_namespaced_lease(
            self.name, self.namespace, _request_timeout=self.timing.request_timeout_s
        )

    def _read_or_create(self) -> Any:
        """The Lease; created free (epoch 0) if it does not exist yet (the operator creates
        it before the first pod; a worker run by hand against a cluster may not)."""
        try:
            return self._read()
        except self._errors as exc:
            if getattr(exc, "status", None) != 404:
                raise
        from kubernetes import client

        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                lease_transitions=0, lease_duration_seconds=self.claim.duration_s
            ),
        )
        return self.api.create_namespaced_lease(
            self.namespace, body, _request_timeout=self.timing.request_timeout_s
        )

    def _write(self, lease: Any, record: LeaseRecord) -> None:
        """Replace the Lease with `record`'s fields; compare-and-set on the resourceVersion
        `lease` carries. Keeps the server's answer as the new base."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": lease.metadata,  # resourceVersion, and the operator's labels/owner
            "spec": {
                "holderIdentity": record.holder,
                "leaseTransitions": record.transitions,
                "renewTime": _micro_time(record.renew_time),
                "acquireTime": _micro_time(record.acquire_time),
                "leaseDurationSeconds": record.duration_s,
            },
        }
        self._lease = self.api.replace_namespaced_lease(
            self.name, self.namespace, body, _request_timeout=self.timing.request_timeout_s
        )


def _micro_time(when: datetime | None) -> str | None:
    """A Lease's MicroTime (`timefmt.format_micro_time`: always six fraction digits), or
    None for no time."""
    return None if when is None else format_micro_time(when)


def _brief(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status is not None:
        return f"HTTP {status} {getattr(exc, 'reason', '')}".strip()
    return f"{type(exc).__name__}: {exc}"[:300]
