"""Throughput of one exactly-once worker on the local broker, against its peers.

    python bench/worker_throughput.py [--records 500000[,2000000,...]] [--peers kstreams,quix]
                                      [--skip-peer] [--bootstrap HOST:PORT] [--no-warm-up]
    python bench/worker_throughput.py --partitions 1,2,4 [--records 2000000]

Workload: one partition, 300-byte JSON records keyed by message id, 2% duplicates.
Ours: `DedupWorker` (RocksDB window, one Kafka transaction per batch) in a process of its
own, which holds none of the bench's workload.
Before anything is timed, ours runs untimed over 500k records of their own to warm the
bench's broker (`warm_broker`; `--no-warm-up` skips it).
Peers, each as a child process on the same broker in the same invocation, on their own
copy of the same records:

* kstreams: a Kafka Streams application (`bench/peers/kstreams/`, Java, built by Maven
  into the cache by `bench/peers/kstreams_peer.py`): exactly_once_v2, a persistent RocksDB
  window store keyed by the message id, dead letters for records without an id.
* quix: a Quix Streams application doing keyed dedup with its RocksDB state and
  exactly-once processing, in its own virtual environment (Quix pins conflict with ours).

For each record count (`--records` takes a comma-separated list, so JVM warm-up shows
against the steady state) it prints records/s for each, p50/p99 batch commit latency for
ours, and the ratios. After each run an independent read_committed consumer counts the
output topic: every distinct id exactly once, and no dead letters (the workload has
none); anything else is an error and the bench exits non-zero.

`--partitions 1,2,4` instead measures how our cost grows with partitions: the first
`--records` count spread over N partitions by id (Kafka's partitioner), one worker
process per partition on this one machine, all started together: records/s over all of
them, CPU seconds per record (worker processes and the broker, from /proc), peak RSS.

Ownership (issue 26; WorkerConfig.owned_topic and .workers), each mode in its own
section below, combinable in one invocation (run in this order):

    python bench/worker_throughput.py --ownership-cost [--records 2000000,5000000] [--pairs 4]
    python bench/worker_throughput.py --round-robin [--records 2000000]
    python bench/worker_throughput.py --commit-p99 [--workers 4,16,64] [--records 1000000]

* `--ownership-cost`: one input keyed by id over 4 partitions, 4 worker processes, in
  alternating runs on the same broker: (a) without ownership (worker p reads input p),
  (b) under ownership (every record hashed, none forwarded), in the order a b, b a,
  a b, ... after `--warm-up-pairs` pairs not counted; before each run the earlier runs'
  deleted topics are gone from disk and dirty pages written back. records/s of each,
  (b)/(a) per pair and the median (target >= 0.97), and Kafka Streams (4 stream
  threads) once per count on the same input.
* `--round-robin`: record n on partition n % 4; ours: 4 workers under ownership (3/4 of
  the records forwarded); Kafka Streams re-keying by the id through a repartition topic
  (4 stream threads). First, untimed, ours runs over a round-robin input of its own until
  the broker's CPU per record stops falling, then Kafka Streams once (`warm_round_robin`);
  then `--round-robin-runs` runs of each, ours and the peer alternating (ours, peer,
  peer, ours, ...), and the medians are compared. Target >= 2x.
* `--commit-p99`: one worker process, worker 0 of W under ownership, on a 1-partition
  input, so (W-1)/W of its records go to up to W-1 internal partitions each batch:
  commit p50/p99 and records/s for each W.

Every output is checked over all its partitions: every distinct id exactly once, each on
its owner's partition.

What dedup costs over the cheapest exactly-once pass (issue 52):

    python bench/worker_throughput.py --bare-copy [--records 2000000,5000000] [--runs 4]

* `--bare-copy`: the real `dedup-worker` CLI as a process with the defaults users get
  (window 7d), against `bench/peers/bare_copy.py`, a process on the same confluent-kafka
  that copies every record exactly once (read_committed batches of 5,000, 20 ms linger,
  offsets in the transaction) and does nothing else, each batch waiting for its commit
  (as issue 52 defines it), and against the same copy `--pipelined` (a batch's commit
  overlaps the consuming of the next, as the worker's does: the stricter baseline); one
  input per count, each run its own output and group, in the order ours, bare, piped,
  piped, bare, ours, ...; each run timed from its process's start to its group's
  committed offset reaching the end (and steady: from its first commit). Medians,
  ours/bare and ours/pipelined (target >= 0.8), CPU per record of each process and of
  the broker, then one more run of ours under cProfile: the functions it spent most in.
  Outputs checked: ours every id once, the copies every record.

Targets on a 2-core machine: >= 100,000 records/s, >= 3x Quix Streams, >= 2x Kafka
Streams at 2M and 5M records, commit p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import results as bench_results
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from peers import kstreams_peer as kstreams

from dedup_contract import names
from dedup_contract.ownership import owner
from dedup_contract.window import WindowPolicy
from dedup_local.kafka import KafkaBroker, produce_all
from dedup_local.paths import cache_dir, versions
from dedup_worker.config import WorkerConfig
from dedup_worker.fencing import FencingToken
from dedup_worker.loop import DedupWorker, PublisherFactory
from dedup_worker.metrics import WorkerMetrics
from dedup_worker.transaction import BatchResult, Publisher

HERE = Path(__file__).resolve().parent
DUPLICATE_SHARE = 0.02
WINDOW_MS = 7 * 24 * 3600 * 1000
PEERS = ("kstreams", "quix")
TARGET_RECORDS_PER_S = 100_000
TARGET_QUIX_RATIO = 3.0
TARGET_KSTREAMS_RATIO = 2.0  # at the counts below, and through a repartition topic
KSTREAMS_TARGET_COUNTS = (2_000_000, 5_000_000)
TARGET_COMMIT_P99_MS = 100.0
TARGET_OWNERSHIP_COST = 0.97  # median (b)/(a): under ownership / without
TARGET_BARE_COPY_RATIO = 0.8  # median ours / median bare exactly-once copy
BARE_COPY = HERE / "peers" / "bare_copy.py"


def timed_publisher(latencies: list[float]) -> PublisherFactory:
    """The worker's own Publisher, telling `latencies` each commit's time (seconds)."""

    def make(
        config: WorkerConfig,
        fencing: FencingToken,
        metrics: WorkerMetrics,
        group_metadata: Callable[[], object],
    ) -> Publisher:
        return Publisher(config, fencing, metrics, group_metadata, observe_commit=latencies.append)

    return make


def add_completed(counts: dict[str, int], done: BatchResult) -> None:
    """Count a completed batch's records into `counts`: read from the input, received
    from the internal topic, forwarded to it (from the batch's result: the worker's
    metrics registry, scanned whole at each read, cost the bench about 8% of round-robin's
    records/s when read at every batch)."""
    counts["input"] += done.consumed - done.received
    counts["received"] += done.received
    counts["forwarded"] += done.forwarded


def counts_text(counts: Sequence[int]) -> str:
    """[500000, 2000000, 5000000] -> "500k, 2M and 5M"."""
    labels = [bench_results.count_label(n) for n in counts]
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"


def load_range(loads: Sequence[float]) -> str:
    """The 1-minute load averages seen during a run, as the results table shows them."""
    return f"(load {min(loads):.1f}-{max(loads):.1f})"


def workload(records: int, seed: int = 7) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    out: list[tuple[bytes, bytes]] = []
    uniques = 0
    for n in range(records):
        if out and rng.random() < DUPLICATE_SHARE:
            key = out[rng.randrange(len(out))][0]
        else:
            key = f"evt-{uniques:012d}".encode()
            uniques += 1
        body = {
            "messageId": key.decode(),
            "user": rng.randrange(10**6),
            "seq": n,
            "pad": "",
        }
        raw = json.dumps(body)
        body["pad"] = "x" * max(0, 300 - len(raw))
        out.append((key, json.dumps(body).encode()))
    return out


def fill(
    bootstrap: str,
    topic: str,
    data: Sequence[tuple[bytes, bytes]],
    partitions: int = 1,
    round_robin: bool = False,
) -> None:
    """Produce ``data`` into ``topic``: all into partition 0, or over ``partitions`` by id
    as Kafka's default partitioner places a record keyed by it, or (``round_robin``)
    record n into partition n % ``partitions`` (still keyed by the id)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
        }
    )
    records = (
        {
            "key": key,
            "value": value,
            "partition": (
                0 if partitions == 1 else n % partitions if round_robin else owner(key, partitions)
            ),
        }
        for n, (key, value) in enumerate(data)
    )
    produce_all(producer, topic, records, timeout_s=120)


def create_topics(broker: KafkaBroker, name: str, partitions: int = 1) -> None:
    """A run's topics: ``name``-in, -out and -dlq."""
    for suffix in ("in", "out", "dlq"):
        broker.create_topic(f"{name}-{suffix}", partitions)


