"""Pause, don't die: a worker whose Lease hold lapsed pauses and resumes when it renews
again at its own epoch; only another holder or a newer epoch fences it (exit 3).

The pure state machine (`dedup_worker.lease`), the LeaseToken's renew loop against a fake
API (errors, 409 with a re-read), and the loop's pause and resume with fake Kafka clients
(no broker: what the loop does with them is what is checked)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from dedup_contract.batch import select_new, triage
from dedup_contract.ids import IdSpec
from dedup_contract.lease_clock import LeaseTiming
from dedup_contract.window import WindowPolicy
from dedup_worker.config import WorkerConfig
from dedup_worker.fencing import Fenced, FencingToken, LeaseToken
from dedup_worker.lease import (
    Claim,
    Hold,
    LeaseRecord,
    WorkerState,
    after_renew_conflict,
    hold_state,
    next_state,
)
from dedup_worker.loop import DedupWorker, PublisherFactory, read_only_after
from dedup_worker.metrics import WorkerMetrics
from dedup_worker.routing import Source
from dedup_worker.transaction import Batch, Publisher

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
    """confluent-kafka's Consumer as the worker's reader uses it, with no broker: every
    source asked has `committed_offset` committed; nothing is ever fetched."""

    def __init__(self, committed: int, reads: str = "input") -> None:
        self.committed_offset = committed
        self.reads = reads
        self.seeks: list[tuple[str, str, int, int]] = []
        self.consumed = 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[Any]:
        return [TopicPartition(tp.topic, tp.partition, self.committed_offset) for tp in partitions]

    def assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((self.reads, tp.topic, tp.partition, tp.offset))

    def consume(self, n: int, timeout: float) -> list[Any]:
        self.consumed += 1
        return []

    def list_topics(self, topic: str, timeout: float) -> Any:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "no broker"))

    def get_watermark_offsets(self, tp: TopicPartition, **kw: Any) -> tuple[int, int]:
        return 0, self.committed_offset

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.committed_offset) for tp in tps]

    def consumer_group_metadata(self) -> object:
        return object()

    def close(self) -> None:
        pass


class FakeProducer:
    """The transactional producer as the Publisher uses it: what it was asked, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, *args: Any, **kw: Any) -> None:
        self.calls.append("produce")

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any) -> None:
        self.calls.append("offsets")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")

    def flush(self, timeout: float = 0) -> int:
        self.calls.append("flush")
        return 0

    def commit_transaction(self) -> None:
        self.calls.append("commit")

    def poll(self, timeout: float = 0) -> int:  # served while idle
        return 0


def config(tmp_path: Path, **changes: Any) -> WorkerConfig:
    cfg = WorkerConfig(
        bootstrap_servers="127.0.0.1:1",
        input_topic="in",
        output_topic="out",
        partition=0,
        store_path=tmp_path / "store",
        window=WindowPolicy(duration_ms=3600_000, max_keys=None),
        pipeline="events",
    )
    return replace(cfg, **changes)


def publisher_with(producer: FakeProducer) -> PublisherFactory:
    def make(
        cfg: WorkerConfig, token: FencingToken, metrics: WorkerMetrics, group: Callable[[], object]
    ) -> Publisher:
        return Publisher(cfg, token, metrics, group, make_producer=lambda settings: producer)  # type: ignore[arg-type,return-value]

    return make


class UntouchedStore:
    """The store of a worker that reads no records: only closed."""

    def close(self) -> None:
        pass


def paused_worker(
    tmp_path: Path,
    token: Token,
    producer: FakeProducer | None = None,
    consumers: list[FakeConsumer] | None = None,
    **changes: Any,
) -> DedupWorker:
    """A worker as `start()` leaves it, on fake clients: producer opened, the consumers
    made (the input's, then the internal topic's under ownership), its sources assigned
    at their committed offsets. Its store is never touched: no records are read."""
    made = list(consumers or [FakeConsumer(42)])
    w = DedupWorker(
        config(tmp_path, **changes),
        fencing=token,
        publisher=publisher_with(producer or FakeProducer()),
        make_consumer=lambda settings: made.pop(0),  # type: ignore[arg-type,return-value]
    )
    w.publisher.open()
    w.reader.open()
    if w.internal is not None:
        w.internal.open(w.reader.settings())
        w.reader.assign([("in", 0), (w.internal.topic, 0)])
    else:
        w.reader.assign_all()
    w.store = UntouchedStore()  # type: ignore[assignment]
    w.health.ready = True
    return w


def empty_batch(spans: dict[Source, tuple[int, int]]) -> Batch:
    """A batch of no records that read `spans` (what its commit sends as offsets)."""
    split = triage([], IdSpec())
    return Batch([], split, select_new(split.firsts, []), frozenset(), spans)


def gauge(w: DedupWorker, name: str) -> float:
    value = w.metrics.registry.get_sample_value(name, {"pipeline": "events", "partition": "0"})
    assert value is not None
    return value


def test_lapsed_worker_pauses_stays_alive_and_resumes_from_the_committed_offset(
    tmp_path: Path,
) -> None:
    token = Token()
    consumer = FakeConsumer(42)
    w = paused_worker(tmp_path, token, consumers=[consumer])
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
    assert consumer.seeks == [("input", "in", 0, 40)], "resumed from the last committed offset"
    assert consumer.consumed == 2
    assert gauge(w, "dedup_paused") == 0
    assert gauge(w, "dedup_fencing_events_total") == 0


