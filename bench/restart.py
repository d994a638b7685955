"""Restart to first commit of a `dedup-worker` whose window holds 10M ids, against an empty one.

    python bench/restart.py [--keys 10000000] [--records 100000] [--batch-size 5000]

For each store -- the baseline, empty, and one holding ``--keys`` ids -- on one local
broker, in one invocation:

1. The store is built directly (``Store.record_batch``, then compacted and closed), as
   a worker that has published that many ids whose records have left the topics;
   its applied offsets are those of the fresh, empty output topic.
2. ``--records`` records (300-byte JSON, 2% duplicates, none of them in the store) are
   put on the input topic.
3. **Crash restart**: a worker process runs with the test-only fault point
   ``after-commit`` and SIGKILLs itself right after its first Kafka commit, before the
   store write -- the worst crash for start-up, which must re-apply that batch from
   the output topic. A new worker process is started and timed from ``Popen`` until
   the consumer group's committed input offset moves past the crash point.
4. **Clean restart**: that worker gets SIGTERM after a second, finishes its batch and
   closes the store; a new process is timed the same way.

The clock runs from the process start, so it includes the interpreter, the imports,
opening RocksDB, the catch-up and the first batch's commit. The committed offset is
polled every 10 ms by an independent consumer. Target at 10M ids: under 5 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import results as bench_results
from confluent_kafka import Consumer, TopicPartition
from worker_throughput import fill, warm_group_coordinator, workload

from dedup_contract.faults import ENV as FAULTS_ENV
from dedup_contract.ids import id_key
from dedup_contract.store import Store, StoreOwner
from dedup_contract.window import WindowPolicy
from dedup_local.kafka import KafkaBroker
from dedup_local.worker import start_worker
from dedup_worker.config import WorkerConfig

TARGET_S = 5.0
BUILD_BATCH = 5_000


@dataclass(frozen=True)
class Restarts:
    keys: int
    build_s: float
    crash_s: float
    clean_s: float


def progress(message: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {message}", flush=True)


def build_store(cfg: WorkerConfig, keys: int) -> float:
    """A closed, compacted store holding ``keys`` ids, its offsets at the topics' start."""
    began = time.perf_counter()
    now_ms = int(time.time() * 1000)
    owner = StoreOwner(cfg.namespace, cfg.pipeline, cfg.partition)
    with Store.open(cfg.store_path, owner, cfg.window, cfg.store) as store:
        for start in range(0, keys, BUILD_BATCH):
            batch = [id_key(f"history-{n}") for n in range(start, min(keys, start + BUILD_BATCH))]
            store.record_batch(
                batch, now_ms, input_next_offset=None, output_next_offset=None, known_new=True
            )
            if start and start % 2_000_000 == 0:
                progress(f"store: {start:,} ids")
        store.record_batch([], 0, input_next_offset=0, output_next_offset=0)
        store.compact()
        assert store.key_count == keys, (store.key_count, keys)
    return time.perf_counter() - began


