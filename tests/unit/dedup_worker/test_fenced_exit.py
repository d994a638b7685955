"""However a worker learns it is fenced — its token lost, or the producer answering a
call with a fence or a fatal error — it stops with `Fenced` (exit 3), counted once;
other Kafka errors are not mistaken for a fence. No broker needed: the Publisher
(transaction.py) through its surface, on a fake producer, and the loop's checks before
any client is created."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from dedup_contract.batch import select_new, triage
from dedup_contract.ids import IdSpec
from dedup_contract.window import WindowPolicy
from dedup_worker import transaction
from dedup_worker.config import WorkerConfig
from dedup_worker.fencing import Fenced
from dedup_worker.lease import Hold
from dedup_worker.loop import DedupWorker
from dedup_worker.metrics import WorkerMetrics
from dedup_worker.transaction import LIBRDKAFKA_LOG, Batch, Publisher


class Token:
    """A fencing token whose hold the test sets."""

    def __init__(self, hold: Hold = Hold.HELD) -> None:
        self.hold = hold

    def held(self) -> bool:
        return self.hold is Hold.HELD

    def state(self) -> Hold:
        return self.hold

    def why_not_held(self) -> str:
        if self.hold is Hold.LOST:
            return "Lease ns/p0 was taken over by events-p0-e3 (epoch 3; ours 2)"
        return "Lease ns/p0 not renewed within the renew deadline"


def config(tmp_path: Path) -> WorkerConfig:
    return WorkerConfig(
        bootstrap_servers="127.0.0.1:1",
        input_topic="in",
        output_topic="out",
        partition=0,
        store_path=tmp_path / "store",
        window=WindowPolicy(duration_ms=3600_000, max_keys=None),
        pipeline="events",
    )


class Failing:
    """A transactional producer whose call `failing` raises `err`; its poll serves
    `served` to the error callback first (librdkafka hands the fatal error's reason to
    the callback at the next poll, after `produce` said only _FATAL)."""

    def __init__(self, settings: dict[str, Any], failing: str, err: KafkaError) -> None:
        self.error_cb = settings["error_cb"]
        self.failing, self.err = failing, err
        self.served: KafkaError | None = None

    def _call(self, name: str) -> None:
        if name == self.failing:
            raise KafkaException(self.err)

    def init_transactions(self, timeout: float) -> None:
        self._call("init_transactions")

    def begin_transaction(self) -> None:
        self._call("begin_transaction")

    def flush(self, timeout: float = 0) -> int:
        return 0

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any) -> None:
        pass

    def commit_transaction(self) -> None:
        self._call("commit_transaction")

    def abort_transaction(self, timeout: float) -> None:
        pass

    def poll(self, timeout: float = 0) -> int:
        if self.served is not None:
            served, self.served = self.served, None
            self.error_cb(served)
        return 0

    def produce(self, *args: Any, **kw: Any) -> None:
        pass


def publisher(tmp_path: Path, failing: str, err: KafkaError) -> tuple[Publisher, list[Failing]]:
    """A Publisher on a `Failing` producer (the producer, once made, in the list)."""
    made: list[Failing] = []

    def make(settings: dict[str, Any]) -> Failing:
        made.append(Failing(settings, failing, err))
        return made[-1]

    cfg = config(tmp_path)
    pub = Publisher(
        cfg,
        Token(),
        WorkerMetrics(cfg.pipeline, cfg.partition),
        object,
        make_producer=make,  # type: ignore[arg-type]
    )
    return pub, made


def send_one(pub: Publisher) -> None:
    """Send an empty batch and wait for its commit."""
    split = triage([], IdSpec())
    pub.send(Batch([], split, select_new(split.firsts, []), frozenset(), {("in", 0): (0, 1)}))
    pub.result()


FENCES = [
    # what produce() raises once the producer is fenced: only "_FATAL"
    KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error"),
    KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True),
    KafkaError(KafkaError.PRODUCER_FENCED, "fenced"),
    KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "old epoch"),
    KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "denied", fatal=True),
]
LEARNED_DURING = {  # the producer call that failed -> how the fence's reason names it
    "init_transactions": "init_transactions",
    "begin_transaction": "produce (begin_transaction, produce)",
    "commit_transaction": "commit (flush, send_offsets_to_transaction, commit_transaction)",
}


@pytest.mark.parametrize("call", LEARNED_DURING)
@pytest.mark.parametrize("err", FENCES)
def test_fence_or_fatal_error_from_any_producer_call_is_fenced(
    tmp_path: Path, call: str, err: KafkaError
) -> None:
    pub, _ = publisher(tmp_path, call, err)
    if call == "init_transactions":
        with pytest.raises(Fenced, match="another worker took over transactional id"):
            pub.open()
    else:
        pub.open()
        for _ in range(2):
            with pytest.raises(Fenced, match="another worker took over transactional id"):
                send_one(pub)
    assert pub.fence is not None and f"learned during {LEARNED_DURING[call]}" in pub.fence
    assert pub.metrics.fencing_events._value.get() == 1, "counted once per worker"
    pub.close()


@pytest.mark.parametrize("call", ["begin_transaction", "commit_transaction"])
@pytest.mark.parametrize(
    "err",
    [
        KafkaError(KafkaError._MSG_TIMED_OUT, "timed out", retriable=True),
        KafkaError(KafkaError._TRANSPORT, "broker down"),
    ],
)
def test_other_kafka_errors_are_not_a_fence(tmp_path: Path, call: str, err: KafkaError) -> None:
    pub, _ = publisher(tmp_path, call, err)
    pub.open()
    with pytest.raises(KafkaException) as raised:
        send_one(pub)
    assert not isinstance(raised.value, Fenced) and raised.value.args[0] is err
    assert pub.fence is None and pub.metrics.fencing_events._value.get() == 0
    pub.close()


def test_an_abortable_commit_error_is_redone_not_a_fence(tmp_path: Path) -> None:
    err = KafkaError(KafkaError.NOT_COORDINATOR, "moving", txn_requires_abort=True)
    pub, _ = publisher(tmp_path, "commit_transaction", err)
    pub.open()
    split = triage([], IdSpec())
    pub.send(Batch([], split, select_new(split.firsts, []), frozenset(), {}))
    assert pub.result() is False, "aborted: the batch is redone"
    assert pub.fence is None and pub.metrics.aborts._value.get() == 1
    pub.close()


@pytest.mark.parametrize(
    "produce_failed",
    [
        KafkaError(KafkaError._FATAL, "Unable to produce"),
        # librdkafka's thread moves the transaction to its fatal state before it sets
        # the producer's fatal error: a produce in between says only _STATE
        KafkaError(KafkaError._STATE, "Unable to produce message: Local: Erroneous state"),
    ],
)
def test_fatal_reason_served_later_names_the_real_cause(
    tmp_path: Path, produce_failed: KafkaError
) -> None:
    pub, made = publisher(tmp_path, "begin_transaction", produce_failed)
    pub.open()
    made[0].served = KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
    with pytest.raises(Fenced, match="fenced by a newer instance"):
        send_one(pub)
    assert pub.metrics.fencing_events._value.get() == 1
    pub.close()


@pytest.mark.parametrize("abortable", [False, True])
def test_a_state_error_without_a_fatal_error_is_not_a_fence(
    tmp_path: Path, abortable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transaction, "FATAL_SETTLE_S", 0.05)
    err = KafkaError(KafkaError._STATE, "not in a transaction", txn_requires_abort=abortable)
    pub, _ = publisher(tmp_path, "begin_transaction", err)
    pub.open()
    with pytest.raises(KafkaException) as raised:
        send_one(pub)
    assert not isinstance(raised.value, Fenced) and raised.value.args[0] is err
    assert pub.fence is None and pub.metrics.fencing_events._value.get() == 0
    pub.close()


def test_token_not_held_at_start_or_lost_stops_the_loop_before_kafka_or_the_store(
    tmp_path: Path,
) -> None:
    token = Token(Hold.LAPSED)
    w = DedupWorker(config(tmp_path), fencing=token)
    with pytest.raises(Fenced, match="not held at start: Lease ns/p0 not renewed"):
        w.start()
    token.hold = Hold.LOST
    with pytest.raises(Fenced, match="Lease ns/p0 was taken over by events-p0-e3"):
        w.process_batch()
    assert not (tmp_path / "store").exists()
    assert w.metrics.fencing_events._value.get() == 1


def test_librdkafkas_own_fence_lines_are_warnings_the_workers_line_is_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fence met while the offsets are added made librdkafka log an ERROR line of its
    own before the worker's one `fenced: ...` line; librdkafka's is now a WARNING. Its
    other ERROR lines stay ERROR."""
    with caplog.at_level(logging.DEBUG, logger="librdkafka"):
        LIBRDKAFKA_LOG.error(
            "ADDOFFSETS [rdkafka#producer-1] [thrd:main]: TxnCoordinator/1: Failed to add "
            "offsets to transaction on broker TxnCoordinator/1: Local: This instance has "
            "been fenced by a newer instance"
        )
        LIBRDKAFKA_LOG.error("FAIL [rdkafka#producer-1]: 127.0.0.1:9092/1: Connection refused")
    assert [(r.levelname, r.getMessage()[:10]) for r in caplog.records] == [
        ("WARNING", "ADDOFFSETS"),
        ("ERROR", "FAIL [rdka"),
    ]