def warm_group_coordinator(bootstrap: str) -> None:
    """Have the broker create its offsets topic before anything is timed, so neither run
    pays that one-time broker start-up cost (the first group lookup waits for it)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-warm-up"})
    try:
        consumer.committed([TopicPartition("bench-warm-up", 0)], timeout=60)
    except KafkaException:
        pass  # the topic does not exist; the coordinator lookup has happened all the same
    finally:
        consumer.close()


WARM_UP_RECORDS = 500_000


def warm_broker(broker: KafkaBroker, store: Path, batch_size: int) -> None:
    """Run ours, untimed, over WARM_UP_RECORDS records of their own before anything is
    timed, so the broker's JIT compiles its transactional produce, fetch and commit paths
    there and not in the first timed run (which is always ours at the first count). On a
    fresh broker ours at 2M did 73k records/s with commit p99 69 ms, and right after, on
    the same broker, 101k/s and 42 ms (scratch harness, 2026-11-25). Every timed run, ours
    and each peer's, then meets a warm broker."""
    name = "warm-up"
    create_topics(broker, name)
    fill(broker.bootstrap, f"{name}-in", workload(WARM_UP_RECORDS, seed=11))
    run_ours_in_child(broker.bootstrap, name, 0, WARM_UP_RECORDS, store, batch_size)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_ours(
    bootstrap: str,
    name: str,
    records: int,
    store_dir: Path,
    batch_size: int,
    partition: int = 0,
) -> dict[str, float]:
    cfg = WorkerConfig(
        bootstrap_servers=bootstrap,
        input_topic=f"{name}-in",
        output_topic=f"{name}-out",
        dead_letter_topic=f"{name}-dlq",
        partition=partition,
        pipeline=name,
        store_path=store_dir,
        window=WindowPolicy(duration_ms=WINDOW_MS, max_keys=None),
        batch_size=batch_size,
        linger_ms=20,
    )
    latencies: list[float] = []
    worker = DedupWorker(cfg, publisher=timed_publisher(latencies))
    started = time.perf_counter()
    worker.start()
    ready = time.perf_counter()
    consumed = 0
    while consumed < records:
        consumed += worker.process_batch().consumed
    done = time.perf_counter()
    worker.close()
    return {
        "records_per_s": records / (done - started),
        "steady_records_per_s": records / (done - ready),
        "startup_s": ready - started,
        "p50_commit_ms": percentile(latencies, 0.50) * 1000,
        "p99_commit_ms": percentile(latencies, 0.99) * 1000,
    }


def quix_python() -> Path:
    """A cached virtual environment with the pinned Quix Streams."""
    version = versions()["QUIXSTREAMS_VERSION"]
    venv = cache_dir() / f"venv-quixstreams-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"[bench] installing quixstreams=={version} into {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"quixstreams=={version}"],
            check=True,
        )
    return python


def run_quix(
    bootstrap: str, name: str, records: int, outputs: int, state_dir: Path
) -> dict[str, float]:
    proc = subprocess.run(
        [
            str(quix_python()),
            str(HERE / "peers" / "quix_dedup.py"),
            bootstrap,
            f"{name}-in",
            f"{name}-out",
            str(records),
            str(outputs),
            str(state_dir),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"records_per_s": records / result["seconds"]}


# --- output check -----------------------------------------------------------------------


@dataclass(frozen=True)
class Committed:
    records: int
    distinct_keys: int
    misplaced: int = 0  # records not on partition owner(key, workers), when asked


def count_committed(
    bootstrap: str, topic: str, timeout_s: float = 300.0, workers: int | None = None
) -> Committed:
    """Records and distinct keys (the workload's keys are the ids) committed in ``topic``,
    over all its partitions, read by an independent read_committed consumer from the
    beginning to the high watermark as it stands now (the run is over: every transaction
    is complete or will have its marker written shortly, and the reader's position passes
    the markers). With ``workers``, also how many records are not on their owner's
    partition (ownership publishes each id to partition owner(id, workers))."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-check-{topic}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise RuntimeError(f"topic {topic}: {metadata.error if metadata else 'not found'}")
        ends: dict[int, int] = {}
        for partition in metadata.partitions:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=30, cached=False
            )
            if high > 0:
                ends[partition] = high
        if not ends:
            return Committed(0, 0)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        keys: set[bytes | None] = set()
        records = misplaced = 0
        pending = set(ends)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic}: partitions {sorted(pending)} not read")
            for msg in consumer.consume(10_000, 0.5):
                err = msg.error()
                if err is None:
                    records += 1
                    key = msg.key()
                    keys.add(key)
                    if workers is not None and owner(key or b"", workers) != msg.partition():
                        misplaced += 1
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"reading {topic}: {err}")
            for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        return Committed(records, len(keys), misplaced)
    finally:
        consumer.close()


def check_output(
    bootstrap: str, label: str, name: str, uniques: int, dead_letter_topic: bool
) -> str | None:
    """Print what ``name``'s committed output holds; the error if it is not every id once."""
    out = count_committed(bootstrap, f"{name}-out")
    dead = count_committed(bootstrap, f"{name}-dlq").records if dead_letter_topic else 0
    ok = out.records == uniques and out.distinct_keys == uniques and dead == 0
    print(
        f"check: {label}: {out.records:,} records, {out.distinct_keys:,} distinct ids committed "
        f"(expected {uniques:,} each), {dead} dead letters: {'ok' if ok else 'WRONG'}",
        flush=True,
    )
    if ok:
        return None
    return (
        f"{label}'s committed output is wrong: {out.records:,} records and "
        f"{out.distinct_keys:,} distinct ids where {uniques:,} of each were expected, "
        f"{dead} dead letters where none were expected"
    )


# --- partitions mode ----------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_cpu_seconds(stat: str) -> float:
    """User + system CPU seconds of a /proc stat line (a process's or a thread's)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds of a process so far, from /proc/PID/stat."""
    return _stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())


def broker_cpu_seconds(broker: KafkaBroker | None) -> float | None:
    """`cpu_seconds` of the broker the bench started (None: not started by the bench)."""
    return cpu_seconds(broker.pid) if broker is not None and broker.pid else None


def broker_cpu_since(broker: KafkaBroker | None, before: float | None) -> float | None:
    """The broker's CPU seconds since `broker_cpu_seconds` gave `before` (None: unknown)."""
    after = broker_cpu_seconds(broker)
    return None if before is None or after is None else after - before


def cpu_seconds_by_thread(pid: int | str = "self") -> dict[str, float]:
    """User + system CPU seconds of a process's live threads so far, summed by thread
    name (Python's threads are all "python"; librdkafka names its own "rdk:...")."""
    by_name: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            stat = (task / "stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")].rstrip("0123456789")
            by_name[name] = by_name.get(name, 0.0) + _stat_cpu_seconds(stat)
    return by_name


