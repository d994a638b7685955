"""Each id published once however producers partition, on the real broker: workers
under ownership (dedup_worker.routing) forward the records they do not own through the
internal topic, read input partitions that appear while they run, and rebuild a lost
store from every output partition.

The oracle is the broker and librdkafka, not our hash (support/ownership_pipeline.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from dedup_contract.ids import ID_HEADER
from dedup_local import kafka as local_kafka
from dedup_local.pod_health import error_line
from dedup_worker.cli import arguments
from dedup_worker.routing import FORWARD_ORIGIN, forward_headers
from support.ownership_pipeline import (
    WORKERS,
    Pipeline,
    assert_exact,
    event,
    output_id,
    produce,
)
from support.worker_helpers import start_worker

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]


def test_round_robin_producer_every_id_once_across_the_output(kafka: Any, tmp_path: Path) -> None:
    """Each id sent twice, the copies on different partitions (as a producer keyed by
    anything but the id does): every repeat is caught, whichever copy comes first."""
    pipe = Pipeline(kafka, tmp_path, inputs=2)
    ids = [f"rr-{i}" for i in range(2000)]
    placement = pipe.placement(ids)
    pipe.start_all()
    # the first copy on the owner's partition for half the ids, on the other for the rest
    first = [(i, i, placement[i] if n % 2 else 1 - placement[i]) for n, i in enumerate(ids)]
    second = [(i, i, 1 - p) for i, _, p in first]
    produce(pipe.bootstrap, pipe.input_topic, first)
    produce(pipe.bootstrap, pipe.input_topic, second)
    out = pipe.wait_settled(set(ids))
    time.sleep(2)
    assert_exact(pipe.output(), placement)
    forwarded = sum(pipe.metric(w, "dedup_records_forwarded_total") for w in range(WORKERS))
    received = sum(pipe.metric(w, "dedup_records_received_total") for w in range(WORKERS))
    # every id has one copy on the wrong partition; a copy read after its id was
    # published by the owner... is still forwarded (only the owner knows)
    assert forwarded == len(ids) == received, (forwarded, received)
    internal = local_kafka.read_committed(pipe.bootstrap, pipe.owned_topic, [0, 1], settle_s=1)
    origins = [dict(m.headers() or [])[FORWARD_ORIGIN] for m in internal]
    assert len(origins) == len(ids) and all(re.fullmatch(rb"[01]:\d+", o) for o in origins)
    assert len(out) == len(ids)
    # each owner deletes the forwarded records it has committed (deleteRecords)
    group = pipe.config(0).group
    committed = local_kafka.committed_offsets(pipe.bootstrap, group, pipe.owned_topic, [0, 1])
    reader = Consumer({"bootstrap.servers": pipe.bootstrap, "group.id": pipe.name})
    deadline = time.monotonic() + 30
    while True:
        starts = [
            reader.get_watermark_offsets(TopicPartition(pipe.owned_topic, p), timeout=30)[0]
            for p in (0, 1)
        ]
        if starts == committed:
            break
        assert time.monotonic() < deadline, f"log starts {starts}, committed {committed}"
        time.sleep(1)
    reader.close()
    pipe.stop_all()
    assert pipe.worker_log_problems() == []


def test_librdkafkas_default_partitioner_is_forwarded_and_its_share_shown(
    kafka: Any, tmp_path: Path
) -> None:
    """A producer on librdkafka's default partitioner (consistent_random: CRC32, not
    murmur2) keyed by the id puts about half the ids on a partition their owner does not
    read: the metrics show the misrouted share, and the output is exact."""
    pipe = Pipeline(kafka, tmp_path, inputs=2)
    ids = [f"crc-{i}" for i in range(3000)]
    placement = pipe.placement(ids)
    pipe.start_all()
    records = [(i, i, None) for i in ids] + [(i, i, None) for i in ids[::3]]
    produce(pipe.bootstrap, pipe.input_topic, records, partitioner="consistent_random")
    pipe.wait_settled(set(ids))
    time.sleep(2)
    assert_exact(pipe.output(), placement)
    read = sum(pipe.metric(w, "dedup_records_in_total") for w in range(WORKERS))
    received = sum(pipe.metric(w, "dedup_records_received_total") for w in range(WORKERS))
    forwarded = sum(pipe.metric(w, "dedup_records_forwarded_total") for w in range(WORKERS))
    share = forwarded / read
    print(f"misrouted share with librdkafka's default partitioner: {share:.1%}")
    assert read == len(records) and received == forwarded
    assert 0.35 < share < 0.65, share
    pipe.stop_all()
    assert pipe.worker_log_problems() == []


def test_batches_aborted_by_kafka_are_redone_with_every_forwarded_record(
    kafka: Any, tmp_path: Path
) -> None:
    """Kafka aborts half the transactions (an abortable error before the commit,
    the Lease still held): each aborted batch is redone, and so is the batch prepared
    while it committed, including the forwarded records that only the prepared batch
    read. Every id is published once; none is skipped."""
    pipe = Pipeline(kafka, tmp_path, inputs=2)
    ids = [f"abort-{i}" for i in range(3000)]
    placement = pipe.placement(ids)
    faulty = {"DEDUP_TEST_FAULTS": "abortable-before-commit=0.5"}
    for worker in range(WORKERS):
        pipe.start(worker, env=faulty)
    for start in range(0, len(ids), 100):  # round-robin, in bursts: 1/2 forwarded
        chunk = ids[start : start + 100]
        produce(pipe.bootstrap, pipe.input_topic, [(i, i, n % 2) for n, i in enumerate(chunk)])
        time.sleep(0.1)
    pipe.wait_settled(set(ids), timeout_s=120)
    time.sleep(2)
    assert_exact(pipe.output(), placement)
    aborts = sum(pipe.metric(w, "dedup_transaction_aborts_total") for w in range(WORKERS))
    forwarded = sum(pipe.metric(w, "dedup_records_forwarded_total") for w in range(WORKERS))
    print(f"{aborts:.0f} transactions aborted, {forwarded:.0f} records forwarded")
    assert aborts >= 5 and forwarded > 0
    pipe.stop_all()
    assert pipe.worker_log_problems() == []  # an abort is a WARNING, redone


def discovery_times(log: Path) -> list[float]:
    """When the workers logged finding new input partitions (epoch seconds)."""
    times = []
    for line in log.read_text().splitlines():
        if "input partitions discovered" in line:
            stamp = datetime.strptime(json.loads(line)["time"], "%Y-%m-%d %H:%M:%S,%f")
            times.append(stamp.timestamp())  # the worker's local time, as this process's
    return times


@pytest.mark.parametrize("grown", [4, 3], ids=["2to4", "2to3"])
def test_the_input_grows_while_workers_run(kafka: Any, tmp_path: Path, grown: int) -> None:
    """2 -> 4 partitions (a multiple of the workers: nothing forwarded) or 2 -> 3 (not
    a multiple: forwarding starts) mid-stream, with every id of the window repeated keyed
    by id: exact output, no worker restarted. Records reach a new partition before its
    worker has noticed it (the workers are stopped meanwhile, SIGSTOP) and are read from
    the partition's start."""
    pipe = Pipeline(kafka, tmp_path, inputs=2)
    ids = [f"grow-{i}" for i in range(1500)]
    more = [f"grow-new-{i}" for i in range(500)]
    placement = pipe.placement(ids + more)
    pipe.start_all()
    produce(pipe.bootstrap, pipe.input_topic, ((i, i, None) for i in ids))
    pipe.wait_settled(set(ids))
    pids = {w: p.pid for w, p in pipe.procs.items()}

    for proc in pipe.procs.values():
        proc.send_signal(signal.SIGSTOP)
    try:
        kafka.grow_topic(pipe.input_topic, grown)  # the producer below must see them all
        # the repeats and the new ids keyed by id, spread over all `grown` partitions
        where = produce(pipe.bootstrap, pipe.input_topic, ((i, i, None) for i in ids + more))
        produced_at = time.time()
    finally:
        for proc in pipe.procs.values():
            proc.send_signal(signal.SIGCONT)
    on_new = [i for i, p in where.items() if p >= 2]
    assert len(on_new) > 300, "records reached the new partitions"

    pipe.wait_settled(set(ids + more))
    time.sleep(2)
    assert_exact(pipe.output(), placement)
    assert {w: p.pid for w, p in pipe.procs.items()} == pids
    assert all(p.poll() is None for p in pipe.procs.values()), "no worker restarted"
    found = discovery_times(pipe.log)
    assert len(found) == grown - 2, found  # one line per worker that gained a partition
    assert min(found) > produced_at, "the records were produced before the discovery"
    forwarded = sum(pipe.metric(w, "dedup_records_forwarded_total") for w in range(WORKERS))
    if grown % WORKERS == 0:
        assert forwarded == 0, "keyed by id on a multiple of the workers: nothing forwarded"
    else:
        assert forwarded > 0
    pipe.stop_all()
    assert pipe.worker_log_problems() == []


