"""Throughput of one exactly-once worker on the local broker, against a peer.

    python bench/worker_throughput.py [--records 500000] [--skip-peer] [--bootstrap HOST:PORT]

Workload: one partition, 300-byte JSON records keyed by message id, 2% duplicates.
Ours: `DedupWorker` (RocksDB window, one Kafka transaction per batch) in this process.
Peer: a Quix Streams application doing keyed dedup with its RocksDB state and
exactly-once processing, in its own virtual environment (Quix pins conflict with ours),
as a child process on the same broker in the same invocation. Prints records/s for both,
p50/p99 batch commit latency for ours, and the ratio. Targets on a 2-core machine:
>= 100,000 records/s and >= 3x the peer.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from dedup_local.kafka import KafkaBroker, produce_all
from dedup_local.paths import cache_dir, versions
from dedup_worker.config import WorkerConfig
from dedup_worker.loop import DedupWorker
from dedup_worker.window import WindowPolicy

HERE = Path(__file__).resolve().parent
DUPLICATE_SHARE = 0.02


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


def fill(bootstrap: str, topic: str, data: list[tuple[bytes, bytes]]) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
        }
    )
    records = ({"key": key, "value": value, "partition": 0} for key, value in data)
    produce_all(producer, topic, records, timeout_s=120)


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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_ours(
    bootstrap: str, name: str, records: int, store_dir: Path, batch_size: int
) -> dict[str, float]:
    cfg = WorkerConfig(
        bootstrap_servers=bootstrap,
        input_topic=f"{name}-in",
        output_topic=f"{name}-out",
        dead_letter_topic=f"{name}-dlq",
        partition=0,
        pipeline=name,
        store_path=store_dir,
        window=WindowPolicy(duration_ms=7 * 24 * 3600 * 1000, max_keys=None),
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


def run_peer(
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument(
        "--peer-records", type=int, default=None, help="records for the peer (default: same)"
    )
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--batch-size", type=int, default=5000, help="our worker's batch size")
    parser.add_argument("--bootstrap", help="use this broker instead of starting a local one")
    args = parser.parse_args()

    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        if args.bootstrap:
            bootstrap = args.bootstrap
            broker = None
        else:
            broker = stack.enter_context(KafkaBroker())
            bootstrap = broker.bootstrap
        data = workload(args.records)
        peer_records = args.peer_records or args.records

        def topics(name: str, n: int) -> None:
            if broker is not None:
                for suffix in ("in", "out", "dlq"):
                    broker.create_topic(f"{name}-{suffix}", 1)
            fill(bootstrap, f"{name}-in", data[:n])

        warm_group_coordinator(bootstrap)
        print(
            f"[bench] {args.records} records of ~300 B, {DUPLICATE_SHARE:.0%} duplicates, 1 partition, exactly-once"
        )
        topics("ours", args.records)
        ours = run_ours(bootstrap, "ours", args.records, Path(tmp) / "store", args.batch_size)
        print(
            f"ours : batch {args.batch_size}: {ours['records_per_s']:>10,.0f} records/s (steady {ours['steady_records_per_s']:,.0f}/s, "
            f"startup {ours['startup_s']:.2f}s)  commit p50 {ours['p50_commit_ms']:.1f} ms  p99 {ours['p99_commit_ms']:.1f} ms"
        )
        if args.skip_peer:
            return 0
        topics("quix", peer_records)
        outputs = len({key for key, _ in data[:peer_records]})
        peer = run_peer(bootstrap, "quix", peer_records, outputs, Path(tmp) / "quix-state")
        print(
            f"peer : {peer['records_per_s']:>10,.0f} records/s (Quix Streams {versions()['QUIXSTREAMS_VERSION']}, exactly-once)"
        )
        ratio = ours["records_per_s"] / peer["records_per_s"]
        print(f"ratio: {ratio:.2f}x the peer   (targets: >= 100,000 records/s, >= 3x the peer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
