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

Targets on a 2-core machine: >= 100,000 records/s, >= 3x Quix Streams, >= 2x Kafka
Streams at 2M and 5M records, commit p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from peers import kstreams_peer as kstreams

from dedup_local.kafka import KafkaBroker, produce_all
from dedup_local.paths import cache_dir, versions
from dedup_worker.config import WorkerConfig
from dedup_worker.loop import DedupWorker
from dedup_worker.ownership import owner
from dedup_worker.window import WindowPolicy

HERE = Path(__file__).resolve().parent
DUPLICATE_SHARE = 0.02
WINDOW_MS = 7 * 24 * 3600 * 1000
PEERS = ("kstreams", "quix")


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
        body = {"messageId": key.decode(), "user": rng.randrange(10**6), "seq": n, "pad": ""}
        raw = json.dumps(body)
        body["pad"] = "x" * max(0, 300 - len(raw))
        out.append((key, json.dumps(body).encode()))
    return out


def fill(
    bootstrap: str, topic: str, data: Sequence[tuple[bytes, bytes]], partitions: int = 1
) -> None:
    """Produce ``data`` into ``topic``: all into partition 0, or over ``partitions`` by id
    as Kafka's default partitioner places a record keyed by it."""
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
            "partition": 0 if partitions == 1 else owner(key, partitions),
        }
        for key, value in data
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

    class Timed(DedupWorker):
        def _commit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            ok = super()._commit(*args, **kwargs)
            latencies.append(time.perf_counter() - t)
            return ok

    worker = Timed(cfg)
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
            [str(python), "-m", "pip", "install", "-q", f"quixstreams=={version}"], check=True
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


def count_committed(bootstrap: str, topic: str, timeout_s: float = 300.0) -> Committed:
    """Records and distinct keys (the workload's keys are the ids) committed in ``topic``,
    read by an independent read_committed consumer from the beginning to the high
    watermark as it stands now (the run is over: every transaction is complete or will
    have its marker written shortly, and the reader's position passes the markers)."""
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
        records = 0
        pending = set(ends)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic}: partitions {sorted(pending)} not read")
            for msg in consumer.consume(10_000, 0.5):
                err = msg.error()
                if err is None:
                    records += 1
                    keys.add(msg.key())
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"reading {topic}: {err}")
            for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        return Committed(records, len(keys))
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


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds of a process so far, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


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
        bootstrap, name, int(records), Path(store), int(batch_size), partition=int(partition)
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
    bootstrap: str, name: str, partition: int, records: int, store: Path, batch_size: int
) -> subprocess.Popen[str]:
    """A worker process of its own (`partition_child`) on `partition` of `name`'s topics:
    it holds none of the bench's workload (a worker in a pod holds only its own state;
    the bench's records in the same process cost ours ~13% at 2M, bench/README.md), as
    each peer runs in a process of its own too."""
    spec = "|".join([bootstrap, name, str(partition), str(records), str(store), str(batch_size)])
    return subprocess.Popen(
        [sys.executable, __file__, "--partition-child", spec], stdout=subprocess.PIPE, text=True
    )


def child_result(child: subprocess.Popen[str]) -> dict[str, Any]:
    """The JSON line `partition_child` printed last; RuntimeError if it failed."""
    out, _ = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"our worker process exited with {child.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def run_ours_in_child(
    bootstrap: str, name: str, partition: int, records: int, store: Path, batch_size: int
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
) -> int:
    records = len(data)
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
        broker_cpu = cpu_seconds(broker.pid) if broker is not None and broker.pid else None
        children = [
            start_child(bootstrap, name, p, per_partition[p], tmp / f"{name}-store-{p}", batch_size)
            for p in range(n)
        ]
        results = []
        for child in children:
            try:
                results.append(child_result(child))
            except RuntimeError as exc:
                print(f"ERROR: {exc}")
                return 1
        if broker_cpu is not None and broker is not None and broker.pid:
            broker_cpu = cpu_seconds(broker.pid) - broker_cpu
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
    return 0


# --- the comparison ---------------------------------------------------------------------


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
        "--records", type=int_list, default=[500_000], help="record counts, e.g. 500000,2000000"
    )
    parser.add_argument(
        "--peer-records", type=int, default=None, help="records for the peers (default: same)"
    )
    parser.add_argument(
        "--peers", type=peer_list, default=list(PEERS), help="kstreams,quix (default: both)"
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
    parser.add_argument("--bootstrap", help="use this broker instead of starting a local one")
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="time the first run on a fresh broker (default: warm the bench's broker first)",
    )
    parser.add_argument("--partition-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.partition_child:
        return partition_child(args.partition_child)
    peers: list[str] = [] if args.skip_peer else args.peers

    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        if args.bootstrap:
            bootstrap = args.bootstrap
            broker = None
        else:
            broker = stack.enter_context(KafkaBroker())
            bootstrap = broker.bootstrap
        if "kstreams" in peers:
            kstreams.build()  # before anything is timed
        if "quix" in peers:
            quix_python()
        warm_group_coordinator(bootstrap)
        if broker is not None and not args.no_warm_up:
            print(f"[bench] warming the broker: ours over {WARM_UP_RECORDS:,} records, untimed")
            warm_broker(broker, Path(tmp) / "store-warm-up", args.batch_size)
        if args.partitions:
            data = workload(args.records[0])
            return run_partitions(
                bootstrap, broker, data, args.partitions, Path(tmp), args.batch_size
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
                        bootstrap, name, peer_records, outputs, Path(tmp) / f"{name}-state"
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
    return 0


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
