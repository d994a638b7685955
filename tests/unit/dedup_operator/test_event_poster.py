"""Events posted from one thread (dedup_operator.event_poster): in the order given, a
failed post logged and the next one posted, a full queue dropping (counted), and what is
queued posted when the operator stops."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from dedup_operator.event_poster import EventPoster


def event(reason: str) -> dict[str, Any]:
    return {"reason": reason, "message": reason}


def test_events_are_posted_in_order_and_a_failure_does_not_stop_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    posted: list[tuple[str, str]] = []

    def post(ns: str, body: dict[str, Any]) -> None:
        if body["reason"] == "Bad":
            raise RuntimeError("the API server said no")
        posted.append((ns, body["reason"]))

    poster = EventPoster(post).start()
    with caplog.at_level(logging.WARNING, logger="dedup_operator.events"):
        for reason in ("A", "Bad", "B", "C"):
            assert poster.submit("ns", event(reason))
        poster.stop()
    assert posted == [("ns", "A"), ("ns", "B"), ("ns", "C")]
    assert poster.posted == 3
    assert [r.getMessage() for r in caplog.records] == [
        "could not post Event Bad: RuntimeError: the API server said no"
    ]


def test_a_full_queue_drops_the_event_with_a_warning_and_never_blocks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    posted: list[str] = []

    def post(ns: str, body: dict[str, Any]) -> None:
        release.wait(5)  # the API server is slow
        posted.append(body["reason"])

    poster = EventPoster(post, capacity=2).start()
    with caplog.at_level(logging.WARNING, logger="dedup_operator.events"):
        results = [poster.submit("ns", event(f"E{i}")) for i in range(6)]
    # the first is taken by the thread; two wait; the rest find the queue full
    assert results.count(False) == poster.dropped >= 3
    assert any("dropped Event" in r.getMessage() for r in caplog.records)
    release.set()
    poster.stop()
    assert posted == [f"E{i}" for i, ok in enumerate(results) if ok]
