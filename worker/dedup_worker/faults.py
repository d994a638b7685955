"""Test-only fault points.

A chaos test sets `DEDUP_TEST_FAULTS="after-commit=0.05"` to have the worker SIGKILL
itself with that probability right after a Kafka commit and before the store write, the
one crash window that only the catch-up from the output topic can repair. Unset (always,
in production) this costs one dictionary lookup per batch.
"""

from __future__ import annotations

import os
import random
import signal

ENV = "DEDUP_TEST_FAULTS"


def _parse(spec: str) -> dict[str, float]:
    points: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, probability = item.partition("=")
        points[name] = float(probability or "1")
    return points


_POINTS = _parse(os.environ.get(ENV, ""))


def maybe_crash(point: str) -> None:
    probability = _POINTS.get(point)
    if probability is not None and random.random() < probability:
        os.kill(os.getpid(), signal.SIGKILL)
