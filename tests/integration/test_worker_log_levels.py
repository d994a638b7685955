"""What a worker logs at ERROR: what needs a person, and nothing that passes by itself.

librdkafka's "Connect ... failed" lines are WARNINGs while a broker is up or all brokers
have been down for less than 30 s (a broker restart), and ERRORs once all have been down
longer. The worker's own ERROR lines stay: a missing dead-letter topic, none configured
for a record without id, a refused store (a fence, exit 3, is in test_worker_fencing.py).
Workers run as real processes logging JSON lines; a broker is stopped under a running
worker and started again on the same port and data, which the worker must ride out with
exact output. The production grace period (30 s) is used as it is: librdkafka repeats an
identical connection failure only every 30 s, so a shorter one would not shorten the
test."""

from __future__ import annotations

import subprocess
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dedup_contract.exit_codes import EXIT_KAFKA, EXIT_STOPPED_ON_INPUT, EXIT_STORE
from dedup_contract.store import Store, StoreOwner
from dedup_worker.config import WorkerConfig
from support.fencing_helpers import log_records, tail, wait_committed, wait_exit
from support.worker_helpers import event, output_ids, produce, start_worker, unique, worker_config

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]

Record = dict[str, Any]


def connection_failures(records: list[Record]) -> list[Record]:
    """librdkafka's lines saying a connection attempt to a broker failed."""
    return [
        r
        for r in records
        if r.get("logger") == "librdkafka"
        and str(r.get("message", "")).startswith("FAIL ")
        and "Connect to " in r["message"]
        and " failed: " in r["message"]
    ]


def errors(records: list[Record]) -> list[Record]:
    return [r for r in records if r.get("level") == "ERROR"]


