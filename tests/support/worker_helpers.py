"""Helpers for the worker's integration tests: produce events, run a worker in-process
until it has consumed the input, and read back the ids in the output topic."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from confluent_kafka import Message, Producer

from dedup_contract.ids import ID_HEADER
from dedup_contract.window import WindowPolicy
from dedup_local import kafka
from dedup_local import worker as local_worker
from dedup_worker.config import WorkerConfig
from dedup_worker.loop import DedupWorker

_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def worker_config(bootstrap: str, tmp: Path, name: str, **overrides: Any) -> WorkerConfig:
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "input_topic": f"{name}-in",
        "output_topic": f"{name}-out",
        "dead_letter_topic": f"{name}-dlq",
        "partition": 0,
        "pipeline": name,
        "store_path": tmp / f"{name}-store",
        "window": WindowPolicy(duration_ms=24 * 3600 * 1000, max_keys=None),
        "batch_size": 500,
        "linger_ms": 50,
    }
    settings.update(overrides)
    return WorkerConfig(**settings)


def event(message_id: str, n: int = 0) -> bytes:
    return json.dumps({"messageId": message_id, "n": n, "pad": "x" * 200}).encode()


def produce(
    bootstrap: str,
    topic: str,
    values: Iterable[bytes | None],
    partition: int = 0,
    timestamps: Sequence[int] | None = None,
) -> int:
    """Produce values to one partition (with these timestamps, if given); flushed."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    records = (
        {"value": value, "partition": partition}
        | ({} if timestamps is None else {"timestamp": timestamps[i]})
        for i, value in enumerate(values)
    )
    return kafka.produce_all(producer, topic, records, timeout_s=60)


def run_until_consumed(worker: DedupWorker, total: int, timeout_s: float = 120) -> None:
    """Start the worker, process batches until `total` input records are consumed, close."""
    worker.start()
    consumed = 0
    deadline = time.monotonic() + timeout_s
    try:
        while consumed < total:
            assert time.monotonic() < deadline, f"worker consumed {consumed} of {total} in time"
            consumed += worker.process_batch().consumed
    finally:
        worker.close()


def drain(worker: DedupWorker, idle_s: float = 3.0, timeout_s: float = 120) -> int:
    """Process batches of a started worker until it has consumed nothing for `idle_s`."""
    consumed = 0
    deadline = time.monotonic() + timeout_s
    last_work = time.monotonic()
    while time.monotonic() - last_work < idle_s:
        assert time.monotonic() < deadline, "worker did not go idle in time"
        n = worker.process_batch().consumed
        consumed += n
        if n:
            last_work = time.monotonic()
    return consumed


def read_committed(bootstrap: str, topic: str, partition: int = 0) -> list[Message]:
    """Every committed record of one partition: an independent reader that shares
    nothing with the worker but the broker."""
    return kafka.read_committed(bootstrap, topic, [partition], timeout_s=60)


def output_ids(bootstrap: str, topic: str, partition: int = 0) -> list[str]:
    ids = []
    for msg in read_committed(bootstrap, topic, partition):
        header = dict(msg.headers() or []).get(ID_HEADER)
        assert header is not None, f"output record at offset {msg.offset()} lacks {ID_HEADER}"
        ids.append(header.decode())
    return ids


def payload_ids(messages: Iterable[Message]) -> list[str]:
    return [json.loads(m.value())["messageId"] for m in messages]


def start_worker(
    cfg: WorkerConfig, log_path: Path, metrics_port: int = 0, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A worker process for `cfg`, metrics off unless a port is given."""
    return local_worker.start_worker(replace(cfg, metrics_port=metrics_port), log_path, env)
