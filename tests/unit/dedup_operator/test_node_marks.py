"""Marks on one node asked at once go in one write (dedup_operator.node_marks), with real
threads: a write held open while other passes ask, then the next carrying them all."""

from __future__ import annotations

import threading
import time

import pytest

from dedup_operator.node_marks import NodeMarkBatches, _Batch

_NONE = _Batch()


def test_marks_asked_while_a_write_is_in_flight_go_in_the_next_one_together() -> None:
    batches = NodeMarkBatches()
    writes: list[frozenset[str]] = []
    first_started, release = threading.Event(), threading.Event()

    def write(marks: frozenset[str]) -> bool:
        writes.append(marks)
        if len(writes) == 1:
            first_started.set()
            assert release.wait(5)
        return True

    answers: dict[str, bool] = {}

    def mark(owner: str) -> None:
        answers[owner] = batches.add("n1", owner, write)

    first = threading.Thread(target=mark, args=("ns/a",))
    first.start()
    assert first_started.wait(5)
    waiting = [threading.Thread(target=mark, args=(f"ns/{p}",)) for p in "bcde"]
    for t in waiting:
        t.start()
    deadline = time.monotonic() + 5
    while len(batches._open.get("n1", _NONE).marks) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)  # until all four wait for the write in flight
    release.set()
    for t in [first, *waiting]:
        t.join(5)
    assert writes[0] == {"ns/a"}
    assert set().union(*writes[1:]) == {"ns/b", "ns/c", "ns/d", "ns/e"}
    assert len(writes) == 2, "the marks asked meanwhile shared one write"
    assert answers == dict.fromkeys(["ns/a", "ns/b", "ns/c", "ns/d", "ns/e"], True)


def test_each_node_has_its_own_writes_and_a_failure_reaches_every_pass_it_carried() -> None:
    batches = NodeMarkBatches()
    assert batches.add("n1", "ns/a", lambda marks: marks == {"ns/a"})
    assert not batches.add("n2", "ns/a", lambda marks: False), "someone else's taint"

    def refused(marks: frozenset[str]) -> bool:
        raise RuntimeError("API server unreachable")

    with pytest.raises(RuntimeError, match="unreachable"):
        batches.add("n1", "ns/b", refused)
    assert batches.add("n1", "ns/b", lambda marks: True), "the next write is a new one"
