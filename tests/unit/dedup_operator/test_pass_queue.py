"""The pass scheduler: each pipeline's own due time, one pass at a time per pipeline,
passes of different pipelines at once (`dedup_operator.pass_queue`), and the next-pass
rule of the handlers (`handlers.next_pass_in`)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from dedup_operator.handlers import (
    FOLLOW_UP_S,
    STEP_FOLLOW_UP_S,
    STEPS_IN_A_ROW,
    next_pass_in,
)
from dedup_operator.pass_outcome import Outcome, Rest
from dedup_operator.pass_queue import Key, PassQueue, PassScheduler
from dedup_operator.settings import ReconcileSettings

A: Key = ("ns", "a")
B: Key = ("ns", "b")


def test_the_pipeline_due_first_is_taken_first_and_only_when_due() -> None:
    q = PassQueue()
    q.want(A, 10.0)
    q.want(B, 5.0)
    assert q.take(4.0) is None
    assert q.next_due() == 5.0
    assert q.take(5.0) == B
    assert q.take(9.9) is None
    assert q.take(10.0) == A
    assert q.next_due() is None


def test_an_earlier_want_wins_and_a_later_one_changes_nothing() -> None:
    q = PassQueue()
    q.want(A, 10.0)
    q.want(A, 3.0)
    q.want(A, 7.0)
    assert q.next_due() == 3.0
    assert q.take(3.0) == A
    assert q.take(100.0) is None  # one entry, taken once


def test_a_pipeline_in_its_pass_is_not_taken_again_until_done() -> None:
    q = PassQueue()
    q.want(A, 0.0)
    assert q.take(0.0) == A
    q.want(A, 0.0)  # asked again during the pass (kopf's update handler)
    assert q.take(1.0) is None  # single flight
    q.done(A, 5.0)
    assert q.next_due() == 0.0  # the pass asked for during it runs next, at once
    assert q.take(1.0) == A
    q.done(A, 5.0)
    assert q.take(4.9) is None
    assert q.take(5.0) == A


def test_done_without_a_next_drops_the_pipeline() -> None:
    q = PassQueue()
    q.want(A, 0.0)
    assert q.take(0.0) == A
    q.done(A, None)
    assert q.next_due() is None and q.known() == set()


def test_a_pipeline_forgotten_during_its_pass_gets_no_next_unless_wanted_again() -> None:
    q = PassQueue()
    q.want(A, 0.0)
    q.want(B, 0.0)
    assert q.take(0.0) == A
    q.forget(A)
    assert q.known() == {B}
    q.done(A, 5.0)
    assert q.take(100.0) == B and q.take(100.0) is None
    q.want(A, 0.0)
    assert q.take(0.0) == A
    q.forget(A)
    q.want(A, 1.0)  # listed again meanwhile
    q.done(A, None)
    assert q.take(1.0) == A


def test_forget_drops_a_waiting_pipeline() -> None:
    q = PassQueue()
    q.want(A, 1.0)
    q.forget(A)
    assert q.take(10.0) is None and q.known() == set()


def test_next_pass_follows_requeue_after_within_follow_up_and_interval() -> None:
    def outcome(result: str, requeue_after: float | None) -> Outcome:
        return Outcome(A, result, (), requeue_after)

    assert next_pass_in(outcome("ok", None), 5.0, True) == 5.0
    assert next_pass_in(outcome("ok", 0.0), 5.0, True) == FOLLOW_UP_S
    assert next_pass_in(outcome("ok", 2.5), 5.0, True) == 2.5
    assert next_pass_in(outcome("ok", 60.0), 5.0, True) == 5.0
    assert next_pass_in(outcome("ok", 0.0), 5.0, False) == 5.0  # a standby: the interval
    assert next_pass_in(None, 5.0, True) == 5.0
    for gone in ("gone", "deleting", "finalized"):
        assert next_pass_in(outcome(gone, None), 5.0, True) is None
    assert next_pass_in(outcome("finalizing", 0.0), 5.0, True) == FOLLOW_UP_S
    assert next_pass_in(outcome("conflict", None), 5.0, True) == FOLLOW_UP_S


def test_a_pipeline_at_rest_is_passed_at_the_resync_and_its_settings_bound_it() -> None:
    rest = Rest(nodes={"n1": 0.0}, lost_after_s=20.0)
    at_rest = Outcome(A, "ok", (), None, None, rest)
    assert next_pass_in(at_rest, 5.0, True, rest_s=30.0) == 30.0
    assert next_pass_in(at_rest, 5.0, True) == 5.0, "no resync given: the interval"
    assert next_pass_in(at_rest, 5.0, False, rest_s=30.0) == 5.0, "a standby: the interval"
    busy = Outcome(A, "ok", (), None)
    assert next_pass_in(busy, 5.0, True, rest_s=30.0) == 5.0
    settings = ReconcileSettings(interval_s=5.0, topic_check_s=30.0, counters_s=60.0)
    assert settings.rest_s() == 30.0, "the resync (30 s), the topic check as often"
    assert ReconcileSettings(interval_s=1.0, topic_check_s=3.0, counters_s=1.0).rest_s() == 1.0
    assert ReconcileSettings(interval_s=4.0, counters_s=1.0).rest_s() == 4.0, "not below"


def test_wake_brings_known_pipelines_forward_and_ignores_others() -> None:
    now = [0.0]
    ran: list[Key] = []
    scheduler = PassScheduler(lambda key: ran.append(key) or 100.0, 1, lambda: now[0])
    scheduler.keep_only([A])
    assert scheduler.wake([B]) == 0, "not a pipeline it passes over"
    assert scheduler.wake([A]) == 1


def test_a_handover_step_is_followed_at_once_but_not_for_ever() -> None:
    stepped = Outcome(("ns", "p"), "ok", ("WriteHandoverRecord", "Tell"), 0.0)
    assert next_pass_in(stepped, 5.0, True) == STEP_FOLLOW_UP_S
    assert next_pass_in(stepped, 5.0, True, STEPS_IN_A_ROW - 1) == STEP_FOLLOW_UP_S
    assert next_pass_in(stepped, 5.0, True, STEPS_IN_A_ROW) == FOLLOW_UP_S  # not moving
    told = Outcome(("ns", "p"), "ok", ("Tell",), 0.0)  # acted, but took no step
    assert next_pass_in(told, 5.0, True) == FOLLOW_UP_S
    assert next_pass_in(stepped, 5.0, False) == 5.0  # a standby takes no step


def test_one_pipelines_follow_ups_do_not_make_another_pass_more_often() -> None:
    """Real threads and clock: A asks for its next pass in 0.05 s (a handover), B in 0.5 s.
    B's passes stay at its own pace; A's run meanwhile, never two at once of one."""
    passes: Counter[Key] = Counter()
    running: set[Key] = set()
    overlap: list[Key] = []
    lock = threading.Lock()

    def run(key: Key) -> float:
        with lock:
            if key in running:
                overlap.append(key)
            running.add(key)
            passes[key] += 1
        time.sleep(0.01)
        with lock:
            running.discard(key)
        return 0.05 if key == A else 0.5

    scheduler = PassScheduler(run, threads=2)
    scheduler.start()
    try:
        scheduler.keep_only([A, B])
        time.sleep(1.2)
    finally:
        scheduler.stop()
    assert not overlap
    assert passes[A] >= 10
    assert 2 <= passes[B] <= 4, passes  # ~1.2 s at 0.5 s: its own interval, not A's


def test_a_slow_pass_does_not_hold_back_another_pipeline() -> None:
    started: dict[Key, float] = {}
    release = threading.Event()

    def run(key: Key) -> float | None:
        started.setdefault(key, time.monotonic())
        if key == A:
            release.wait(5)
        return None

    scheduler = PassScheduler(run, threads=2)
    scheduler.start()
    try:
        t0 = time.monotonic()
        scheduler.keep_only([A])
        time.sleep(0.05)
        scheduler.keep_only([A, B])
        time.sleep(0.2)
        assert B in started and started[B] - t0 < 0.2  # not behind A's pass
    finally:
        release.set()
        scheduler.stop()


def test_keep_only_adds_new_pipelines_and_forgets_vanished_ones() -> None:
    seen: list[Key] = []

    def run(key: Key) -> float:
        seen.append(key)
        return 60.0 if key == A else 0.02

    scheduler = PassScheduler(run, threads=1)
    scheduler.start()
    try:
        scheduler.keep_only([A])
        time.sleep(0.1)
        scheduler.keep_only([A])  # known: keeps its due time, 60 s away
        time.sleep(0.1)
        assert seen == [A]
        scheduler.keep_only([B])  # B is new; A is forgotten
        time.sleep(0.1)
        scheduler.keep_only([])  # B is forgotten: its passes stop
        stopped_at = len(seen)
        time.sleep(0.1)
    finally:
        scheduler.stop()
    assert seen[0] == A and set(seen[1:]) == {B} and len(seen) > 3
    assert len(seen) <= stopped_at + 1  # at most the pass running when it was forgotten


def test_a_scheduler_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        PassScheduler(lambda key: None, threads=0)