def peak_rss_mib(pid: int | str = "self") -> float:
    """Peak resident set size (VmHWM) of a process, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def partition_child(spec: str) -> int:
    """(Child process of --partitions.) One worker on one partition; prints JSON."""
    bootstrap, name, partition, records, store, batch_size = spec.split("|")
    cpu_before = cpu_seconds()
    started = time.time()
    result = run_ours(
        bootstrap,
        name,
        int(records),
        Path(store),
        int(batch_size),
        partition=int(partition),
    )
    done = time.time()
    print(
        json.dumps(
            {
                **result,
                "started": started,
                "done": done,
                "cpu_s": cpu_seconds() - cpu_before,
                "peak_rss_mib": peak_rss_mib(),
            }
        ),
        flush=True,
    )
    return 0


def start_child(
    bootstrap: str,
    name: str,
    partition: int,
    records: int,
    store: Path,
    batch_size: int,
) -> subprocess.Popen[str]:
    """A worker process of its own (`partition_child`) on `partition` of `name`'s topics:
    it holds none of the bench's workload (a worker in a pod holds only its own state;
    the bench's records in the same process cost ours ~13% at 2M, bench/HISTORY.md,
    "Ours in a process of its own"), as
    each peer runs in a process of its own too."""
    spec = "|".join([bootstrap, name, str(partition), str(records), str(store), str(batch_size)])
    return subprocess.Popen(
        [sys.executable, __file__, "--partition-child", spec],
        stdout=subprocess.PIPE,
        text=True,
    )


def child_result(child: subprocess.Popen[str]) -> dict[str, Any]:
    """The JSON line `partition_child` printed last; RuntimeError if it failed."""
    out, _ = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"our worker process exited with {child.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def run_ours_in_child(
    bootstrap: str,
    name: str,
    partition: int,
    records: int,
    store: Path,
    batch_size: int,
) -> dict[str, float]:
    """`run_ours` in a worker process of its own (`start_child`)."""
    return child_result(start_child(bootstrap, name, partition, records, store, batch_size))


def run_partitions(
    bootstrap: str,
    broker: KafkaBroker | None,
    data: list[tuple[bytes, bytes]],
    counts: list[int],
    tmp: Path,
    batch_size: int,
    figures: list[bench_results.Figure],
) -> int:
    records = len(data)
    loads = [os.getloadavg()[0]]
    print(
        f"[bench] {records} records of ~300 B, {DUPLICATE_SHARE:.0%} duplicates, exactly-once, "
        f"over 1 to {max(counts)} partitions, one worker process per partition, {os.cpu_count()} CPUs"
    )
    rows = []
    for n in counts:
        name = f"part{n}"
        if broker is not None:
            create_topics(broker, name, n)
        fill(bootstrap, f"{name}-in", data, partitions=n)
        per_partition = [0] * n
        for key, _ in data:
            per_partition[owner(key, n)] += 1
        broker_before = broker_cpu_seconds(broker)
        children = [
            start_child(
                bootstrap,
                name,
                p,
                per_partition[p],
                tmp / f"{name}-store-{p}",
                batch_size,
            )
            for p in range(n)
        ]
        results = []
        for child in children:
            try:
                results.append(child_result(child))
            except RuntimeError as exc:
                print(f"ERROR: {exc}")
                return 1
        broker_cpu = broker_cpu_since(broker, broker_before)
        wall = max(r["done"] for r in results) - min(r["started"] for r in results)
        worker_cpu = sum(r["cpu_s"] for r in results)
        row = {
            "partitions": n,
            "records_per_s": records / wall,
            "worker_cpu_us": worker_cpu / records * 1e6,
            "broker_cpu_us": None if broker_cpu is None else broker_cpu / records * 1e6,
            "rss_mib": [r["peak_rss_mib"] for r in results],
            "p99_ms": max(r["p99_commit_ms"] for r in results),
        }
        rows.append(row)
        broker_text = (
            "" if row["broker_cpu_us"] is None else f", broker {row['broker_cpu_us']:.1f} us"
        )
        print(
            f"ours : {n} partition(s): {row['records_per_s']:>10,.0f} records/s  "
            f"CPU/record: workers {row['worker_cpu_us']:.1f} us{broker_text}  "
            f"peak RSS per worker {', '.join(f'{m:.0f}' for m in row['rss_mib'])} MiB  "
            f"commit p99 (worst worker) {row['p99_ms']:.1f} ms",
            flush=True,
        )
        uniques = len({key for key, _ in data})
        error = check_output(bootstrap, f"ours at {n} partition(s)", name, uniques, True)
        if error:
            print(f"ERROR: {error}", file=sys.stderr)
            return 1
    loads.append(os.getloadavg()[0])
    figures.append(
        bench_results.Figure(
            "worker_throughput.partitions",
            f"worker on {', '.join(map(str, counts))} partitions, {bench_results.count_label(records)}",
            " / ".join(f"{row['records_per_s']:,.0f}" for row in rows)
            + " records/s; worker CPU "
            + " / ".join(f"{row['worker_cpu_us']:.1f}" for row in rows)
            + f" us per record {load_range(loads)}",
            "none",
        )
    )
    return 0


# --- ownership modes ------------------------------------------------------------------------
#
# Workers under ownership (WorkerConfig.owned_topic and .workers) read several sources and
# forward what they do not own, so no single worker knows when the run is over. Each runs
# in a process of its own (`owner_child`) and prints, after every completed batch, what
# its committed batches did so far: input records read, records received from the internal
# topic, records forwarded to it. The run is over when every worker has read its input
# and every forwarded record has been received (nothing is forwarded twice: the internal
# topic's partition is its owner's); the bench then tells the workers to stop.
#
# The workers start (Store, transactions, catch-up, assignment) and then wait until every
# one has: under ownership a fresh store's full rebuild reads every output partition to
# its end, and a worker that started late would otherwise read what the others published
# meanwhile (seen: 10-20 s start-ups). Steady: from that go to the last batch completed;
# records/s: from the first worker's start (start-ups included, as the other modes).


@dataclass(frozen=True)
class OwnerSpec:
    """One worker process of an ownership run (JSON on the command line)."""

    bootstrap: str
    pipeline: str
    input_topic: str
    output_topic: str
    partition: int
    input_records: int  # input records this worker reads
    store: str
    batch_size: int
    owned_topic: str | None = None
    workers: int | None = None
    coordinated: bool = True  # stop when told on stdin; else once the input is read


def owner_child(text: str) -> int:
    """(Child process of the ownership modes.) One worker; progress lines, then a result."""
    spec = OwnerSpec(**json.loads(text))
    cfg = WorkerConfig(
        bootstrap_servers=spec.bootstrap,
        input_topic=spec.input_topic,
        output_topic=spec.output_topic,
        dead_letter_topic=f"{spec.pipeline}-dlq",
        partition=spec.partition,
        pipeline=spec.pipeline,
        store_path=Path(spec.store),
        window=WindowPolicy(duration_ms=WINDOW_MS, max_keys=None),
        batch_size=spec.batch_size,
        linger_ms=20,
        owned_topic=spec.owned_topic,
        workers=spec.workers,
    )
    latencies: list[float] = []
    worker = DedupWorker(cfg, publisher=timed_publisher(latencies))
    counts = {"input": 0, "received": 0, "forwarded": 0}

    stop = threading.Event()
    go = threading.Event()
    if spec.coordinated:

        def listen() -> None:
            for line in sys.stdin:
                if line.strip() == "go":
                    go.set()
                if line.strip() == "stop":
                    break
            go.set()
            stop.set()  # told, or the bench is gone

        threading.Thread(target=listen, daemon=True).start()
    else:
        go.set()

    cpu_before = cpu_seconds()
    threads_before = cpu_seconds_by_thread()
    started = time.time()
    worker.start()
    ready = time.time()
    if spec.coordinated:
        print(json.dumps({**counts, "ready": ready}), flush=True)
    go.wait()
    went = time.time()
    last = went
    while not stop.is_set():
        done = worker.process_batch()
        if done.consumed:
            last = time.time()
            add_completed(counts, done)
            print(json.dumps(counts), flush=True)
            if not spec.coordinated and counts["input"] >= spec.input_records:
                break
    threads_cpu_s = {  # before close ends librdkafka's threads
        name: seconds - threads_before.get(name, 0.0)
        for name, seconds in cpu_seconds_by_thread().items()
    }
    worker.close()
    print(
        json.dumps(
            {
                **counts,
                "final": True,
                "threads_cpu_s": threads_cpu_s,
                "started": started,
                "ready": ready,
                "went": went,
                "done": last,
                "commits": len(latencies),
                "p50_commit_ms": percentile(latencies, 0.50) * 1000 if latencies else 0.0,
                "p99_commit_ms": percentile(latencies, 0.99) * 1000 if latencies else 0.0,
                "cpu_s": cpu_seconds() - cpu_before,
                "peak_rss_mib": peak_rss_mib(),
            }
        ),
        flush=True,
    )
    return 0


def tell(children: list[subprocess.Popen[str]], word: str) -> None:
    """Write ``word`` to the stdin of each running worker process."""
    for child in children:
        if child.poll() is None and child.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                child.stdin.write(word + "\n")
                child.stdin.flush()


def run_owners(specs: list[OwnerSpec], timeout_s: float = 1800.0) -> list[dict[str, Any]]:
    """Run one worker process per spec, all started together, until every input record
    is read and every forwarded record received; each worker's final result."""
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--owner-child", json.dumps(asdict(spec))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for spec in specs
    ]
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()

    def read(i: int, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put((i, line))
        lines.put((i, None))

    for i, child in enumerate(children):
        threading.Thread(target=read, args=(i, child), daemon=True).start()
    progress: list[dict[str, int]] = [{"input": 0, "received": 0, "forwarded": 0} for _ in specs]
    finals: dict[int, dict[str, Any]] = {}
    ready: set[int] = set()
    told = finished = False
    deadline = time.monotonic() + timeout_s
    try:
        while len(finals) < len(children):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the workers did not finish within {timeout_s:.0f} s: {progress}"
                )
            try:
                i, line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                if i not in finals:
                    code = children[i].wait()
                    raise RuntimeError(f"worker {specs[i].partition} exited with {code}")
                continue
            state = json.loads(line)
            progress[i] = state
            if state.get("final"):
                finals[i] = state
            elif "ready" in state:
                ready.add(i)
                if len(ready) == len(children):
                    tell(children, "go")
                continue
            done = all(p["input"] >= s.input_records for p, s in zip(progress, specs, strict=True))
            if (
                not told
                and done
                and sum(p["received"] for p in progress) >= sum(p["forwarded"] for p in progress)
            ):
                told = True
                tell(children, "stop")
        finished = True
    finally:
        for child in children:
            if child.poll() is None and not finished:
                child.kill()
            child.wait()
    return [finals[i] for i in range(len(children))]


@dataclass(frozen=True)
class OwnersRun:
    records_per_s: float  # from the first worker's start (start-ups included)
    steady_records_per_s: float  # from the go after every worker's start-up
    startup_s: float
    p50_ms: float
    p99_ms: float
    forwarded: int
    worker_cpu_us: float
    python_cpu_us: float  # of worker_cpu_us: Python's threads (librdkafka's, RocksDB's: the rest)
    broker_cpu_us: float | None  # None: the bench did not start the broker
    results: list[dict[str, Any]]

    @property
    def commit_interval_ms(self) -> float:
        """How often a worker committed, from the go to its last batch (median worker)."""
        return float(
            statistics.median(
                (r["done"] - r["went"]) / r["commits"] * 1000 for r in self.results if r["commits"]
            )
        )


def owners_run(
    bootstrap: str,
    broker: KafkaBroker | None,
    name: str,
    input_topic: str,
    per_partition: list[int],
    tmp: Path,
    batch_size: int,
    *,
    ownership: bool,
    output_partitions: int | None = None,
) -> OwnersRun:
    """One timed run: a worker per input partition (without ownership: worker p reads
    input p; under ownership: worker w of len(per_partition)), on ``name``'s own output,
    dead-letter and (under ownership) internal topics and consumer group."""
    workers = len(per_partition)
    if broker is not None:
        broker.create_topic(f"{name}-out", output_partitions or workers)
        broker.create_topic(f"{name}-dlq", 1)
        if ownership:
            broker.create_topic(f"{name}-owned", workers)
    specs = [
        OwnerSpec(
            bootstrap=bootstrap,
            pipeline=name,
            input_topic=input_topic,
            output_topic=f"{name}-out",
            partition=w,
            input_records=per_partition[w],
            store=str(tmp / f"{name}-store-{w}"),
            batch_size=batch_size,
            owned_topic=f"{name}-owned" if ownership else None,
            workers=workers if ownership else None,
        )
        for w in range(workers)
    ]
    settle(broker)
    broker_before = broker_cpu_seconds(broker)
    results = run_owners(specs)
    broker_cpu = broker_cpu_since(broker, broker_before)
    for w in range(workers):
        shutil.rmtree(tmp / f"{name}-store-{w}", ignore_errors=True)
    wall = max(r["done"] for r in results) - min(r["started"] for r in results)
    records = sum(per_partition)
    steady = max(r["done"] for r in results) - min(r["went"] for r in results)
    return OwnersRun(
        records_per_s=records / wall,
        steady_records_per_s=records / steady,
        startup_s=max(r["ready"] - r["started"] for r in results),
        p50_ms=max(r["p50_commit_ms"] for r in results),
        p99_ms=max(r["p99_commit_ms"] for r in results),
        forwarded=sum(r["forwarded"] for r in results),
        worker_cpu_us=sum(r["cpu_s"] for r in results) / records * 1e6,
        python_cpu_us=sum(r["threads_cpu_s"].get("python", 0.0) for r in results) / records * 1e6,
        broker_cpu_us=None if broker_cpu is None else broker_cpu / records * 1e6,
        results=results,
    )