def logged_at(record: Record) -> float:
    """When the worker logged the line (its "time", local time to the millisecond), in
    seconds since the epoch."""
    return datetime.strptime(record["time"], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def down_s(record: Record) -> float:
    """How long all brokers had been down when the line was logged (0: not known down)."""
    return float(record.get("all_brokers_down_seconds", 0.0))


def pipeline_on(broker: Any, *suffixes: str) -> str:
    name = unique("lvl")
    for suffix in suffixes:
        broker.create_topic(f"{name}-{suffix}", 1)
    return name


def ids(prefix: str, n: int) -> list[str]:
    """n ids, every fifth a repeat of the one before it."""
    return [f"{prefix}{i - 1 if i % 5 == 4 else i}" for i in range(n)]


def feed(cfg: WorkerConfig, sent: list[str], more: list[str], log: Path) -> None:
    """Produce `more` and wait until the worker has committed all input sent so far."""
    produce(cfg.bootstrap_servers, cfg.input_topic, (event(i) for i in more))
    sent += more
    wait_committed(cfg.bootstrap_servers, cfg.group, cfg.input_topic, len(sent), log)


def wait_for_record(
    log: Path, wanted: Any, timeout_s: float, since: int = 0
) -> tuple[Record, list[Record]]:
    """The first JSON record (from index `since`) for which `wanted` holds, and all."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = log_records(log) if log.exists() else []
        hit = next((r for r in records[since:] if wanted(r)), None)
        if hit is not None:
            return hit, records
        assert time.monotonic() < deadline, f"no such line in {timeout_s}s:\n{tail(log)}"
        time.sleep(0.2)


def judge_a_short_restart(records: list[Record], back: float, log: Path) -> None:
    """The lines of one broker restart, judged on the test's own clock: every connection
    failure logged under 30 s after the first one is a WARNING; when the broker was ready
    again (`back`, epoch seconds) within 30 s of it, no line at all is an ERROR. On a
    loaded machine the broker's JVM may take longer than that to come back (CI,
    2026-11-26, twice): then only the connection failures past 30 s may be ERRORs, and
    the test says so rather than fail."""
    failures = connection_failures(records)
    assert failures, "the restart was seen"
    first = logged_at(failures[0])
    since_first = [(logged_at(r) - first, r) for r in failures]
    assert {r["level"] for s, r in since_first if s < 30} == {"WARNING"}, tail(log)
    assert all(s >= 30 for s, r in since_first if r["level"] == "ERROR"), tail(log)
    outage = back - first
    print(f"broker ready again {outage:.1f}s after the first failed connection")
    if outage < 30:
        assert errors(records) == [], tail(log)
    else:  # the premise did not hold on this machine: only late connection failures
        late = [r for s, r in since_first if s >= 30 and r["level"] == "ERROR"]
        assert errors(records) == late, tail(log)
        print(f"the broker took over 30 s to come back: {len(late)} ERROR line(s) by rule")


def stop_worker(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.terminate()
    assert wait_exit(proc, log, 30) == 0, tail(log)


def test_all_brokers_down_for_over_30_s_is_an_error_then_the_worker_recovers(
    kafka_broker_factory: Any, tmp_path: Path
) -> None:
    broker = kafka_broker_factory()  # its own: the session's broker stays up for others
    cfg = worker_config(broker.bootstrap, tmp_path, pipeline_on(broker, "in", "out", "dlq"))
    log = tmp_path / "worker.log"
    sent: list[str] = []
    proc = start_worker(cfg, log)
    try:
        feed(cfg, sent, ids("a", 300), log)

        stopping = time.monotonic()  # its listener closes early in the shutdown
        broker.stop()
        first_error, records = wait_for_record(
            log, lambda r: r["level"] == "ERROR" and connection_failures([r]), 75
        )
        assert time.monotonic() - stopping >= 30, "an ERROR line only after 30 s down"
        failures = connection_failures(records)
        early = [r for r in failures if down_s(r) < 30]
        assert early and {r["level"] for r in early} == {"WARNING"}, tail(log)
        assert down_s(first_error) >= 30, first_error
        # every ERROR line so far is such a connection failure, beyond 30 s
        assert errors(records) == [r for r in failures if r["level"] == "ERROR"]
        assert all(down_s(r) >= 30 for r in errors(records)), errors(records)
        print(f"{len(early)} WARNING line(s), then ERROR: {first_error['message'][:160]}")

        broker.start()
        feed(cfg, sent, ids("b", 300), log)
        time.sleep(2)  # a statistics report (1 s) with the broker up

        # A short restart afterwards counts afresh: back under 30 s, WARNINGs only.
        # The outage lasts 5 s on the test's clock, not until a line shows: in CI the
        # consumer once logged nothing for 50 s of an outage (2026-11-26). The idle
        # producer is served at every empty poll (loop._serve_idle_producer), so its
        # transaction coordinator's failures are logged at once as well.
        before = len(log_records(log))
        broker.stop()
        time.sleep(5)
        broker.start()
        back = time.time()
        feed(cfg, sent, ids("c", 300), log)
        time.sleep(2)  # a statistics report with the broker up
        judge_a_short_restart(log_records(log)[before:], back, log)
    finally:
        stop_worker(proc, log)
    assert output_ids(broker.bootstrap, cfg.output_topic) == list(dict.fromkeys(sent))


@pytest.mark.parametrize("ownership", [False, True], ids=["one-source", "ownership"])
def test_a_broker_back_within_30_s_leaves_no_error_line(
    kafka_broker_factory: Any, tmp_path: Path, ownership: bool
) -> None:
    """The broker is stopped and started again a few seconds after the worker's first
    failed connection: WARNINGs only (judge_a_short_restart says how). Under ownership
    the internal topic's own consumer fails its connections too, judged by its own
    reports."""
    broker = kafka_broker_factory()
    name = pipeline_on(broker, "in", "out", "dlq", *(["owned"] if ownership else []))
    owned = {"owned_topic": f"{name}-owned", "workers": 1} if ownership else {}
    cfg = worker_config(broker.bootstrap, tmp_path, name, **owned)
    log = tmp_path / "worker.log"
    sent: list[str] = []
    proc = start_worker(cfg, log)
    try:
        feed(cfg, sent, ids("a", 300), log)
        broker.stop()
        wait_for_record(log, lambda r: bool(connection_failures([r])), 30)
        time.sleep(3)
        broker.start()
        back = time.time()
        feed(cfg, sent, ids("b", 300), log)
    finally:
        stop_worker(proc, log)
    judge_a_short_restart(log_records(log), back, log)
    assert output_ids(broker.bootstrap, cfg.output_topic) == list(dict.fromkeys(sent))


def test_a_missing_dead_letter_topic_is_an_error(kafka: Any, tmp_path: Path) -> None:
    # The dead-letter topic is configured but does not exist: the first record without
    # id stops the worker (exit 6) with its ERROR line.
    cfg = worker_config(kafka.bootstrap, tmp_path, pipeline_on(kafka, "in", "out"))
    produce(kafka.bootstrap, cfg.input_topic, [event("a"), b"not json", event("b")])
    log = tmp_path / "worker.log"
    assert wait_exit(start_worker(cfg, log), log, 120) == EXIT_KAFKA, tail(log)
    (line,) = [r for r in errors(log_records(log)) if r["logger"] == "dedup_worker"]
    assert line["message"].startswith("kafka failed: ") and "Unknown topic" in line["message"]
    assert line["exit_code"] == EXIT_KAFKA


def test_no_dead_letter_topic_for_a_record_without_id_is_an_error(
    kafka: Any, tmp_path: Path
) -> None:
    name = pipeline_on(kafka, "in", "out")
    cfg = worker_config(kafka.bootstrap, tmp_path, name, dead_letter_topic=None)
    produce(kafka.bootstrap, cfg.input_topic, [event("a"), b"not json"])
    log = tmp_path / "worker.log"
    assert wait_exit(start_worker(cfg, log), log, 120) == EXIT_STOPPED_ON_INPUT, tail(log)
    (line,) = errors(log_records(log))
    assert "has no valid id" in line["message"] and "no dead-letter topic" in line["message"]


def test_a_refused_store_is_an_error(tmp_path: Path) -> None:
    # The volume holds partition 1's store; a worker for partition 0 is given it. The
    # store is opened before any Kafka client, so no broker is needed.
    cfg = worker_config("127.0.0.1:1", tmp_path, unique("lvl"))
    Store.open(cfg.store_path, StoreOwner(cfg.namespace, cfg.pipeline, 1), cfg.window).close()
    log = tmp_path / "worker.log"
    proc = start_worker(replace(cfg, partition=0), log)
    assert wait_exit(proc, log, 60) == EXIT_STORE, tail(log)
    (line,) = errors(log_records(log))
    assert line["message"].startswith("store refused: ") and "belongs to" in line["message"]