def test_a_lost_store_is_rebuilt_from_every_output_partition(kafka: Any, tmp_path: Path) -> None:
    """A store lost under ownership is rebuilt from all output partitions: an id this
    worker owns that another partition published (as a pipeline that ran without
    ownership did) is not published again."""
    pipe = Pipeline(kafka, tmp_path, inputs=2)
    ids = [f"lost-{i}" for i in range(400)]
    placement = pipe.placement(ids)
    owned_by_0 = [i for i in ids if placement[i] == 0]
    # published earlier on partition 1 by a worker that read them there
    legacy = owned_by_0[:50]
    producer = Producer({"bootstrap.servers": pipe.bootstrap, "transactional.id": pipe.name})
    producer.init_transactions(30)
    producer.begin_transaction()
    for n, message_id in enumerate(legacy):
        producer.produce(
            pipe.output_topic,
            event(message_id, n),
            message_id.encode(),
            partition=1,
            headers=[(ID_HEADER, message_id.encode())],
        )
    producer.commit_transaction(30)

    pipe.start_all()
    produce(pipe.bootstrap, pipe.input_topic, ((i, i, None) for i in ids))
    pipe.wait_settled(set(ids))
    pipe.stop_all()
    out = pipe.output()
    assert Counter(output_id(m) for m in out) == Counter(ids), "the legacy ids were not published"

    for worker in range(WORKERS):  # both volumes lost
        store = tmp_path / f"{pipe.name}-store-{worker}"
        assert store.is_dir()
        subprocess.run(["rm", "-rf", str(store)], check=True)
    pipe.start_all()
    produce(pipe.bootstrap, pipe.input_topic, ((i, i, None) for i in ids))  # all repeated
    pipe.wait_settled(set(ids))
    time.sleep(2)
    assert Counter(output_id(m) for m in pipe.output()) == Counter(ids), "nothing published again"
    pipe.stop_all()
    assert "rebuild: ids this worker owns read from the other output partitions" in (
        pipe.log.read_text()
    )
    assert pipe.worker_log_problems() == []