def run_kstreams_on(
    broker: KafkaBroker | None,
    bootstrap: str,
    input_topic: str,
    name: str,
    records: int,
    uniques: int,
    tmp: Path,
    partitions: int,
    topology: str = "plain",
    application_id: str | None = None,
) -> kstreams.PeerResult:
    """(Ownership modes.) Kafka Streams with one stream thread per input partition on
    `input_topic`, into `<name>-out` (`partitions` partitions) and `<name>-dlq`."""
    if broker is not None:
        broker.create_topic(f"{name}-out", partitions)
        broker.create_topic(f"{name}-dlq", 1)
    settle(broker)  # as before each of ours: the runs before it leave nothing to delete
    return kstreams.run(
        bootstrap,
        input_topic,
        f"{name}-out",
        f"{name}-dlq",
        records,
        uniques,
        tmp / f"{name}-state",
        window_ms=WINDOW_MS,
        threads=partitions,
        topology=topology,
        application_id=application_id,
    )


def drop_topics(broker: KafkaBroker | None, *topics: str) -> None:
    """Delete a finished run's topics (the bench's disk; `settle` waits for it)."""
    if broker is not None:
        broker.admin().delete_topics(list(topics), operation_timeout=30)


BENCH_BROKER_CONFIG: Final = {
    # A deleted topic's files go at once (the broker's default for the topic-level
    # file.delete.delay.ms waits 60 s), and `settle` waits for them before the next
    # timed run instead of letting them go during it.
    "log.segment.delete.delay.ms": 0,
}


def drop_run_topics(broker: KafkaBroker | None, name: str) -> None:
    """Delete a finished run of ours' topics: its output, dead letters and internal topic."""
    drop_topics(broker, f"{name}-out", f"{name}-dlq", f"{name}-owned")


def drop_kstreams_run(broker: KafkaBroker | None, tmp: Path, name: str) -> None:
    """Delete what a finished Kafka Streams run named `name`, with `name` as its
    application id, leaves: its topics (output, dead letters, and its internal repartition
    and changelog topics, all named `<name>-...`) and its state directory."""
    if broker is not None:
        topics = broker.admin().list_topics(timeout=30).topics
        drop_topics(broker, *[t for t in topics if t.startswith(f"{name}-")])
    shutil.rmtree(tmp / f"{name}-state", ignore_errors=True)


def settle(broker: KafkaBroker | None, timeout_s: float = 120.0) -> None:
    """Before a timed run of the ownership modes (ours and the peer's): the earlier runs'
    deleted topics gone from the broker's disk and every dirty page written back
    (os.sync), so that a run does not pay for the run before it. Without this, a run's
    1.5 GB of output (5M records) was deleted and written back while a later run was
    timed, whichever mode that was."""
    if broker is not None:
        deadline = time.monotonic() + timeout_s
        while any(p.name.endswith("-delete") for p in broker.log_dir.iterdir()):
            if time.monotonic() > deadline:
                print(f"[bench] deleted topics still on disk after {timeout_s:.0f} s", flush=True)
                break
            time.sleep(0.2)
    os.sync()


def check_owned_output(
    bootstrap: str, label: str, topic: str, uniques: int, workers: int
) -> str | None:
    """Every id once across all of ``topic``'s partitions, each on its owner's."""
    out = count_committed(bootstrap, topic, workers=workers)
    ok = out.records == uniques and out.distinct_keys == uniques and out.misplaced == 0
    print(
        f"check: {label}: {out.records:,} records, {out.distinct_keys:,} distinct ids committed "
        f"over all partitions (expected {uniques:,} each), {out.misplaced} not on their "
        f"owner's partition: {'ok' if ok else 'WRONG'}",
        flush=True,
    )
    if ok:
        return None
    return (
        f"{label}'s committed output is wrong: {out.records:,} records, "
        f"{out.distinct_keys:,} distinct ids (expected {uniques:,}), {out.misplaced} misplaced"
    )


def run_ownership_cost(
    bootstrap: str,
    broker: KafkaBroker | None,
    counts: list[int],
    pairs: int,
    tmp: Path,
    batch_size: int,
    peer: bool,
    figures: list[bench_results.Figure],
    warm_up_pairs: int = 1,
) -> int:
    """(a) 4 workers without ownership against (b) 4 under ownership, alternating, on one
    input keyed by id over 4 partitions (every record hashed, none forwarded), after
    `warm_up_pairs` pairs not counted."""
    partitions = 4
    print(
        f"[bench] ownership cost: keyed by id over {partitions} partitions, {partitions} worker "
        f"processes; (a) without ownership, (b) under ownership (every record hashed, none "
        f"forwarded), alternating, {pairs} pair(s) per count; {os.cpu_count()} CPUs",
        flush=True,
    )
    summary: list[tuple[int, list[OwnersRun], list[OwnersRun], tuple[float, float] | None]] = []
    for records in counts:
        data = workload(records)
        uniques = len({key for key, _ in data})
        per_partition = [0] * partitions
        for key, _ in data:
            per_partition[owner(key, partitions)] += 1
        input_topic = f"oc-{records}-in"
        if broker is not None:
            broker.create_topic(input_topic, partitions)
        fill(bootstrap, input_topic, data, partitions=partitions)
        del data
        plain: list[OwnersRun] = []
        owned: list[OwnersRun] = []
        # The warm-up pairs (at the first count) are run and checked like the others,
        # and not counted: the broker's CPU per record kept falling over the first
        # 16M records after the untimed warm-up (3.6 -> 1.8 us), each run faster than
        # the one before, whichever mode.
        first_pair = 1 - warm_up_pairs if records == counts[0] else 1
        for pair in range(first_pair, pairs + 1):
            warming = pair < 1
            # a b, b a, a b, ...: a drift of the machine over the invocation (the
            # broker's disk, its JIT, the page cache) favours neither mode
            for mode in ("a", "b") if pair % 2 else ("b", "a"):
                name = f"oc-{records}-{mode}{pair if not warming else f'w{-pair}'}"
                run = owners_run(
                    bootstrap,
                    broker,
                    name,
                    input_topic,
                    per_partition,
                    tmp,
                    batch_size,
                    ownership=mode == "b",
                )
                if not warming:
                    (plain if mode == "a" else owned).append(run)
                label = "(a) without ownership" if mode == "a" else "(b) under ownership  "
                print(
                    f"ours : {records:,} {'warm-up, not counted' if warming else f'pair {pair}'} "
                    f"{label}: {run.records_per_s:>9,.0f} records/s "
                    f"(steady {run.steady_records_per_s:,.0f}/s, startup {run.startup_s:.2f}s)  "
                    f"CPU/record: workers {run.worker_cpu_us:.1f} us (Python's threads "
                    f"{run.python_cpu_us:.2f})"
                    f"{'' if run.broker_cpu_us is None else f', broker {run.broker_cpu_us:.1f} us'}  "
                    f"commit p50 {run.p50_ms:.1f} ms p99 {run.p99_ms:.1f} ms (worst worker)  "
                    f"forwarded {run.forwarded}",
                    flush=True,
                )
                error = check_owned_output(bootstrap, name, f"{name}-out", uniques, partitions)
                if error is None and mode == "b" and run.forwarded:
                    error = f"{name}: {run.forwarded} records forwarded where none should be"
                if error:
                    print(f"ERROR: {error}", file=sys.stderr)
                    return 1
                drop_run_topics(broker, name)
            if not warming:
                print(
                    f"ratio: {records:,} pair {pair}: (b)/(a) = "
                    f"{owned[-1].records_per_s / plain[-1].records_per_s:.3f}, steady "
                    f"{owned[-1].steady_records_per_s / plain[-1].steady_records_per_s:.3f}",
                    flush=True,
                )
        ks_rate = None
        if peer:
            name = f"oc-{records}-kstreams"
            result = run_kstreams_on(
                broker, bootstrap, input_topic, name, records, uniques, tmp, partitions
            )
            ks_rate = (result.records_per_s, result.steady_records_per_s)
            print(
                f"peer : {records:,}: {ks_rate[0]:>9,.0f} records/s (Kafka Streams "
                f"{kstreams.kafka_version()}, exactly_once_v2, {partitions} stream threads, "
                f"{result.store} store; steady {result.steady_records_per_s:,.0f}/s)",
                flush=True,
            )
            error = check_owned_output(
                bootstrap, "Kafka Streams", f"{name}-out", uniques, partitions
            )
            if error:
                print(f"ERROR: {error}", file=sys.stderr)
                return 1
            drop_topics(broker, f"{name}-out", f"{name}-dlq")
            shutil.rmtree(tmp / f"{name}-state", ignore_errors=True)
        drop_topics(broker, input_topic)
        summary.append((records, plain, owned, ks_rate))
    print(
        f"{'records':>10} {'rate':>6} {'(a) median/s':>13} {'(b) median/s':>13} "
        f"{'b/a per pair':>24} {'median b/a':>10} {'Kafka Streams/s':>16} {'(b)/KS':>7}"
    )
    worst = {"wall": float("inf"), "steady": float("inf")}
    medians: dict[tuple[int, str], float] = {}  # (records, rate) -> median (b)/(a)
    for records, plain, owned, ks_rate in summary:
        for rate in ("wall", "steady"):
            a = [r.records_per_s if rate == "wall" else r.steady_records_per_s for r in plain]
            b = [r.records_per_s if rate == "wall" else r.steady_records_per_s for r in owned]
            ratios = [y / x for x, y in zip(a, b, strict=True)]
            medians[records, rate] = statistics.median(ratios)
            worst[rate] = min(worst[rate], statistics.median(ratios))
            ks = ""
            if ks_rate:  # (wall, steady) of Kafka Streams: from its start, its first record
                peer_rate = ks_rate[0] if rate == "wall" else ks_rate[1]
                ks = f"{peer_rate:>16,.0f} {statistics.median(b) / peer_rate:>6.2f}x"
            print(
                f"{records:>10,} {rate:>6} {statistics.median(a):>13,.0f} "
                f"{statistics.median(b):>13,.0f} {', '.join(f'{r:.3f}' for r in ratios):>24} "
                f"{statistics.median(ratios):>10.3f} {ks}"
            )
    for rate, ratio in worst.items():
        print(
            f"target ({rate}): median (b)/(a) >= {TARGET_OWNERSHIP_COST} at every count: "
            f"{'met' if ratio >= TARGET_OWNERSHIP_COST else 'MISSED'} (lowest median {ratio:.3f})"
        )
    figures.append(
        bench_results.Figure(
            "worker_throughput.ownership_cost",
            "ownership cost, keyed by id",
            "(b)/(a) median "
            + "; ".join(
                f"{medians[n, 'wall']:.3f} at {bench_results.count_label(n)} "
                f"(steady {medians[n, 'steady']:.3f})"
                for n in counts
            ),
            f">= {TARGET_OWNERSHIP_COST}: "
            + "; ".join(
                f"{bench_results.verdict(medians[n, 'wall'] >= TARGET_OWNERSHIP_COST)} at "
                f"{bench_results.count_label(n)} (steady: "
                f"{bench_results.verdict(medians[n, 'steady'] >= TARGET_OWNERSHIP_COST)})"
                for n in counts
            ),
        )
    )
    return 0


