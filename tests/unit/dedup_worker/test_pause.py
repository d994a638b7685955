"""Pause, don't die: a worker whose Lease hold lapsed pauses and resumes when it renews
again at its own epoch; only another holder or a newer epoch fences it (exit 3).

The pure state machine (`dedup_worker.lease`), the LeaseToken's renew loop against a fake
API (errors, 409 with a re-read), and the loop's pause and resume with fake Kafka clients
(no broker: what the loop does with them is what is checked)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from dedup_contract.lease_clock import LeaseTiming
from dedup_contract.window import WindowPolicy
from dedup_worker.config import WorkerConfig
from dedup_worker.fencing import Fenced, LeaseToken
from dedup_worker.lease import (
    Claim,
    Hold,
    LeaseRecord,
    WorkerState,
    after_renew_conflict,
    hold_state,
    next_state,
)
from dedup_worker.loop import DedupWorker, _Batch

RUNNING, PAUSED, FENCED = WorkerState.RUNNING, WorkerState.PAUSED, WorkerState.FENCED
ME = Claim("events-p0-e2", epoch=2, duration_s=15)
NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


# -- the pure state machine ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "hold", "expected"),
    [
        (RUNNING, Hold.HELD, RUNNING),  # renew ok -> running
        (RUNNING, Hold.LAPSED, PAUSED),  # renew deadline missed -> paused
        (PAUSED, Hold.LAPSED, PAUSED),  # still cannot renew: stays paused, never exits
        (PAUSED, Hold.HELD, RUNNING),  # renewed again at our epoch -> running at once
        (RUNNING, Hold.LOST, FENCED),  # another holder / newer epoch -> fenced
        (PAUSED, Hold.LOST, FENCED),
        (FENCED, Hold.HELD, FENCED),  # fenced is final
    ],
)
def test_worker_state_machine(current: WorkerState, hold: Hold, expected: WorkerState) -> None:
    assert next_state(current, hold) is expected


def test_hold_is_lapsed_past_the_renew_deadline_and_held_again_after_a_renew() -> None:
    timing = LeaseTiming.for_duration(15)
    until = timing.held_until(100.0)  # a renew sent at 100 s (monotonic)
    assert hold_state(False, until, 109.9) is Hold.HELD
    assert hold_state(False, until, 110.0) is Hold.LAPSED  # 2/3 of 15 s later
    assert hold_state(False, timing.held_until(140.0), 141.0) is Hold.HELD  # renewed again
    assert hold_state(False, None, 0.0) is Hold.LAPSED  # never renewed
    assert hold_state(True, timing.held_until(140.0), 141.0) is Hold.LOST  # lost wins


@pytest.mark.parametrize(
    ("reread", "expected"),
    [
        (LeaseRecord("events-p0-e2", 2, NOW, 15), Hold.HELD),  # ours: a harmless change
        (LeaseRecord("events-p0-e3", 3, NOW, 15), Hold.LOST),  # newer epoch, other holder
        (LeaseRecord("events-p0-e2b", 2, NOW, 15), Hold.LOST),  # same epoch, other holder
        (LeaseRecord("events-p0-e2", 3, NOW, 15), Hold.LOST),  # our name, newer epoch
        (LeaseRecord(None, 2, NOW, 15), Hold.LOST),  # nobody's
    ],
)
def test_a_renew_conflict_is_lost_unless_the_lease_is_still_ours(
    reread: LeaseRecord, expected: Hold
) -> None:
    assert after_renew_conflict(reread, ME) is expected


# -- LeaseToken: renewing through an outage, against a fake API ------------------------------


def v1lease(holder: str, epoch: int, version: str) -> client.V1Lease:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name="events-p0", namespace="ns", resource_version=version),
        spec=client.V1LeaseSpec(
            holder_identity=holder,
            lease_transitions=epoch,
            renew_time=NOW,
            acquire_time=NOW,
            lease_duration_seconds=15,
        ),
    )


class FakeApi:
    """CoordinationV1Api as the token uses it: replace answers from `answers` (a lease,
    or an exception to raise), read returns `current`."""

    def __init__(self, current: client.V1Lease) -> None:
        self.current = current
        self.answers: list[Any] = []

    def replace_namespaced_lease(self, name: str, ns: str, body: Any, **kw: Any) -> Any:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def read_namespaced_lease(self, name: str, ns: str, **kw: Any) -> Any:
        return self.current


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def renewing_token(api: FakeApi, clock: Clock) -> LeaseToken:
    token = LeaseToken(api, "ns", "events-p0", ME, LeaseTiming.for_duration(15), monotonic=clock)
    token._lease = v1lease("events-p0-e2", 2, "1")
    token._held_until = token.timing.held_until(clock.now)
    return token


def test_token_lapses_while_the_api_server_is_down_and_holds_again_when_it_answers() -> None:
    clock = Clock()
    api = FakeApi(v1lease("events-p0-e2", 2, "1"))
    token = renewing_token(api, clock)
    down = MaxRetryError(None, "/apis/coordination.k8s.io", "Connection refused")  # type: ignore[arg-type]
    for step in range(30):  # 30 failed renews over 30 s: never lost, only lapsed
        clock.now += 1.0
        api.answers.append(down)
        assert not token._renew_once()
        assert token.state() is (Hold.HELD if clock.now < 1010.0 else Hold.LAPSED), step
    assert "not renewed within the renew deadline" in token.why_not_held()
    api.answers.append(v1lease("events-p0-e2", 2, "2"))  # back, Lease untouched meanwhile
    assert token._renew_once()
    assert token.state() is Hold.HELD and token.held()


def test_token_paused_then_finding_a_newer_epoch_is_lost_for_good() -> None:
    clock = Clock()
    api = FakeApi(v1lease("events-p0-e3", 3, "7"))  # the operator moved on meanwhile
    token = renewing_token(api, clock)
    clock.now += 20.0
    assert token.state() is Hold.LAPSED
    api.answers.append(ApiException(status=409, reason="Conflict"))
    assert not token._renew_once()
    assert token.state() is Hold.LOST
    assert "taken over by events-p0-e3 (epoch 3; ours 2)" in token.why_not_held()


def test_token_paused_then_finding_its_own_lease_relabelled_renews_on_top() -> None:
    clock = Clock()
    api = FakeApi(v1lease("events-p0-e2", 2, "5"))  # the operator labelled it meanwhile
    token = renewing_token(api, clock)
    clock.now += 20.0
    api.answers += [ApiException(status=409, reason="Conflict"), v1lease("events-p0-e2", 2, "6")]
    assert token._renew_once()
    assert token.state() is Hold.HELD


# -- the loop: pause and resume with fake Kafka clients -------------------------------------


class Token:
    def __init__(self) -> None:
        self.hold = Hold.HELD

    def held(self) -> bool:
        return self.hold is Hold.HELD

    def state(self) -> Hold:
        return self.hold

    def why_not_held(self) -> str:
        return {Hold.LAPSED: "not renewed", Hold.LOST: "taken over"}.get(self.hold, "held")


class FakeConsumer:
    def __init__(self, committed: int) -> None:
        self.committed_offset = committed
        self.seeks: list[int] = []
        self.consumed = 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[Any]:
        return [TopicPartition(partitions[0].topic, partitions[0].partition, self.committed_offset)]

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append(tp.offset)

    def consume(self, n: int, timeout: float) -> list[Any]:
        self.consumed += 1
        return []

    def get_watermark_offsets(self, tp: TopicPartition, **kw: Any) -> tuple[int, int]:
        return 0, self.committed_offset

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tps[0].topic, tps[0].partition, self.committed_offset)]


class FakeProducer:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")

    def flush(self, timeout: float = 0) -> int:
        self.calls.append("flush")
        return 0

    def commit_transaction(self) -> None:
        self.calls.append("commit")

    def poll(self, timeout: float = 0) -> int:  # served while idle
        return 0


def paused_worker(tmp_path: Path, token: Token, committed: int = 42) -> DedupWorker:
    cfg = WorkerConfig(
        bootstrap_servers="127.0.0.1:1",
        input_topic="in",
        output_topic="out",
        partition=0,
        store_path=tmp_path / "store",
        window=WindowPolicy(duration_ms=3600_000, max_keys=None),
        pipeline="events",
    )
    w = DedupWorker(cfg, fencing=token)
    w.consumer = FakeConsumer(committed)  # type: ignore[assignment]
    w.producer = FakeProducer()  # type: ignore[assignment]
    w.store = object()  # type: ignore[assignment]  # not touched: no records
    w._sources = [("in", 0)]  # as start() assigns them
    w.health.ready = True
    return w


def gauge(w: DedupWorker, name: str) -> float:
    value = w.metrics.registry.get_sample_value(name, {"pipeline": "events", "partition": "0"})
    assert value is not None
    return value


def test_lapsed_worker_pauses_stays_alive_and_resumes_from_the_committed_offset(
    tmp_path: Path,
) -> None:
    token = Token()
    w = paused_worker(tmp_path, token)
    consumer = w.consumer
    assert isinstance(consumer, FakeConsumer)
    w.process_batch()
    assert w.state is RUNNING and consumer.consumed == 1

    token.hold = Hold.LAPSED
    for _ in range(3):
        w.process_batch()
    assert w.state is PAUSED
    assert consumer.consumed == 1, "nothing consumed while paused"
    assert not w.health.ready and w.health.paused, "/readyz: not ready"
    assert w.health.alive(), "/healthz: still alive, the kubelet must not restart it"
    assert gauge(w, "dedup_paused") == 1 and gauge(w, "dedup_pauses_total") == 1

    consumer.committed_offset = 40  # what the last committed transaction recorded
    token.hold = Hold.HELD
    w.process_batch()
    assert w.state is RUNNING and w.health.ready and not w.health.paused
    assert consumer.seeks == [40], "resumed from the last committed offset"
    assert consumer.consumed == 2
    assert gauge(w, "dedup_paused") == 0
    assert w.metrics.fencing_events._value.get() == 0


def test_paused_worker_that_finds_the_lease_lost_is_fenced(tmp_path: Path) -> None:
    token = Token()
    w = paused_worker(tmp_path, token)
    token.hold = Hold.LAPSED
    w.process_batch()
    token.hold = Hold.LOST
    with pytest.raises(Fenced, match="taken over"):
        w.process_batch()
    assert w.state is FENCED and w.metrics.fencing_events._value.get() == 1
    token.hold = Hold.HELD  # fenced is final, whatever the token says later
    with pytest.raises(Fenced):
        w.process_batch()


def test_commit_with_a_lapsed_hold_aborts_and_is_redone_with_a_lost_one_fences(
    tmp_path: Path,
) -> None:
    token = Token()
    w = paused_worker(tmp_path, token)
    producer = w.producer
    assert isinstance(producer, FakeProducer)
    batch = _Batch([], None, [], frozenset(), {})  # type: ignore[arg-type]
    token.hold = Hold.LAPSED
    assert w._commit(batch) is False, "aborted: redone after the pause"
    # what the transaction holds is delivered before the abort (librdkafka#4849)
    assert producer.calls == ["flush", "abort"]
    assert w.metrics.aborts._value.get() == 1 and w.metrics.fencing_events._value.get() == 0
    token.hold = Hold.LOST
    with pytest.raises(Fenced):
        w._commit(batch)
    assert producer.calls == ["flush", "abort", "abort"] and "commit" not in producer.calls


def test_in_flight_batch_aborted_by_the_lapse_rewinds_the_input(tmp_path: Path) -> None:
    token = Token()
    w = paused_worker(tmp_path, token)
    consumer = w.consumer
    assert isinstance(consumer, FakeConsumer)

    class Record:
        def offset(self) -> int:
            return 40

    spans = {("in", 0): (40, 41)}
    batch = _Batch([Record()], None, [], frozenset(), spans)  # type: ignore[list-item,arg-type]
    w._send = lambda b: None  # type: ignore[method-assign]
    token.hold = Hold.LAPSED
    w._in_flight = batch
    w._commit_result = w._committer.submit(w._commit, batch)
    w.process_batch()  # pauses: completes the in-flight batch, which the committer aborted
    assert w.state is PAUSED and w._in_flight is None
    assert consumer.seeks == [40]
    w._committer.shutdown()


def test_a_batch_aborted_by_kafka_rewinds_every_source_read_since_it_began(
    tmp_path: Path,
) -> None:
    """An abortable transaction error (the Lease still held): the batch is redone, and
    so is the batch prepared meanwhile, which read a source the aborted one did not (a
    forwarded record, under ownership). That source is rewound to where the prepared
    batch began it; otherwise its records there would never be read again."""
    token = Token()
    w = paused_worker(tmp_path, token)
    w.config = replace(w.config, owned_topic="in.owned", workers=1)
    seeks: list[tuple[str, str, int, int]] = []

    class Consumer(FakeConsumer):
        def __init__(self, committed: int, reads: str) -> None:
            super().__init__(committed)
            self.reads = reads

        def seek(self, tp: TopicPartition) -> None:
            seeks.append((self.reads, tp.topic, tp.partition, tp.offset))

        def consumer_group_metadata(self) -> object:
            return object()

    class Aborting(FakeProducer):
        def send_offsets_to_transaction(self, offsets: Any, metadata: Any) -> None:
            self.calls.append("offsets")

        def commit_transaction(self) -> None:
            self.calls.append("commit")
            err = KafkaError(KafkaError.NOT_COORDINATOR, "moving", txn_requires_abort=True)
            raise KafkaException(err)

    w.consumer = Consumer(42, "input")  # type: ignore[assignment]
    w.forwarded_consumer = Consumer(0, "forwarded")  # type: ignore[assignment]
    w.producer = Aborting()  # type: ignore[assignment]
    aborted = _Batch([], None, [], frozenset(), {("in", 0): (40, 41)})  # type: ignore[arg-type]
    prepared = _Batch(
        [],
        None,  # type: ignore[arg-type]
        [],  # type: ignore[arg-type]
        frozenset(),
        {("in", 0): (41, 43), ("in.owned", 0): (7, 9)},
    )
    w._prepare = lambda: prepared  # type: ignore[method-assign]
    w._send = lambda b: pytest.fail("nothing is sent after an abort")  # type: ignore[method-assign]
    w._in_flight = aborted
    w._commit_result = w._committer.submit(w._commit, aborted)
    w.process_batch()
    assert w.producer.calls[-2:] == ["commit", "abort"]  # type: ignore[attr-defined]
    assert w.state is RUNNING and w._in_flight is None
    # the aborted batch's source from its first offset; the internal partition, which
    # only the prepared batch read, from the prepared batch's first offset of it, each
    # by the consumer that reads it
    assert sorted(seeks) == [("forwarded", "in.owned", 0, 7), ("input", "in", 0, 40)]
    w._committer.shutdown()


def test_an_aborted_abort_is_a_kafka_failure_not_a_silent_pause(tmp_path: Path) -> None:
    token = Token()
    w = paused_worker(tmp_path, token)

    class Refusing(FakeProducer):
        def abort_transaction(self, timeout: float) -> None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "abort timed out"))

    w.producer = Refusing()  # type: ignore[assignment]
    token.hold = Hold.LAPSED
    with pytest.raises(KafkaException):
        w._commit(_Batch([], None, [], frozenset(), {}))  # type: ignore[arg-type]


def test_probes_while_paused_not_ready_but_alive() -> None:
    import urllib.error
    import urllib.request

    from dedup_worker.metrics import Health, WorkerMetrics, serve

    health = Health()
    health.ready, health.paused = False, True
    server = serve(WorkerMetrics("events", 0), health, 0, "127.0.0.1")
    port = server.server_address[1]
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert refused.value.code == 503
        assert refused.value.read() == b"paused: Lease not renewed\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as ok:
            assert ok.status == 200
    finally:
        server.shutdown()
        server.server_close()
