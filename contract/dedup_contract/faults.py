"""Test-only fault points.

A chaos test sets `DEDUP_TEST_FAULTS="after-commit=0.05"` to have the worker SIGKILL
itself with that probability right after a Kafka commit and before the store write, the
one crash window that only the catch-up from the output topic can repair. Unset (always,
in production) this costs one dictionary lookup per batch.

`maybe_abortable_error` raises, with its point's probability, the error Kafka returns
when a transaction must be aborted (`txn_requires_abort`): the worker aborts the batch and
redoes it, as it does when a broker refuses the commit.

`maybe_stop` is the same for a SIGSTOP of the whole process (all its threads), once: a
test sets e.g. `operator-before-handover-record=1` on one operator replica to freeze it
between a decision and its first write, and resumes it later with SIGCONT.
"""

from __future__ import annotations

import os
import random
import signal
import time

from confluent_kafka import KafkaError, KafkaException

ENV = "DEDUP_TEST_FAULTS"


def _parse(spec: str) -> dict[str, float]:
    points: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, probability = item.partition("=")
        points[name] = float(probability or "1")
    return points


_POINTS = _parse(os.environ.get(ENV, ""))


def armed(point: str) -> bool:
    """Whether a test set `point` (a per-record fault point checks this once per batch)."""
    return point in _POINTS


def _fires(point: str) -> bool:
    """Whether `point`, if a test set it, fires this time (with its probability)."""
    probability = _POINTS.get(point)
    return probability is not None and random.random() < probability


def maybe_crash(point: str) -> None:
    if _fires(point):
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_abortable_error(point: str) -> None:
    """Raise Kafka's abortable transaction error at `point` (with its probability)."""
    if _fires(point):
        raise KafkaException(
            KafkaError(KafkaError._STATE, f"test fault {point}", txn_requires_abort=True)
        )


def maybe_stop(point: str) -> None:
    """SIGSTOP this process at `point` (with its probability), at most once per point."""
    if _fires(point):
        del _POINTS[point]
        os.kill(os.getpid(), signal.SIGSTOP)
        # the stop reaches this thread only after another thread started the group stop:
        # wait for it here, at the point, not a few statements further on
        time.sleep(0.1)