class CommitWatch:
    """The consumer group's committed offset of the input partition, read independently."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self._tp = TopicPartition(cfg.input_topic, cfg.partition)
        self._consumer = Consumer(
            {"bootstrap.servers": cfg.bootstrap_servers, "group.id": cfg.group}
        )

    def offset(self) -> int:
        return int(self._consumer.committed([self._tp], timeout=10)[0].offset)

    def wait_past(self, offset: int, began: float, timeout_s: float = 60.0) -> float:
        """Seconds from ``began`` until the committed offset exceeds ``offset``."""
        while time.perf_counter() - began < timeout_s:
            if self.offset() > offset:
                return time.perf_counter() - began
            time.sleep(0.01)
        raise TimeoutError(f"no commit past offset {offset} within {timeout_s:.0f} s")

    def close(self) -> None:
        self._consumer.close()


def start(cfg: WorkerConfig, log: Path, faults: str = "") -> subprocess.Popen[bytes]:
    return start_worker(cfg, log, env={FAULTS_ENV: faults})


def measure(
    broker: KafkaBroker, tmp: Path, name: str, keys: int, records: int, batch: int
) -> Restarts:
    for suffix in ("in", "out", "dlq"):
        broker.create_topic(f"{name}-{suffix}", 1)
    cfg = WorkerConfig(
        bootstrap_servers=broker.bootstrap,
        input_topic=f"{name}-in",
        output_topic=f"{name}-out",
        dead_letter_topic=f"{name}-dlq",
        partition=0,
        pipeline=name,
        store_path=tmp / f"{name}-store",
        window=WindowPolicy(max_keys=keys + 2 * records),  # nothing expires during the run
        batch_size=batch,
        linger_ms=20,
        metrics_port=None,
    )
    progress(f"{name}: building a store of {keys:,} ids")
    build_s = build_store(cfg, keys)
    fill(broker.bootstrap, cfg.input_topic, workload(records))
    log = tmp / f"{name}.log"
    watch = CommitWatch(cfg)
    try:
        progress(f"{name}: first worker, killed right after its first commit")
        crashing = start(cfg, log, faults="after-commit=1")
        if crashing.wait(120) != -signal.SIGKILL:
            raise RuntimeError(f"worker did not die at the fault point; see {log}")
        crashed_at = watch.offset()
        assert crashed_at > 0, crashed_at
        progress(f"{name}: crash restart (committed offset {crashed_at:,})")
        began = time.perf_counter()
        worker = start(cfg, log)
        crash_s = watch.wait_past(crashed_at, began)
        time.sleep(1.0)
        worker.send_signal(signal.SIGTERM)
        if worker.wait(60) != 0:
            raise RuntimeError(f"worker did not stop cleanly on SIGTERM; see {log}")
        stopped_at = watch.offset()
        if stopped_at >= records:
            raise RuntimeError("the input ran out before the clean restart; raise --records")
        progress(f"{name}: clean restart (committed offset {stopped_at:,})")
        began = time.perf_counter()
        worker = start(cfg, log)
        clean_s = watch.wait_past(stopped_at, began)
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    finally:
        watch.close()
    return Restarts(keys, build_s, crash_s, clean_s)


def figure(full: Restarts, empty: Restarts) -> bench_results.Figure:
    """The results table's row of this run."""
    label = bench_results.count_label(full.keys)
    met = full.crash_s < TARGET_S and full.clean_s < TARGET_S
    return bench_results.Figure(
        f"restart.{label}",
        f"restart to first commit, {label} ids",
        f"{full.crash_s:.2f} s after SIGKILL between commit and store write (empty store "
        f"{empty.crash_s:.2f} s: {full.crash_s / empty.crash_s:.2f}x); {full.clean_s:.2f} s "
        f"after SIGTERM ({full.clean_s / empty.clean_s:.2f}x)",
        f"< {TARGET_S:.0f} s: {bench_results.verdict(met)}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=10_000_000, help="ids in the store (10M)")
    parser.add_argument("--records", type=int, default=300_000, help="input records per run")
    parser.add_argument("--batch-size", type=int, default=5000, help="worker batch size")
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    command = "python bench/restart.py " + " ".join(argv if argv is not None else sys.argv[1:])
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-restart-") as scratch:
        tmp = Path(scratch)
        broker = stack.enter_context(KafkaBroker())
        warm_group_coordinator(broker.bootstrap)
        base = measure(broker, tmp, "empty", 0, args.records, args.batch_size)
        full = measure(broker, tmp, "full", args.keys, args.records, args.batch_size)
    print(f"\n$ {command}\n")
    print(
        f"{os.cpu_count()} CPUs; batch {args.batch_size}; from process start to the first commit\n"
    )
    print(f"| restart | empty store (baseline) | store of {full.keys:,} ids | ratio | target |")
    print("|---|---:|---:|---:|---|")
    for label, ours, baseline in (
        ("after SIGKILL between commit and store write", full.crash_s, base.crash_s),
        ("after SIGTERM (clean)", full.clean_s, base.clean_s),
    ):
        verdict = "met" if ours < TARGET_S else "**missed**"
        print(
            f"| {label} | {baseline:.2f} s | {ours:.2f} s | {ours / baseline:.2f}x "
            f"| < {TARGET_S:.0f} s {verdict} |"
        )
    print(f"\n(building the {full.keys:,}-id store took {full.build_s:.0f} s, not timed above)")
    bench_results.record_figures(
        args, [figure(full, base)], bench_results.bench_command("restart.py", argv)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