RR_WARM_UP_RECORDS: Final = 1_000_000
RR_WARM_UP_MAX_RUNS: Final = 8
RR_WARM_GAIN: Final = 0.10


def broker_is_warm(broker_us: Sequence[float], gain: float = RR_WARM_GAIN) -> bool:
    """Whether the round-robin warm-up may stop, from the broker's CPU per record in each
    warm-up run so far: the last two runs each failed to beat the lowest before them by
    `gain`. (One run that does not improve is noise as often as a plateau: the broker
    went 11.8, 9.0, 9.1 us and then 5.7 in one invocation.)"""
    if len(broker_us) < 3:
        return False
    return all(
        broker_us[i] > (1 - gain) * min(broker_us[:i])
        for i in (len(broker_us) - 2, len(broker_us) - 1)
    )


def warm_round_robin(
    bootstrap: str,
    broker: KafkaBroker,
    tmp: Path,
    batch_size: int,
    peer: bool,
) -> None:
    """Untimed: ours over a round-robin input of its own, run after run, until the
    broker's CPU per record stops falling (`broker_is_warm`); then Kafka Streams once
    over it. The keyed warm-up (`warm_broker`) leaves the broker's round-robin paths cold
    (the internal topic's produce and read_committed fetches, transactions over five
    partitions): its CPU per record fell from 10.3 to 4.1 us over the first nine 2M
    round-robin runs on one broker (bench/HISTORY.md), and a production broker runs
    warm."""
    partitions = 4
    input_topic = "rr-warm-up-in"
    data = workload(RR_WARM_UP_RECORDS, seed=13)
    per_partition = [len(range(p, RR_WARM_UP_RECORDS, partitions)) for p in range(partitions)]
    broker.create_topic(input_topic, partitions)
    fill(bootstrap, input_topic, data, partitions=partitions, round_robin=True)
    uniques = len({key for key, _ in data})
    del data
    broker_us: list[float] = []
    for run_number in range(1, RR_WARM_UP_MAX_RUNS + 1):
        name = f"rr-warm-up-{run_number}"
        run = owners_run(
            bootstrap, broker, name, input_topic, per_partition, tmp, batch_size, ownership=True
        )
        drop_run_topics(broker, name)
        broker_us.append(run.broker_cpu_us or 0.0)
        print(
            f"[bench] round-robin warm-up {run_number} (untimed): ours {run.records_per_s:,.0f} "
            f"records/s, broker {broker_us[-1]:.2f} us/record",
            flush=True,
        )
        if broker_is_warm(broker_us):
            break
    if peer:
        name = "rr-warm-up-kstreams"
        result = run_kstreams_on(
            broker,
            bootstrap,
            input_topic,
            name,
            RR_WARM_UP_RECORDS,
            uniques,
            tmp,
            partitions,
            "repartition",
            application_id=name,
        )
        print(
            f"[bench] round-robin warm-up (untimed): Kafka Streams {result.records_per_s:,.0f} "
            "records/s",
            flush=True,
        )
        drop_kstreams_run(broker, tmp, name)
    drop_topics(broker, input_topic)


def run_round_robin(
    bootstrap: str,
    broker: KafkaBroker | None,
    records: int,
    tmp: Path,
    batch_size: int,
    peer: bool,
    figures: list[bench_results.Figure],
    runs: int = 2,
    warm_up: bool = True,
) -> int:
    """Records produced round-robin over 4 partitions: ours under ownership against a
    Kafka Streams app re-keying by the id through a repartition topic, each `runs` times
    in the order ours, peer, peer, ours, ... (a drift of the broker over the invocation
    favours neither) after the round-robin warm-up; the medians are compared."""
    partitions = 4
    if warm_up and broker is not None:
        warm_round_robin(bootstrap, broker, tmp, batch_size, peer)
    data = workload(records)
    uniques = len({key for key, _ in data})
    per_partition = [len(range(p, records, partitions)) for p in range(partitions)]
    input_topic = f"rr-{records}-in"
    if broker is not None:
        broker.create_topic(input_topic, partitions)
    fill(bootstrap, input_topic, data, partitions=partitions, round_robin=True)
    del data
    print(
        f"[bench] round-robin: {records:,} records of ~300 B, {DUPLICATE_SHARE:.0%} duplicates, "
        f"record n on partition n % {partitions}; {runs} run(s) each, ours and the peer "
        f"alternating; {os.cpu_count()} CPUs",
        flush=True,
    )
    ours: list[OwnersRun] = []
    theirs: list[kstreams.PeerResult] = []
    errors: list[str] = []
    for run_number in range(1, runs + 1):
        order = ("ours", "peer") if run_number % 2 else ("peer", "ours")
        for who in order:
            if who == "ours":
                name = f"rr-{records}-ours{run_number}"
                run = owners_run(
                    bootstrap,
                    broker,
                    name,
                    input_topic,
                    per_partition,
                    tmp,
                    batch_size,
                    ownership=True,
                )
                ours.append(run)
                print(
                    f"ours : run {run_number}: {run.records_per_s:>9,.0f} records/s (steady "
                    f"{run.steady_records_per_s:,.0f}/s; {partitions} workers under ownership; "
                    f"forwarded {run.forwarded:,} = {run.forwarded / records:.1%} of the input; "
                    f"CPU/record: workers {run.worker_cpu_us:.1f} us"
                    f"{'' if run.broker_cpu_us is None else f', broker {run.broker_cpu_us:.1f} us'}; "
                    f"startup {run.startup_s:.2f}s; a commit every {run.commit_interval_ms:.0f} ms; "
                    f"commit p50 {run.p50_ms:.1f} ms p99 {run.p99_ms:.1f} ms, worst worker)",
                    flush=True,
                )
                error = check_owned_output(bootstrap, "ours", f"{name}-out", uniques, partitions)
                drop_run_topics(broker, name)
            elif peer:
                name = f"rr-{records}-kstreams{run_number}"
                before = broker_cpu_seconds(broker)
                result = run_kstreams_on(
                    broker,
                    bootstrap,
                    input_topic,
                    name,
                    records,
                    uniques,
                    tmp,
                    partitions,
                    "repartition",
                    application_id=name,
                )
                broker_cpu = broker_cpu_since(broker, before)
                theirs.append(result)
                print(
                    f"peer : run {run_number}: {result.records_per_s:>9,.0f} records/s (Kafka "
                    f"Streams {kstreams.kafka_version()}, exactly_once_v2, {partitions} stream "
                    f"threads, re-keyed by the id through a repartition topic, {result.store} "
                    f"store; steady {result.steady_records_per_s:,.0f}/s"
                    f"{'' if broker_cpu is None else f'; broker {broker_cpu / records * 1e6:.1f} us/record'})",
                    flush=True,
                )
                error = check_owned_output(
                    bootstrap, "Kafka Streams", f"{name}-out", uniques, partitions
                )
                drop_kstreams_run(broker, tmp, name)
            else:
                continue
            if error:
                errors.append(error)
    drop_topics(broker, input_topic)
    for error in errors:
        print(f"ERROR: {error}", file=sys.stderr)
    if errors:
        return 1
    rate = statistics.median(r.records_per_s for r in ours)
    steady = statistics.median(r.steady_records_per_s for r in ours)
    forwarded = ours[0].forwarded / records
    warmed = " after the round-robin warm-up" if warm_up and broker is not None else ""
    figure = f"ours {rate:,.0f} records/s ({forwarded:.1%} forwarded), median of {len(ours)}"
    target = "none: no peer run"
    if theirs:
        their_rate = statistics.median(r.records_per_s for r in theirs)
        their_steady = statistics.median(r.steady_records_per_s for r in theirs)
        ratio = rate / their_rate
        print(
            f"ratio: {ratio:.2f}x Kafka Streams with a repartition topic (medians of "
            f"{len(ours)} runs each, alternating{warmed}; start-ups included); steady "
            f"{steady / their_steady:.2f}x   (target: >= {TARGET_KSTREAMS_RATIO:g}x)",
            flush=True,
        )
        figure += (
            f"; Kafka Streams through a repartition topic {their_rate:,.0f}/s: {ratio:.2f}x "
            f"(steady {steady / their_steady:.2f}x), alternating{warmed}"
        )
        target = (
            f">= {TARGET_KSTREAMS_RATIO:g}x: "
            f"{bench_results.verdict(ratio >= TARGET_KSTREAMS_RATIO)}"
        )
    label = bench_results.count_label(records)
    figures.append(
        bench_results.Figure(
            f"worker_throughput.round_robin.{label}",
            f"ownership, round-robin input, {label}",
            figure,
            target,
        )
    )
    return 0


