"""However a worker learns it is fenced — its token lost, or the producer answering a
call with a fence or a fatal error — it stops with `Fenced` (exit 3), counted once;
other Kafka errors are not mistaken for a fence. No broker needed: these are the loop's
classification and checks, before any client is created."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from dedup_contract.window import WindowPolicy
from dedup_worker.config import WorkerConfig
from dedup_worker.fencing import Fenced
from dedup_worker.lease import Hold
from dedup_worker.loop import LIBRDKAFKA_LOG, DedupWorker


class Lapsed:
    hold = Hold.LAPSED

    def held(self) -> bool:
        return False

    def state(self) -> Hold:
        return self.hold

    def why_not_held(self) -> str:
        return "Lease ns/p0 not renewed within the renew deadline"


class Lost(Lapsed):
    hold = Hold.LOST

    def why_not_held(self) -> str:
        return "Lease ns/p0 was taken over by events-p0-e3 (epoch 3; ours 2)"


def worker(tmp_path: Path, fencing: Lapsed | None = None) -> DedupWorker:
    cfg = WorkerConfig(
        bootstrap_servers="127.0.0.1:1",
        input_topic="in",
        output_topic="out",
        partition=0,
        store_path=tmp_path / "store",
        window=WindowPolicy(duration_ms=3600_000, max_keys=None),
        pipeline="events",
    )
    return DedupWorker(cfg, fencing=fencing)


@pytest.mark.parametrize(
    "err",
    [
        # what produce() raises once the producer is fenced: only "_FATAL"
        KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error"),
        KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True),
        KafkaError(KafkaError.PRODUCER_FENCED, "fenced"),
        KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "old epoch"),
        KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "denied", fatal=True),
    ],
)
def test_fence_or_fatal_error_from_any_producer_call_is_fenced(
    tmp_path: Path, err: KafkaError
) -> None:
    w = worker(tmp_path)
    with pytest.raises(Fenced, match="another worker took over transactional id"):
        w._raise_if_fenced(KafkaException(err))
    with pytest.raises(Fenced):
        w._raise_if_fenced(KafkaException(err))
    assert w.metrics.fencing_events._value.get() == 1, "counted once per worker"


@pytest.mark.parametrize(
    "err",
    [
        KafkaError(KafkaError._MSG_TIMED_OUT, "timed out", retriable=True),
        KafkaError(KafkaError.NOT_COORDINATOR, "moving", txn_requires_abort=True),
        KafkaError(KafkaError._TRANSPORT, "broker down"),
    ],
)
def test_other_kafka_errors_are_not_a_fence(tmp_path: Path, err: KafkaError) -> None:
    w = worker(tmp_path)
    w._raise_if_fenced(KafkaException(err))  # returns: the caller handles or re-raises
    assert w.metrics.fencing_events._value.get() == 0


def test_fatal_reason_served_later_names_the_real_cause(tmp_path: Path) -> None:
    w = worker(tmp_path)
    w._on_kafka_error(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))
    with pytest.raises(Fenced, match="fenced by a newer instance"):
        w._raise_if_fenced(KafkaException(KafkaError(KafkaError._FATAL, "Unable to produce")))


def test_token_not_held_at_start_or_lost_stops_the_loop_before_kafka_or_the_store(
    tmp_path: Path,
) -> None:
    w = worker(tmp_path, Lapsed())
    with pytest.raises(Fenced, match="not held at start: Lease ns/p0 not renewed"):
        w.start()
    w.fencing = Lost()
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
