"""Crash safety: SIGKILL the worker at random moments (and, through the test-only fault
point, right between a Kafka commit and the store write) while input flows; an
independent reader then finds every id exactly once, in input order."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from dedup_local import kafka as local_kafka
from dedup_local.paths import free_port
from dedup_spark import audit_job
from dedup_spark.audit_model import AuditRange
from dedup_spark.source import KafkaSource
from support.ownership_pipeline import WORKERS, Pipeline, assert_exact
from support.ownership_pipeline import produce as produce_routed
from support.worker_helpers import (
    event,
    produce,
    read_committed,
    start_worker,
    unique,
    worker_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.cluster_group("kafka-spark")]

RECORDS = 200_000
DUPLICATE_SHARE = 0.05
MIN_KILLS = 20


def make_stream(rng: random.Random) -> list[str]:
    """RECORDS ids of which 5% repeat an earlier id: half recent, half far back."""
    ids: list[str] = []
    unique_count = 0
    for _ in range(RECORDS):
        if ids and rng.random() < DUPLICATE_SHARE:
            back = rng.randint(1, 50) if rng.random() < 0.5 else rng.randint(1, len(ids))
            ids.append(ids[max(0, len(ids) - back)])
        else:
            ids.append(f"c{unique_count}")
            unique_count += 1
    return ids


def committed_offset(bootstrap: str, group: str, topic: str) -> int:
    return local_kafka.committed_offsets(bootstrap, group, topic, [0])[0]


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_sigkill_at_random_points_loses_and_doubles_nothing(kafka: Any, tmp_path: Path) -> None:
    rng = random.Random(20261121)
    name = unique("chaos")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    cfg = worker_config(kafka.bootstrap, tmp_path, name, batch_size=1000, linger_ms=20)
    ids = make_stream(rng)

    def feed() -> None:  # input keeps flowing while workers die
        for start in range(0, RECORDS, 4000):
            chunk = ids[start : start + 4000]
            produce(
                kafka.bootstrap, cfg.input_topic, (event(i, start + n) for n, i in enumerate(chunk))
            )
            time.sleep(0.2)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    log = tmp_path / "workers.log"
    fault_env = {"DEDUP_TEST_FAULTS": "after-commit=0.03,before-commit=0.01"}
    external_kills = self_kills = 0
    done_under_chaos = 0
    deadline = time.monotonic() + 600
    # Kill until enough kills have landed, the input has all been written, and the
    # killed workers between them have committed at least half of it: on a loaded
    # machine a worker spends much of its short life starting, so the number of
    # kills alone does not say that the kills landed while work was being done.
    while external_kills < MIN_KILLS or feeder.is_alive() or done_under_chaos <= RECORDS // 2:
        assert time.monotonic() < deadline, (
            f"chaos phase took too long: {done_under_chaos} of {RECORDS} committed"
        )
        proc = start_worker(cfg, log, env=fault_env)
        try:
            proc.wait(timeout=rng.uniform(1.0, 4.0))
            assert proc.returncode == -signal.SIGKILL, f"worker exited {proc.returncode}; see {log}"
            self_kills += 1  # a fault point fired
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            external_kills += 1
        done_under_chaos = committed_offset(kafka.bootstrap, cfg.group, cfg.input_topic)
    feeder.join()
    print(f"input committed by the workers that were killed: {done_under_chaos} of {RECORDS}")
    assert done_under_chaos > RECORDS // 2, "the kills must land while work is being done"

    port = free_port()
    final = start_worker(cfg, log, metrics_port=port)
    try:
        deadline = time.monotonic() + 300
        while not ready(port):
            assert final.poll() is None, f"final worker died; see {log}"
            assert time.monotonic() < deadline, "final worker did not become ready"
            time.sleep(0.2)
        while committed_offset(kafka.bootstrap, cfg.group, cfg.input_topic) < RECORDS:
            assert final.poll() is None, f"final worker died; see {log}"
            assert time.monotonic() < deadline, "final worker did not catch up"
            time.sleep(0.5)
    finally:
        final.send_signal(signal.SIGTERM)
        assert final.wait(timeout=60) == 0

    published = [
        json.loads(m.value())["messageId"]
        for m in read_committed(kafka.bootstrap, cfg.output_topic)
    ]
    expected = list(dict.fromkeys(ids))
    duplicates = len(published) - len(set(published))
    missing = set(expected) - set(published)
    print(
        f"kills: {external_kills} external + {self_kills} at fault points; published {len(published)}"
    )
    assert external_kills + self_kills >= MIN_KILLS
    assert duplicates == 0, f"{duplicates} duplicate ids in the output"
    assert not missing, f"{len(missing)} ids missing from the output, e.g. {sorted(missing)[:5]}"
    assert published == expected, "output is in input order"


OWNED_RECORDS = 60_000


def test_sigkill_under_ownership_with_a_round_robin_producer(
    kafka: Any, spark: SparkSession, tmp_path: Path
) -> None:
    """Two workers under ownership, input written round-robin (each repeat on any
    partition), SIGKILLed at random moments and at the fault points: right after a
    commit, before it, and in the middle of forwarding (a transaction open with records
    on the internal topic). Every id is then published exactly once across the output,
    on its owner's partition, and the Spark audit passes on that output."""
    rng = random.Random(20261125)
    pipe = Pipeline(kafka, tmp_path, inputs=2)
    ids = make_stream(rng)[:OWNED_RECORDS]
    placement = pipe.placement(list(dict.fromkeys(ids)))

    def feed() -> None:  # round-robin: record n to partition n % 2
        for start in range(0, len(ids), 2000):
            chunk = ids[start : start + 2000]
            produce_routed(
                pipe.bootstrap,
                pipe.input_topic,
                ((i, i, (start + n) % 2) for n, i in enumerate(chunk)),
            )
            time.sleep(0.2)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    fault_env = {"DEDUP_TEST_FAULTS": "after-commit=0.02,before-commit=0.01,forwarding=0.002"}
    kills = self_kills = 0
    deadline = time.monotonic() + 600
    for worker in range(WORKERS):
        pipe.start(worker, env=fault_env)
    while kills < MIN_KILLS or feeder.is_alive():
        assert time.monotonic() < deadline, "chaos phase took too long"
        time.sleep(rng.uniform(0.5, 2.0))
        victim = pipe.procs[rng.randrange(WORKERS)]
        if victim.poll() is None:
            victim.kill()
            kills += 1
        for worker, proc in list(pipe.procs.items()):  # restart whoever is down
            if proc.poll() is not None:
                assert proc.wait() == -signal.SIGKILL, f"worker exited {proc.returncode}"
                self_kills += proc is not victim
                pipe.start(worker, env=fault_env)
    feeder.join()
    for proc in pipe.procs.values():
        proc.kill()
        proc.wait()
    pipe.start_all()  # without faults
    pipe.wait_settled(set(ids), timeout_s=300)
    time.sleep(2)
    assert_exact(pipe.output(), placement)
    print(f"kills: {kills} external + {self_kills} at fault points")
    assert self_kills > 0, "the fault points fired"
    pipe.stop_all()
    cfg = pipe.config(0)
    now_ms = int(time.time() * 1000)
    summary = audit_job.run(
        spark,
        audit_job.AuditJob(
            pipeline=pipe.name,
            namespace="default",
            kafka=KafkaSource(pipe.bootstrap),
            input_topic=pipe.input_topic,
            output_topic=pipe.output_topic,
            dead_letter_topic=cfg.dead_letter_topic,
            id_spec=cfg.id_spec,
            window_ms=24 * 3_600_000,
            slack_ms=6 * 3_600_000,  # the window's coarseness: 1/generations
            audit_range=AuditRange(now_ms - 3_600_000, now_ms + 3_600_000),
            report_dir=str(tmp_path / "audit"),
            consumer_group=cfg.group,
            workers=WORKERS,
            owned_topic=pipe.owned_topic,
        ),
    )
    totals = summary["totals"]
    assert summary["passed"], json.dumps(totals)
    assert (totals["duplicates"], totals["misplaced"], totals["missing"]) == (0, 0, 0)
    assert totals["published"] == len(set(ids)) and totals["pending"] == 0
