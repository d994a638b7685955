"""The bare exactly-once copy: the cheapest exactly-once pass a worker could make over one
input partition, as the baseline of `bench/worker_throughput.py --bare-copy` (issue 52).

A process of its own on the same confluent-kafka as the worker, with the worker's batch
and linger defaults: read_committed batches of up to 5,000 records, every record produced
to the output (same key and value, same partition number), the consumed offsets sent to
the transaction, the transaction committed. No id parsing, no store, no dead letters:
what dedup adds is what the worker does beyond this.

`--pipelined` overlaps, as the worker does, the commit of batch N (in a thread: the call
waits on the broker with the GIL released) with the consuming of batch N+1; batch N+1's
transaction begins once N's is committed. Without it each batch waits for its commit, as
issue 52 defines the copy. The pipelined copy is the stricter baseline.

    python bench/peers/bare_copy.py --bootstrap HOST:PORT --input T --output T --group G
                                    [--batch-size 5000] [--linger-ms 20] [--pipelined]

Runs until SIGTERM (as the worker, it ends after the batch in hand) and prints one JSON
line with its counts.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--linger-ms", type=int, default=20)
    parser.add_argument("--pipelined", action="store_true", help="commit N while consuming N+1")
    args = parser.parse_args(argv)

    stop = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": f"{args.group}-{args.partition}",
            "linger.ms": args.linger_ms,
        }
    )
    producer.init_transactions(60)
    consumer.assign([TopicPartition(args.input, args.partition)])
    copied = batches = 0
    committer = ThreadPoolExecutor(1, thread_name_prefix="commit")
    committing: Future[None] | None = None
    while not stop:
        records = consumer.consume(args.batch_size, 0.5)
        records = [r for r in records if r.error() is None or _fatal(r.error())]
        if not records:
            continue
        if committing is not None:
            committing.result()  # the previous transaction ends before this one begins
        producer.begin_transaction()
        for record in records:
            producer.produce(args.output, record.value(), record.key(), partition=args.partition)
            producer.poll(0)
        last = records[-1]
        offsets = [TopicPartition(args.input, args.partition, last.offset() + 1)]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 60)
        if args.pipelined:
            committing = committer.submit(producer.commit_transaction, 60)
        else:
            producer.commit_transaction(60)
        copied += len(records)
        batches += 1
    if committing is not None:
        committing.result()
    committer.shutdown()
    consumer.close()
    print(json.dumps({"copied": copied, "batches": batches, "stopped": time.time()}))
    return 0


def _fatal(error: KafkaError) -> bool:
    if error.code() == KafkaError._PARTITION_EOF:
        return False
    raise SystemExit(f"bare copy: {error}")


if __name__ == "__main__":
    sys.exit(main())