def test_paused_worker_that_finds_the_lease_lost_is_fenced(tmp_path: Path) -> None:
    token = Token()
    w = paused_worker(tmp_path, token)
    token.hold = Hold.LAPSED
    w.process_batch()
    token.hold = Hold.LOST
    with pytest.raises(Fenced, match="taken over"):
        w.process_batch()
    assert w.state is FENCED and gauge(w, "dedup_fencing_events_total") == 1
    token.hold = Hold.HELD  # fenced is final, whatever the token says later
    with pytest.raises(Fenced):
        w.process_batch()


def publisher(tmp_path: Path, token: Token, producer: FakeProducer) -> Publisher:
    """A Publisher on a fake producer, opened (its transactions initialised)."""
    cfg = config(tmp_path)
    made = Publisher(
        cfg,
        token,
        WorkerMetrics(cfg.pipeline, cfg.partition),
        object,
        make_producer=lambda settings: producer,  # type: ignore[arg-type,return-value]
    )
    made.open()
    return made


def test_commit_with_a_lapsed_hold_aborts_and_is_redone_with_a_lost_one_fences(
    tmp_path: Path,
) -> None:
    token = Token()
    producer = FakeProducer()
    pub = publisher(tmp_path, token, producer)
    token.hold = Hold.LAPSED
    pub.send(empty_batch({}))
    assert pub.in_flight is not None
    assert pub.result() is False, "aborted: redone after the pause"
    assert pub.in_flight is None
    # what the transaction holds is delivered before the abort (librdkafka#4849)
    assert producer.calls == ["init", "begin", "flush", "abort"]
    assert pub.metrics.aborts._value.get() == 1 and pub.metrics.fencing_events._value.get() == 0
    token.hold = Hold.LOST
    pub.send(empty_batch({}))
    with pytest.raises(Fenced, match="taken over"):
        pub.result()
    assert producer.calls[4:] == ["begin", "abort"] and "commit" not in producer.calls
    assert pub.fence == "taken over" and pub.metrics.fencing_events._value.get() == 1
    pub.close()


def test_a_held_commit_flushes_sends_the_offsets_and_commits(tmp_path: Path) -> None:
    producer = FakeProducer()
    pub = publisher(tmp_path, Token(), producer)
    pub.send(empty_batch({("in", 0): (40, 41)}))
    assert pub.result() is True
    assert producer.calls == ["init", "begin", "flush", "offsets", "commit"]
    assert pub.last_commit_at is not None and pub.metrics.transactions._value.get() == 1
    pub.close()


def test_in_flight_batch_aborted_by_the_lapse_rewinds_the_input(tmp_path: Path) -> None:
    token = Token()
    consumer = FakeConsumer(42)
    w = paused_worker(tmp_path, token, consumers=[consumer])
    token.hold = Hold.LAPSED
    w.publisher.send(empty_batch({("in", 0): (40, 41)}))  # the committer aborts it
    w.process_batch()  # pauses: completes the in-flight batch, which the committer aborted
    assert w.state is PAUSED and w.publisher.in_flight is None
    assert consumer.seeks == [("input", "in", 0, 40)]
    w.close()


class Aborting(FakeProducer):
    def commit_transaction(self) -> None:
        self.calls.append("commit")
        err = KafkaError(KafkaError.NOT_COORDINATOR, "moving", txn_requires_abort=True)
        raise KafkaException(err)


def test_a_batch_aborted_by_kafka_is_read_again_and_nothing_is_sent_after_it(
    tmp_path: Path,
) -> None:
    """An abortable transaction error (the Lease still held): the batch is redone from
    its first offsets, each source by the consumer that reads it, and the worker runs on."""
    producer = Aborting()
    consumers = [FakeConsumer(42), FakeConsumer(0, "forwarded")]
    w = paused_worker(
        tmp_path,
        Token(),
        producer,
        consumers=list(consumers),
        owned_topic="in.owned",
        workers=1,
    )
    w.publisher.send(empty_batch({("in", 0): (40, 41), ("in.owned", 0): (7, 9)}))
    w.process_batch()
    assert producer.calls[-2:] == ["commit", "abort"]
    assert w.state is RUNNING and w.publisher.in_flight is None
    seeks = [seek for consumer in consumers for seek in consumer.seeks]
    assert sorted(seeks) == [("forwarded", "in.owned", 0, 7), ("input", "in", 0, 40)]
    assert producer.calls.count("begin") == 1, "nothing is sent after an abort"
    w.close()


def test_a_source_only_the_prepared_batch_read_is_read_again_from_its_first_offset() -> None:
    """The batch prepared while the aborted one committed is dropped too: a source it
    read that the aborted batch did not (a forwarded record, under ownership) is rewound
    to where the prepared batch began it; otherwise its records there would never be
    read again. The aborted batch's own sources are rewound by the worker already."""
    aborted = {("in", 0): (40, 41)}
    prepared = {("in", 0): (41, 43), ("in.owned", 0): (7, 9)}
    assert read_only_after(aborted, prepared) == {("in.owned", 0): (7, 9)}
    assert read_only_after(aborted, {("in", 0): (41, 43)}) == {}


def test_an_aborted_abort_is_a_kafka_failure_not_a_silent_pause(tmp_path: Path) -> None:
    class Refusing(FakeProducer):
        def abort_transaction(self, timeout: float) -> None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "abort timed out"))

    token = Token()
    pub = publisher(tmp_path, token, Refusing())
    token.hold = Hold.LAPSED
    pub.send(empty_batch({}))
    with pytest.raises(KafkaException):
        pub.result()
    pub.close()


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