def run_commit_p99(
    bootstrap: str,
    broker: KafkaBroker | None,
    records: int,
    worker_counts: list[int],
    tmp: Path,
    batch_size: int,
    figures: list[bench_results.Figure],
) -> int:
    """Commit latency when each commit writes up to W internal-partition markers: one
    worker process, worker 0 of W, on a 1-partition input keyed by id, so (W-1)/W of its
    records go to W-1 internal partitions."""
    data = workload(records)
    uniques = {key for key, _ in data}
    input_topic = f"cp-{records}-in"
    if broker is not None:
        broker.create_topic(input_topic, 1)
    fill(bootstrap, input_topic, data)
    del data
    print(
        f"[bench] commit p99: {records:,} records on 1 input partition, one worker process "
        f"(worker 0 of W, under ownership), internal and output topics with W partitions",
        flush=True,
    )
    rows = []
    loads = [os.getloadavg()[0]]
    for workers in worker_counts:
        name = f"cp-{records}-w{workers}"
        if broker is not None:
            broker.create_topic(f"{name}-out", workers)
            broker.create_topic(f"{name}-dlq", 1)
            broker.create_topic(f"{name}-owned", workers)
        spec = OwnerSpec(
            bootstrap=bootstrap,
            pipeline=name,
            input_topic=input_topic,
            output_topic=f"{name}-out",
            partition=0,
            input_records=records,
            store=str(tmp / f"{name}-store"),
            batch_size=batch_size,
            owned_topic=f"{name}-owned",
            workers=workers,
            coordinated=False,
        )
        (result,) = run_owners([spec])
        shutil.rmtree(tmp / f"{name}-store", ignore_errors=True)
        rate = records / (result["done"] - result["ready"])
        rows.append((workers, result, rate))
        print(
            f"ours : W={workers:<3} commit p50 {result['p50_commit_ms']:.1f} ms  p99 "
            f"{result['p99_commit_ms']:.1f} ms over {result['commits']} commits  "
            f"{rate:>9,.0f} records/s (after start-up)  forwarded {result['forwarded']:,} "
            f"({result['forwarded'] / records:.1%})",
            flush=True,
        )
        mine = sum(1 for key in uniques if owner(key, workers) == 0)
        out = count_committed(bootstrap, f"{name}-out", workers=workers)
        fwd = count_committed(bootstrap, f"{name}-owned")
        ok = (
            out.records == mine
            and out.distinct_keys == mine
            and out.misplaced == 0
            and fwd.distinct_keys == len(uniques) - mine
        )
        print(
            f"check: W={workers}: output {out.records:,} records, {out.distinct_keys:,} distinct "
            f"ids (expected {mine:,}: the ids worker 0 owns), {out.misplaced} misplaced; internal "
            f"topic {fwd.distinct_keys:,} distinct ids (expected {len(uniques) - mine:,}): "
            f"{'ok' if ok else 'WRONG'}",
            flush=True,
        )
        if not ok:
            print(
                f"ERROR: W={workers}: the output or the forwarded records are wrong",
                file=sys.stderr,
            )
            return 1
        drop_run_topics(broker, name)
        loads.append(os.getloadavg()[0])
    print(f"{'W':>4} {'commits':>8} {'p50 ms':>7} {'p99 ms':>7} {'records/s':>10}")
    for workers, result, rate in rows:
        print(
            f"{workers:>4} {result['commits']:>8} {result['p50_commit_ms']:>7.1f} "
            f"{result['p99_commit_ms']:>7.1f} {rate:>10,.0f}"
        )
    p99s = [(workers, float(result["p99_commit_ms"])) for workers, result, _ in rows]
    figures.append(
        bench_results.Figure(
            "worker_throughput.forwarding_commit_p99",
            "commit p99 with forwarding",
            ", ".join(
                f"{p99:.1f}{' ms' if i == 0 else ''} at W={workers}"
                for i, (workers, p99) in enumerate(p99s)
            )
            + f" {load_range(loads)}",
            f"<= {TARGET_COMMIT_P99_MS:.0f} ms: "
            + bench_results.verdict(max(p99 for _, p99 in p99s) <= TARGET_COMMIT_P99_MS),
        )
    )
    return 0


# --- the comparison ---------------------------------------------------------------------


# --- ours against the bare exactly-once copy (issue 52) --------------------------------------


@dataclass
class ProcessRun:
    """One timed run of a process over the whole input."""

    label: str
    seconds: float  # from the process's start to its group's offset at the end
    steady_seconds: float  # from its first commit
    steady_records: int
    cpu_s: float
    broker_cpu_s: float | None

    def rate(self, records: int) -> float:
        return records / self.seconds

    def steady_rate(self) -> float:
        return self.steady_records / self.steady_seconds if self.steady_seconds > 0 else 0.0


def run_process_over(
    command: list[str],
    label: str,
    bootstrap: str,
    broker: KafkaBroker | None,
    group: str,
    topic: str,
    end: int,
    log_path: Path,
    timeout_s: float = 900.0,
) -> ProcessRun:
    """Start `command`, wait until `group` has committed offset `end` of `topic`/0 (polled
    every 50 ms by a consumer that joins no group), take the process's CPU, then SIGTERM
    it (it ends after the batch in hand)."""
    watcher = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    broker_before = broker_cpu_seconds(broker)
    started = time.monotonic()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    first: tuple[float, int] | None = None
    try:
        deadline = started + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{label} exited {proc.returncode}; its log: {log_path}")
            (position,) = watcher.committed([TopicPartition(topic, 0)], timeout=10)
            now = time.monotonic()
            if position.offset > 0 and first is None:
                first = (now, position.offset)
            if position.offset >= end:
                break
            if now > deadline:
                raise RuntimeError(f"{label}: offset {position.offset} of {end} after {timeout_s}s")
            time.sleep(0.05)
        done = time.monotonic()
        cpu = cpu_seconds(proc.pid)
        broker_cpu = broker_cpu_since(broker, broker_before)
    finally:
        watcher.close()
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert first is not None
    return ProcessRun(label, done - started, done - first[0], end - first[1], cpu, broker_cpu)


def ours_command(bootstrap: str, name: str, store: Path) -> list[str]:
    """The `dedup-worker` CLI as a user runs it: the required settings, a window, and the
    defaults for everything else."""
    return [
        sys.executable, "-m", "dedup_worker.cli",
        "--bootstrap-servers", bootstrap, "--input-topic", f"{name}-in",
        "--output-topic", f"{name}-out", "--dead-letter-topic", f"{name}-dlq",
        "--partition", "0", "--pipeline", name, "--store-path", str(store),
        "--window-duration", "7d",
    ]  # fmt: skip


def bare_command(bootstrap: str, input_topic: str, name: str, pipelined: bool) -> list[str]:
    return [
        sys.executable, str(BARE_COPY), "--bootstrap", bootstrap, "--input", input_topic,
        "--output", f"{name}-out", "--group", f"bare-{name}",
        *(["--pipelined"] if pipelined else []),
    ]  # fmt: skip


def us_per_record(runs: Sequence[ProcessRun], records: int, broker: bool = False) -> str:
    """The median CPU microseconds per record of `runs`' processes (or of the broker)."""
    values = [r.broker_cpu_s if broker else r.cpu_s for r in runs]
    known = [v for v in values if v is not None]
    return f"{statistics.median(known) / records * 1e6:.1f}" if known else "?"


