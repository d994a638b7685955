"""A pipeline under ownership on the real broker, for the worker's integration tests:
its topics, its worker processes, a producer that says where each record went, and the
exactness check of the whole output.

The oracle is the broker and librdkafka, not our hash: where an id belongs is the
partition librdkafka's murmur2 partitioner (Java's default) delivered its keyed copy to
on a topic with as many partitions as workers; the output is read back by an independent
read_committed reader.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from dedup_contract.ids import ID_HEADER
from dedup_local import kafka as local_kafka
from dedup_local.paths import free_port
from dedup_local.pod_health import log_problems
from dedup_worker.config import WorkerConfig
from support.worker_helpers import start_worker, unique, worker_config

WORKERS = 2


def event(message_id: str, n: int) -> bytes:
    return json.dumps({"messageId": message_id, "n": n}).encode()


class Pipeline:
    """The topics of one pipeline under ownership and its worker processes."""

    def __init__(self, kafka: Any, tmp: Path, inputs: int, workers: int = WORKERS) -> None:
        self.bootstrap = kafka.bootstrap
        self.name = unique("own")
        self.workers = workers
        self.owned_topic = f"{self.name}-owned"
        kafka.create_topic(f"{self.name}-in", inputs)
        kafka.create_topic(f"{self.name}-out", workers)
        kafka.create_topic(f"{self.name}-dlq", 1)
        kafka.create_topic(self.owned_topic, workers)
        # a scratch topic with one partition per worker: where librdkafka's murmur2
        # partitioner puts a key there is where its id belongs
        kafka.create_topic(f"{self.name}-placement", workers)
        self.tmp = tmp
        self.log = tmp / f"{self.name}-workers.log"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.ports: dict[int, int] = {}

    def config(self, worker: int, **overrides: Any) -> WorkerConfig:
        settings: dict[str, Any] = {
            "partition": worker,
            "owned_topic": self.owned_topic,
            "workers": self.workers,
            "batch_size": 200,
            "linger_ms": 20,
        }
        return worker_config(self.bootstrap, self.tmp, self.name, **(settings | overrides))

    @property
    def input_topic(self) -> str:
        return f"{self.name}-in"

    @property
    def output_topic(self) -> str:
        return f"{self.name}-out"

    def start(self, worker: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        cfg = self.config(worker)
        cfg = replace(cfg, store_path=self.tmp / f"{self.name}-store-{worker}")
        self.ports[worker] = free_port()
        proc = start_worker(cfg, self.log, metrics_port=self.ports[worker], env=env)
        self.procs[worker] = proc
        return proc

    def start_all(self) -> None:
        for worker in range(self.workers):
            self.start(worker)

    def stop_all(self) -> None:
        for worker, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, f"worker {worker} exited {proc.returncode}"

    def metric(self, worker: int, name: str) -> float:
        url = f"http://127.0.0.1:{self.ports[worker]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
        found = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", body, re.MULTILINE)
        assert found, f"{name} not served by worker {worker}"
        return float(found.group(1))

    def placement(self, ids: Sequence[str]) -> dict[str, int]:
        """Where librdkafka's murmur2 partitioner puts each id among `workers`."""
        return produce(self.bootstrap, f"{self.name}-placement", ((i, i, None) for i in ids))

    def wait_settled(self, expected_ids: set[str], timeout_s: float = 180) -> list[Message]:
        """Until every input record and every forwarded one is committed by the workers
        and the output holds `expected_ids`; returns the output (all partitions)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for worker, proc in self.procs.items():
                assert proc.poll() is None, f"worker {worker} died; see {self.log}"
            out = self.output()
            if self.settled() and {output_id(m) for m in out} >= expected_ids:
                return out
            assert time.monotonic() < deadline, (
                f"not settled in time: {len({output_id(m) for m in out})} of {len(expected_ids)} ids"
            )
            time.sleep(1)

    def settled(self) -> bool:
        """Every record of the input and the internal topic is below the group's committed
        offset of its partition."""
        group = self.config(0).group
        for topic in (self.input_topic, self.owned_topic):
            records = local_kafka.read_committed(
                self.bootstrap, topic, list(range(self.partitions(topic))), settle_s=1
            )
            last: dict[int, int] = {}
            for m in records:
                last[m.partition()] = max(last.get(m.partition(), -1), m.offset())
            try:
                committed = local_kafka.committed_offsets(
                    self.bootstrap, group, topic, sorted(last)
                )
            except KafkaException:  # the group's coordinator moving or loading: ask again
                return False
            if any(c <= last[p] for p, c in zip(sorted(last), committed, strict=True)):
                return False
        return True

    def partitions(self, topic: str) -> int:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return len(admin.list_topics(topic, timeout=30).topics[topic].partitions)

    def output(self) -> list[Message]:
        return local_kafka.read_committed(
            self.bootstrap, self.output_topic, list(range(self.workers)), settle_s=1
        )

    def worker_log_problems(self) -> list[str]:
        return log_problems(self.log.read_text())


def output_id(m: Message) -> str:
    found = [v for k, v in m.headers() or [] if k == ID_HEADER]
    assert len(found) == 1 and found[0] is not None, f"output at {m.offset()}: {m.headers()}"
    return found[0].decode()


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[str, str, int | None]],
    partitioner: str = "murmur2_random",
) -> dict[str, int]:
    """Produce (id, key, partition or None for the partitioner's choice) records whose
    value is `event(id)`; returns the partition each id's last record was delivered to."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "partitioner": partitioner, "linger.ms": 5}
    )
    delivered: dict[str, int] = {}
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered[json.loads(msg.value())["messageId"]] = msg.partition()

    for n, (message_id, key, partition) in enumerate(records):
        fields: dict[str, Any] = {"key": key.encode(), "value": event(message_id, n)}
        if partition is not None:
            fields["partition"] = partition
        while True:
            try:
                producer.produce(topic, on_delivery=on_delivery, **fields)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0 and not errors, errors[:1]
    return delivered


def assert_exact(out: list[Message], placement: dict[str, int]) -> None:
    """Each id once across the whole output, on its owner's partition, with the record
    as it was produced (key, value) and only the id header added."""
    counts = Counter(output_id(m) for m in out)
    twice = [i for i, c in counts.items() if c > 1]
    assert not twice, f"{len(twice)} ids published more than once, e.g. {twice[:5]}"
    assert set(counts) == set(placement), (
        f"missing {sorted(set(placement) - set(counts))[:5]}, "
        f"unexpected {sorted(set(counts) - set(placement))[:5]}"
    )
    misplaced = [
        (output_id(m), m.partition()) for m in out if placement[output_id(m)] != m.partition()
    ]
    assert not misplaced, f"{len(misplaced)} ids on another worker's partition: {misplaced[:5]}"
    for m in out:
        message_id = output_id(m)
        assert m.key() == message_id.encode()
        assert json.loads(m.value())["messageId"] == message_id
        assert m.headers() == [(ID_HEADER, message_id.encode())], "forwarding headers stripped"