def test_a_store_of_another_ownership_generation_is_refused_with_one_line(
    kafka: Any, tmp_path: Path
) -> None:
    """A store written by worker 0 of 2 opened by worker 0 of 3: exit 5, one ERROR line."""
    pipe = Pipeline(kafka, tmp_path, inputs=2)
    pipe.start(0)
    deadline = time.monotonic() + 60
    while "worker ready" not in pipe.log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    pipe.stop_all()
    cfg = replace(
        pipe.config(0, workers=3), store_path=tmp_path / f"{pipe.name}-store-0", metrics_port=0
    )
    log = tmp_path / "refused.log"
    proc = start_worker(cfg, log)
    assert proc.wait(timeout=60) == 5
    errors = [line for line in log.read_text().splitlines() if error_line(line)]
    assert len(errors) == 1 and "ownership generation workers=2" in errors[0], errors
    assert "Traceback" not in log.read_text()


def test_a_forwarder_killed_mid_transaction_holds_forwarded_records_until_replaced(
    kafka: Any, tmp_path: Path
) -> None:
    """The stall bound. read_committed stops at the oldest open transaction of any
    forwarder: worker 1 SIGKILLed with forwarded records in an open transaction holds
    back what worker 2 forwards to worker 0 afterwards, until worker 1's replacement
    calls init_transactions (or transaction.timeout.ms passes). The metric shows the
    stall while it lasts; the output is exact after it."""
    pipe = Pipeline(kafka, tmp_path, inputs=3, workers=3)
    ids = [f"stall-{i}" for i in range(600)]
    placement = pipe.placement(ids)
    to_zero = [i for i in ids if placement[i] == 0]
    first, later = to_zero[: len(to_zero) // 2], to_zero[len(to_zero) // 2 :]
    pipe.start(0)
    pipe.start(2)
    pipe.start(1, env={"DEDUP_TEST_FAULTS": "before-commit=1"})  # dies with its txn open
    produce(pipe.bootstrap, pipe.input_topic, ((i, i, 1) for i in first))
    assert pipe.procs[1].wait(timeout=120) == -signal.SIGKILL
    killed_at = time.monotonic()
    produce(pipe.bootstrap, pipe.input_topic, ((i, i, 2) for i in later))
    group = pipe.config(0).group
    deadline = time.monotonic() + 60
    while local_kafka.committed_offsets(pipe.bootstrap, group, pipe.input_topic, [2])[0] < len(
        later
    ):
        assert time.monotonic() < deadline, "worker 2 did not forward in time"
        time.sleep(0.2)
    time.sleep(max(0.0, 10 - (time.monotonic() - killed_at)))
    published = {output_id(m) for m in pipe.output()}
    assert not published & set(later), "held back behind worker 1's open transaction"
    stalled = pipe.metric(0, "dedup_forwarded_stalled_seconds")
    assert stalled >= 5, stalled
    restarted_at = time.monotonic()
    pipe.start(1)
    pipe.wait_settled(set(ids) & set(to_zero), timeout_s=120)
    released_after = time.monotonic() - restarted_at
    print(
        f"forwarded records held {restarted_at - killed_at:.1f} s behind the killed "
        f"forwarder's transaction (metric: {stalled:.1f} s); released {released_after:.1f} s "
        "after its replacement started"
    )
    time.sleep(2)
    out = pipe.output()
    assert Counter(output_id(m) for m in out) == Counter(to_zero)
    assert pipe.metric(0, "dedup_forwarded_stalled_seconds") == 0
    pipe.stop_all()


def test_forwarded_records_deleted_before_their_owner_read_them_stop_it_with_one_line(
    kafka: Any, tmp_path: Path
) -> None:
    """The internal topic may not lose a record: its owner finding its committed offset
    below the log start (records deleted unread) stops with exit 4 and one ERROR line,
    rather than skip them as auto.offset.reset would."""
    pipe = Pipeline(kafka, tmp_path, inputs=2)
    group = pipe.config(0).group
    committer = Consumer({"bootstrap.servers": pipe.bootstrap, "group.id": group})
    committer.commit(offsets=[TopicPartition(pipe.owned_topic, 0, 0)], asynchronous=False)
    committer.close()
    writer = Producer({"bootstrap.servers": pipe.bootstrap})
    for n in range(5):
        writer.produce(
            pipe.owned_topic,
            event(f"lost-{n}", n),
            partition=0,
            headers=forward_headers(None, f"lost-{n}".encode(), 1, n),
        )
    assert writer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": pipe.bootstrap})
    deleted = admin.delete_records([TopicPartition(pipe.owned_topic, 0, 3)], request_timeout=30)
    for future in deleted.values():
        assert future.result(60).low_watermark == 3
    proc = pipe.start(0)
    assert proc.wait(timeout=60) == 4
    errors = [line for line in pipe.log.read_text().splitlines() if error_line(line)]
    assert len(errors) == 1, errors
    assert "were deleted before it read them" in errors[0] and pipe.owned_topic in errors[0]
    assert "Traceback" not in pipe.log.read_text()


PRE_OWNERSHIP_COMMIT = "607fff9"  # the worker before issue 26: format-1 stores only


def pre_ownership_worker(tmp: Path) -> Path:
    """The worker's package as it was before ownership, from this repository's history
    (git archive): the pinned worker whose stores a pipeline switches from."""
    root = Path(__file__).resolve().parents[2]
    dest = tmp / "pre-ownership"
    dest.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", PRE_OWNERSHIP_COMMIT, "worker/dedup_worker"],
        capture_output=True,
        check=False,
    )
    assert archive.returncode == 0, (
        f"commit {PRE_OWNERSHIP_COMMIT} (the pinned pre-ownership worker) is not in this "
        f"clone's history: {archive.stderr.decode().strip()}"
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "worker"


def start_pre_ownership(
    pipe: Pipeline, code: Path, worker: int, log: Path
) -> subprocess.Popen[bytes]:
    cfg = replace(
        pipe.config(worker, owned_topic=None, workers=None),
        store_path=pipe.tmp / f"{pipe.name}-store-{worker}",
        metrics_port=0,
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dedup_worker.cli", *arguments(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=code,
            env={**os.environ, "PYTHONPATH": str(code)},
        )


def test_a_pipeline_of_pre_ownership_workers_switches_in_one_step(
    kafka: Any, tmp_path: Path
) -> None:
    """Stores made by the worker before ownership, whose producer did not key by id; every
    old worker stopped, then the new ones started with --ownership-switch: each adds the
    ids it owns from the other output partitions. Then every id of the window is repeated
    on another partition than before, with new ids round-robin: none is published again,
    each new id once on its owner's partition. The pre-ownership worker refuses a
    switched store (exit 5)."""
    code = pre_ownership_worker(tmp_path)
    pipe = Pipeline(kafka, tmp_path, inputs=2)
    old_log = tmp_path / "pre-ownership.log"
    before = [f"sw-{i}" for i in range(1000)]
    first = {i: n % 2 for n, i in enumerate(before)}  # not keyed by id: round-robin
    old = [start_pre_ownership(pipe, code, w, old_log) for w in range(WORKERS)]
    produce(pipe.bootstrap, pipe.input_topic, ((i, i, p) for i, p in first.items()))
    group = pipe.config(0).group
    deadline = time.monotonic() + 120
    while local_kafka.committed_offsets(pipe.bootstrap, group, pipe.input_topic, [0, 1]) != [
        500,
        500,
    ]:
        assert all(p.poll() is None for p in old), f"a pre-ownership worker died: {old_log}"
        assert time.monotonic() < deadline, "pre-ownership workers did not consume in time"
        time.sleep(0.5)
    for proc in old:  # every old worker stopped before any new one starts
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    published_before = pipe.output()
    assert Counter(output_id(m) for m in published_before) == Counter(before)
    ends = {p: max(m.offset() for m in published_before if m.partition() == p) for p in (0, 1)}

    for worker in range(WORKERS):
        pipe.start(worker, env={"DEDUP_OWNERSHIP_SWITCH": "true"})
    deadline = time.monotonic() + 120
    while pipe.log.read_text().count("store switched to ownership") < WORKERS:
        assert time.monotonic() < deadline, f"the stores were not switched; see {pipe.log}"
        time.sleep(0.5)
    after = [f"sw-new-{i}" for i in range(1000)]
    placement = pipe.placement(before + after)
    produce(
        pipe.bootstrap,
        pipe.input_topic,
        [(i, i, 1 - p) for i, p in first.items()] + [(i, i, n % 2) for n, i in enumerate(after)],
    )
    pipe.wait_settled(set(before + after))
    time.sleep(2)
    new = [m for m in pipe.output() if m.offset() > ends[m.partition()]]
    assert not {output_id(m) for m in new} & set(before), "an id of the window published again"
    assert Counter(output_id(m) for m in new) == Counter(after)
    assert all(placement[output_id(m)] == m.partition() for m in new)
    pipe.stop_all()
    assert pipe.worker_log_problems() == []

    refused = start_pre_ownership(pipe, code, 0, tmp_path / "refused.log")
    assert refused.wait(timeout=60) == 5, "the pre-ownership worker refuses a switched store"
    assert "format 2" in (tmp_path / "refused.log").read_text()