def profile_summary(stats_path: Path, top: int = 14) -> str:
    """The functions a cProfile run spent most in (own time), one line each."""
    import pstats

    stats = pstats.Stats(str(stats_path))
    rows = []
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values()) or 1.0
    for (file, line, function), entry in sorted(raw.items(), key=lambda kv: -kv[1][2])[:top]:
        calls, own = entry[1], entry[2]
        where = f"{Path(file).name}:{line}" if line else file
        rows.append(f"  {own / total:6.1%} own  {calls:>10,} calls  {function} ({where})")
    return "\n".join(rows)


def run_bare_copy(
    bootstrap: str,
    broker: KafkaBroker | None,
    counts: Sequence[int],
    runs: int,
    tmp: Path,
    figures: list[bench_results.Figure],
) -> int:
    """`--bare-copy`: see the module's docstring."""
    code = 0
    for records in counts:
        data = workload(records)
        uniques = len({key for key, _ in data})
        source = f"bare-vs-ours-{records}"
        if broker is not None:
            broker.create_topic(f"{source}-in", 1)
        fill(bootstrap, f"{source}-in", data)
        print(
            f"[bench] --bare-copy: {records:,} records of ~300 B keyed by id, "
            f"{DUPLICATE_SHARE:.0%} repeats, 1 partition; {runs} runs each, alternating",
            flush=True,
        )
        sides = ("ours", "bare", "piped")  # piped: the copy with --pipelined
        order = [sides, sides[::-1]] * ((runs + 1) // 2)
        done: dict[str, list[ProcessRun]] = {side: [] for side in sides}
        for n, turn in enumerate(order[:runs]):
            for side in turn:
                name = f"{side}-{records}-{n}"
                if broker is not None:
                    for suffix in ("out", "dlq") if side == "ours" else ("out",):
                        broker.create_topic(f"{name}-{suffix}", 1)
                if side == "ours":  # every run reads the one input, with a group of its own
                    command = ours_command(bootstrap, name, tmp / f"store-{name}")
                    command[command.index("--input-topic") + 1] = f"{source}-in"
                    group = names.default_consumer_group(name)
                else:
                    command = bare_command(bootstrap, f"{source}-in", name, side == "piped")
                    group = f"bare-{name}"
                run = run_process_over(
                    command, side, bootstrap, broker, group, f"{source}-in", records,
                    tmp / f"{name}.log",
                )  # fmt: skip
                out = count_committed(bootstrap, f"{name}-out")
                expected = (uniques, uniques) if side == "ours" else (records, uniques)
                ok = (out.records, out.distinct_keys) == expected
                print(
                    f"{side:5} run {n}: {run.rate(records):>9,.0f} records/s (steady "
                    f"{run.steady_rate():,.0f}/s)  CPU {run.cpu_s / records * 1e6:.1f} us/record"
                    + (
                        f", broker {run.broker_cpu_s / records * 1e6:.1f} us/record"
                        if run.broker_cpu_s is not None
                        else ""
                    )
                    + f"  output {out.records:,} records, {out.distinct_keys:,} ids: "
                    + ("ok" if ok else f"WRONG (expected {expected})"),
                    flush=True,
                )
                if not ok:
                    code = 1
                done[side].append(run)
                drop_topics(broker, f"{name}-out", f"{name}-dlq")
        rates = {side: statistics.median(r.rate(records) for r in done[side]) for side in sides}
        steady = {side: statistics.median(r.steady_rate() for r in done[side]) for side in sides}
        cpu = {side: us_per_record(done[side], records) for side in sides}
        broker_cpu = {side: us_per_record(done[side], records, True) for side in sides}
        for copy, what, row, key in (
            ("bare", "bare copy", "bare exactly-once copy", "bare_copy"),
            ("piped", "pipelined bare copy", "pipelined bare exactly-once copy",
             "bare_copy_pipelined"),
        ):  # fmt: skip
            ratio, steady_ratio = rates["ours"] / rates[copy], steady["ours"] / steady[copy]
            print(
                f"ours / {what} at {records:,}: {ratio:.3f} (medians {rates['ours']:,.0f} / "
                f"{rates[copy]:,.0f} records/s; steady {steady_ratio:.3f}: "
                f"{steady['ours']:,.0f} / {steady[copy]:,.0f})  target >= "
                f"{TARGET_BARE_COPY_RATIO}",
                flush=True,
            )
            figures.append(
                bench_results.Figure(
                    f"worker_throughput.{key}",
                    f"ours / {row}, {bench_results.count_label(records)}",
                    f"{ratio:.2f} ({rates['ours']:,.0f} / {rates[copy]:,.0f} records/s, "
                    f"medians of {runs}; steady {steady_ratio:.2f})",
                    f">= {TARGET_BARE_COPY_RATIO}",
                )
            )
        print(
            f"CPU per record (medians): ours {cpu['ours']} us, bare {cpu['bare']} us, "
            f"pipelined {cpu['piped']} us; the broker {broker_cpu['ours']} us under ours, "
            f"{broker_cpu['bare']} us under the copy, {broker_cpu['piped']} us under the "
            "pipelined copy",
            flush=True,
        )
        # where ours spends its time: one more run, under cProfile (slower; not timed)
        name = f"profile-{records}"
        if broker is not None:
            for suffix in ("out", "dlq"):
                broker.create_topic(f"{name}-{suffix}", 1)
        stats_path = tmp / f"{name}.prof"
        command = ours_command(bootstrap, name, tmp / f"store-{name}")
        command[command.index("--input-topic") + 1] = f"{source}-in"
        command[1:3] = ["-m", "cProfile", "-o", str(stats_path), "-m", "dedup_worker.cli"]
        run_process_over(
            command, "ours (profiled)", bootstrap, broker, names.default_consumer_group(name),
            f"{source}-in", records, tmp / f"{name}.log",
        )  # fmt: skip
        if stats_path.exists():
            print(
                f"profile of ours (cProfile, main thread, own time):\n{profile_summary(stats_path)}"
            )
        drop_topics(broker, f"{source}-in", f"{name}-out", f"{name}-dlq")
    return code


def int_list(text: str) -> list[int]:
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of counts: {text}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"counts are positive: {text}")
    return values


def peer_list(text: str) -> list[str]:
    peers = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    return peers


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--records",
        type=int_list,
        default=None,
        help="record counts, e.g. 500000,2000000 (default 500000; --ownership-cost "
        "2000000,5000000; --round-robin 2000000; --commit-p99 1000000)",
    )
    parser.add_argument(
        "--peer-records",
        type=int,
        default=None,
        help="records for the peers (default: same)",
    )
    parser.add_argument(
        "--peers",
        type=peer_list,
        default=list(PEERS),
        help="kstreams,quix (default: both)",
    )
    parser.add_argument("--skip-peer", action="store_true", help="ours only")
    parser.add_argument(
        "--kstreams-store",
        choices=("window", "kv"),
        default="window",
        help="the Kafka Streams peer's store (see bench/peers/kstreams/)",
    )
    parser.add_argument("--batch-size", type=int, default=5000, help="our worker's batch size")
    parser.add_argument(
        "--partitions",
        type=int_list,
        default=None,
        help="measure ours at these partition counts (e.g. 1,2,4) instead of the peers",
    )
    parser.add_argument(
        "--ownership-cost",
        action="store_true",
        help="4 workers keyed by id on 4 partitions, without and under ownership, alternating",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=4,
        help="--ownership-cost: alternating pairs per count (a b, then b a, ...)",
    )
    parser.add_argument(
        "--warm-up-pairs",
        type=int,
        default=1,
        help="--ownership-cost: pairs run first at the first count and not counted "
        "(default 1; none with --no-warm-up)",
    )
    parser.add_argument(
        "--round-robin",
        action="store_true",
        help="4 partitions produced round-robin: ours under ownership against Kafka Streams "
        "re-keying through a repartition topic",
    )
    parser.add_argument(
        "--round-robin-runs",
        type=int,
        default=2,
        help="--round-robin: timed runs of ours and of the peer each, alternating (default 2)",
    )
    parser.add_argument(
        "--commit-p99",
        action="store_true",
        help="commit latency of worker 0 of W under ownership (W from --workers)",
    )
    parser.add_argument(
        "--workers", type=int_list, default=[4, 16, 64], help="--commit-p99: W values"
    )
    parser.add_argument(
        "--bare-copy",
        action="store_true",
        help="ours (the CLI, as a process) against the bare exactly-once copy, alternating",
    )
    parser.add_argument("--runs", type=int, default=4, help="--bare-copy: runs of each")
    parser.add_argument("--bootstrap", help="use this broker instead of starting a local one")
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="time the first run on a fresh broker (default: warm the bench's broker first)",
    )
    parser.add_argument("--partition-child", help=argparse.SUPPRESS)
    parser.add_argument("--owner-child", help=argparse.SUPPRESS)
    bench_results.add_arguments(parser)
    args = parser.parse_args()
    if args.partition_child:
        return partition_child(args.partition_child)
    if args.owner_child:
        return owner_child(args.owner_child)
    peers: list[str] = [] if args.skip_peer else args.peers
    ownership_modes = args.ownership_cost or args.round_robin or args.commit_p99
    if ownership_modes:
        peers = [peer for peer in peers if peer == "kstreams"]  # Quix has no part in these
    if args.bare_copy:
        peers = []  # its baseline is the bare copy, in the same invocation
    figures: list[bench_results.Figure] = []
    try:
        return run_modes(args, peers, ownership_modes, figures)
    finally:
        bench_results.record_figures(args, figures)  # what completed and checked out


