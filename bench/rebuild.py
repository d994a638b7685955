"""Rebuilding a lost store from the output topic, against reading that topic alone.

    python bench/rebuild.py [--records 2000000] [--repeat 2]

A worker whose volume was lost starts with an empty store and rebuilds the window from
what it already published (`dedup_worker.recovery.catch_up`, the start-up path: a
read_committed consumer over the output partition from `now - window`, each record's id
header into the store). This times exactly that call over an output partition of
`--records` published records (300-byte values, one id each, as the worker writes
them), into a fresh `Store` on local disk.

Baseline in the same invocation: the same consumer settings reading the same partition
to its end and taking each record's id header, with no store: what the read alone
costs. The ratio is the store's share of a rebuild. Runs alternate (baseline, ours,
baseline, ours, ...) so a change in the machine's load shows in both.

The rebuild rate is an input of the capacity plan (`bench/capacity.py`): the time a
partition needs to come back after its volume is lost.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import results as bench_results
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from dedup_contract.ids import ID_HEADER
from dedup_contract.store import Store, StoreOwner
from dedup_contract.window import WindowPolicy
from dedup_local.kafka import KafkaBroker, produce_all
from dedup_worker.recovery import catch_up

TOPIC = "rebuild-out"
VALUE = b"x" * 300
WEEK_MS = 7 * 24 * 3600 * 1000


def progress(text: str) -> None:
    print(f"[bench] {text}", flush=True)


def published(records: int) -> Iterator[dict[str, Any]]:
    """Output records as the worker writes them: key and id header = the message id."""
    for n in range(records):
        message_id = f"evt-{n:012d}".encode()
        yield {
            "key": message_id,
            "value": VALUE,
            "partition": 0,
            "headers": [(ID_HEADER, message_id)],
        }


def publish(bootstrap: str, records: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
         "compression.type": "lz4"}
    )  # fmt: skip
    produce_all(producer, TOPIC, published(records), timeout_s=300)


def consumer_settings(bootstrap: str, group: str) -> dict[str, object]:
    """The worker's own catch-up consumer settings (`SourceReader.settings`, worker/dedup_worker/sources.py)."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "fetch.max.bytes": 52_428_800,
        "max.partition.fetch.bytes": 10_485_760,
        "queued.min.messages": 100_000,
    }


def read_only(bootstrap: str, run: int) -> tuple[float, int]:
    """The baseline: read the partition to its end, taking each record's id header."""
    consumer = Consumer(consumer_settings(bootstrap, f"rebuild-read-{run}"))
    try:
        started = time.perf_counter()
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        ids = 0
        done = False
        while not done:
            for msg in consumer.consume(20_000, 0.1):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True
                        continue
                    raise KafkaException(err)
                for name, value in msg.headers() or ():
                    if name == ID_HEADER and value is not None:
                        ids += 1
                        break
        return time.perf_counter() - started, ids
    finally:
        consumer.close()


def rebuild(bootstrap: str, run: int, scratch: Path) -> tuple[float, int]:
    """Ours: the worker's catch-up into an empty store, over the window."""
    path = scratch / f"store-{run}"
    window = WindowPolicy(duration_ms=WEEK_MS, max_keys=None)
    store = Store.open(path, StoreOwner("bench", "rebuild", 0), window)
    consumer = Consumer(consumer_settings(bootstrap, f"rebuild-store-{run}"))
    try:
        started = time.perf_counter()
        result = catch_up(store, consumer, TOPIC, 0, int(time.time() * 1000) - WEEK_MS)
        seconds = time.perf_counter() - started
        if not result.rebuilt:
            raise RuntimeError("catch-up did not rebuild an empty store")
        return seconds, result.ids
    finally:
        consumer.close()
        store.close()
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=2_000_000, help="published records")
    parser.add_argument("--repeat", type=int, default=2, help="alternating runs of each")
    bench_results.add_arguments(parser)
    args = parser.parse_args(argv)
    command = "python bench/rebuild.py " + " ".join(argv if argv is not None else sys.argv[1:])
    ours: list[tuple[float, int]] = []
    base: list[tuple[float, int]] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-rebuild-") as tmp:
        broker = stack.enter_context(KafkaBroker())
        broker.create_topic(TOPIC, 1)
        progress(f"publishing {args.records:,} records to {TOPIC}")
        publish(broker.bootstrap, args.records)
        load = os.getloadavg()[0]
        for run in range(args.repeat):
            base.append(read_only(broker.bootstrap, run))
            progress(f"read alone, run {run + 1}: {base[-1][0]:.2f} s")
            ours.append(rebuild(broker.bootstrap, run, Path(tmp)))
            progress(f"rebuild, run {run + 1}: {ours[-1][0]:.2f} s")
        load_end = os.getloadavg()[0]
    for _, ids in (*ours, *base):
        if ids != args.records:
            raise SystemExit(f"bench: {ids:,} ids read, {args.records:,} published")
    ours_rate = statistics.median(args.records / s for s, _ in ours)
    base_rate = statistics.median(args.records / s for s, _ in base)
    print(f"\n$ {command}\n")
    print(
        f"{os.cpu_count()} CPUs; {args.records:,} published records of 300 bytes, one partition;"
        f" median of {args.repeat} alternating runs; load average {load:.1f} -> {load_end:.1f}\n"
    )
    print("| | ids/s | runs (s) |")
    print("|---|---:|---|")
    print(
        f"| rebuild: catch-up into an empty store (ours) | {ours_rate:,.0f} | "
        + ", ".join(f"{s:.2f}" for s, _ in ours)
        + " |"
    )
    print(
        f"| read alone, id headers taken (baseline) | {base_rate:,.0f} | "
        + ", ".join(f"{s:.2f}" for s, _ in base)
        + " |"
    )
    print(f"\nrebuild / read alone: {ours_rate / base_rate:.2f}x")
    figure = bench_results.Figure(
        "rebuild",
        "rebuilding a lost store",
        f"{ours_rate:,.0f} ids/s, {ours_rate / base_rate:.2f}x the bare read ({base_rate:,.0f}/s) "
        f"(load {min(load, load_end):.1f}-{max(load, load_end):.1f})",
        "none",
    )
    bench_results.record_figures(args, [figure], bench_results.bench_command("rebuild.py", argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