def run_modes(
    args: argparse.Namespace,
    peers: list[str],
    ownership_modes: bool,
    figures: list[bench_results.Figure],
) -> int:
    """The modes main() was asked for, on one broker; the rows they produce into ``figures``."""
    with (
        ExitStack() as stack,
        tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp,
    ):
        if args.bootstrap:
            bootstrap = args.bootstrap
            broker = None
        else:
            broker = stack.enter_context(KafkaBroker(config=BENCH_BROKER_CONFIG))
            bootstrap = broker.bootstrap
        if "kstreams" in peers:
            kstreams.build()  # before anything is timed
        if "quix" in peers:
            quix_python()
        warm_group_coordinator(bootstrap)
        if broker is not None and not args.no_warm_up:
            print(f"[bench] warming the broker: ours over {WARM_UP_RECORDS:,} records, untimed")
            warm_broker(broker, Path(tmp) / "store-warm-up", args.batch_size)
        if args.bare_copy:
            return run_bare_copy(
                bootstrap, broker, args.records or [2_000_000], args.runs, Path(tmp), figures
            )
        if ownership_modes:
            code = 0
            tmp_path = Path(tmp)
            if args.ownership_cost:
                code |= run_ownership_cost(
                    bootstrap,
                    broker,
                    args.records or [2_000_000, 5_000_000],
                    args.pairs,
                    tmp_path,
                    args.batch_size,
                    "kstreams" in peers,
                    figures,
                    warm_up_pairs=0 if args.no_warm_up else args.warm_up_pairs,
                )
            if args.round_robin and not code:
                code |= run_round_robin(
                    bootstrap,
                    broker,
                    (args.records or [2_000_000])[0],
                    tmp_path,
                    args.batch_size,
                    "kstreams" in peers,
                    figures,
                    runs=args.round_robin_runs,
                    warm_up=not args.no_warm_up,
                )
            if args.commit_p99 and not code:
                code |= run_commit_p99(
                    bootstrap,
                    broker,
                    (args.records or [1_000_000])[0],
                    args.workers,
                    tmp_path,
                    args.batch_size,
                    figures,
                )
            return code
        args.records = args.records or [500_000]
        if args.partitions:
            data = workload(args.records[0])
            return run_partitions(
                bootstrap, broker, data, args.partitions, Path(tmp), args.batch_size, figures
            )
        largest = max([*args.records, *([args.peer_records] if args.peer_records else [])])
        data = workload(largest)

        def topics(name: str, n: int) -> int:
            """Create and fill ``name``'s topics with the first ``n`` records; their ids."""
            if broker is not None:
                create_topics(broker, name)
            fill(bootstrap, f"{name}-in", data[:n])
            return len({key for key, _ in data[:n]})

        summary: list[tuple[int, dict[str, float], dict[str, float]]] = []
        for records in args.records:
            peer_records = args.peer_records or records
            print(
                f"[bench] {records} records of ~300 B, {DUPLICATE_SHARE:.0%} duplicates, 1 partition, exactly-once"
            )
            uniques = topics(f"ours-{records}", records)
            ours = run_ours_in_child(
                bootstrap,
                f"ours-{records}",
                0,
                records,
                Path(tmp) / f"store-{records}",
                args.batch_size,
            )
            print(
                f"ours : batch {args.batch_size}: {ours['records_per_s']:>10,.0f} records/s (steady {ours['steady_records_per_s']:,.0f}/s, "
                f"startup {ours['startup_s']:.2f}s)  commit p50 {ours['p50_commit_ms']:.1f} ms  p99 {ours['p99_commit_ms']:.1f} ms",
                flush=True,
            )
            errors = [check_output(bootstrap, "ours", f"ours-{records}", uniques, True)]
            rates: dict[str, float] = {}
            for peer in peers:
                name = f"{peer}-{records}"
                outputs = topics(name, peer_records)
                if peer == "kstreams":
                    result = kstreams.run(
                        bootstrap,
                        f"{name}-in",
                        f"{name}-out",
                        f"{name}-dlq",
                        peer_records,
                        outputs,
                        Path(tmp) / f"{name}-state",
                        store=args.kstreams_store,
                        window_ms=WINDOW_MS,
                    )
                    rates[peer] = result.records_per_s
                    print(
                        f"peer : {rates[peer]:>10,.0f} records/s (Kafka Streams {kstreams.kafka_version()}, "
                        f"exactly_once_v2, {result.store} store; steady {result.steady_records_per_s:,.0f}/s, "
                        f"startup {result.seconds - result.steady_seconds:.2f}s)",
                        flush=True,
                    )
                    errors.append(check_output(bootstrap, "Kafka Streams", name, outputs, True))
                else:
                    rates[peer] = run_quix(
                        bootstrap,
                        name,
                        peer_records,
                        outputs,
                        Path(tmp) / f"{name}-state",
                    )["records_per_s"]
                    print(
                        f"peer : {rates[peer]:>10,.0f} records/s (Quix Streams {versions()['QUIXSTREAMS_VERSION']}, exactly-once)",
                        flush=True,
                    )
                    errors.append(check_output(bootstrap, "Quix Streams", name, outputs, False))
            wrong = [error for error in errors if error]
            if wrong:
                for error in wrong:
                    print(f"ERROR: {error}", file=sys.stderr)
                return 1
            if "kstreams" in rates:
                print(
                    f"ratio: {ours['records_per_s'] / rates['kstreams']:.2f}x Kafka Streams   "
                    "(target: >= 2x at 2M and 5M records)"
                )
            if "quix" in rates:
                print(
                    f"ratio: {ours['records_per_s'] / rates['quix']:.2f}x Quix Streams   "
                    "(targets: >= 100,000 records/s, >= 3x the peer)"
                )
            summary.append((records, ours, rates))
        if len(summary) > 1:
            print_summary(summary, peers)
        figures.extend(comparison_figures(summary))
    return 0


def comparison_figures(
    summary: list[tuple[int, dict[str, float], dict[str, float]]],
) -> list[bench_results.Figure]:
    """The results table's rows of the peer comparison: ours against each peer that ran,
    per count, and our commit p99 over the counts."""
    out: list[bench_results.Figure] = []
    for records, ours, rates in summary:
        label = bench_results.count_label(records)
        rate = ours["records_per_s"]
        if "kstreams" in rates:
            ratio = rate / rates["kstreams"]
            met = ratio >= TARGET_KSTREAMS_RATIO
            target = (
                f">= {TARGET_KSTREAMS_RATIO:g}x: {bench_results.verdict(met)}"
                if records in KSTREAMS_TARGET_COUNTS
                else "none"
            )
            out.append(
                bench_results.Figure(
                    f"worker_throughput.kstreams.{label}",
                    f"worker against Kafka Streams, {label}",
                    f"ours {rate:,.0f} records/s, Kafka Streams {rates['kstreams']:,.0f}/s: "
                    f"{ratio:.2f}x",
                    target,
                )
            )
        if "quix" in rates:
            ratio = rate / rates["quix"]
            fast, ahead = rate >= TARGET_RECORDS_PER_S, ratio >= TARGET_QUIX_RATIO
            both = f">= {TARGET_RECORDS_PER_S:,}/s and >= {TARGET_QUIX_RATIO:g}x"
            target = (
                f"{both}: {bench_results.verdict(fast)}"
                if fast == ahead
                else f">= {TARGET_RECORDS_PER_S:,}/s: {bench_results.verdict(fast)}; "
                f">= {TARGET_QUIX_RATIO:g}x: {bench_results.verdict(ahead)}"
            )
            out.append(
                bench_results.Figure(
                    f"worker_throughput.quix.{label}",
                    f"worker against Quix Streams, {label}",
                    f"ours {rate:,.0f} records/s, Quix Streams {rates['quix']:,.0f}/s: "
                    f"{ratio:.2f}x",
                    target,
                )
            )
    counts = [records for records, _, _ in summary]
    labels = [bench_results.count_label(records) for records in counts]
    p99 = [ours["p99_commit_ms"] for _, ours, _ in summary]
    p50 = sorted({f"{ours['p50_commit_ms']:.0f}" for _, ours, _ in summary}, key=float)
    each = [f"{value:.1f}" for value in p99]
    each[0] += " ms"
    if len(labels) > 1:
        each = [f"{text} at {label}" for text, label in zip(each, labels, strict=True)]
    p50_range = p50[0] if p50[0] == p50[-1] else f"{p50[0]}-{p50[-1]}"
    out.append(
        bench_results.Figure(
            "worker_throughput.commit_p99." + "_".join(labels),
            f"worker commit p99, {counts_text(counts)}",
            f"{', '.join(each)} (p50 {p50_range} ms)",
            f"<= {TARGET_COMMIT_P99_MS:.0f} ms: "
            + bench_results.verdict(max(p99) <= TARGET_COMMIT_P99_MS),
        )
    )
    return out


def print_summary(
    summary: list[tuple[int, dict[str, float], dict[str, float]]], peers: list[str]
) -> None:
    names = {"kstreams": "Kafka Streams", "quix": "Quix Streams"}
    head = f"{'records':>10} {'ours/s':>10} {'p99 ms':>7}"
    for peer in peers:
        head += f" {names[peer] + '/s':>16} {'ratio':>6}"
    print(head)
    for records, ours, rates in summary:
        line = f"{records:>10,} {ours['records_per_s']:>10,.0f} {ours['p99_commit_ms']:>7.1f}"
        for peer in peers:
            line += f" {rates[peer]:>16,.0f} {ours['records_per_s'] / rates[peer]:>5.2f}x"
        print(line)


if __name__ == "__main__":
    raise SystemExit(main())
