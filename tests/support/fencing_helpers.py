"""Helpers for the worker fencing tests: a steady input stream, waiting on a worker
process's log and exit, and reading its structured log lines."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer

from dedup_local import kafka as local_kafka
from support.worker_helpers import event


class Stream:
    """Produces events to partition 0 of `topic` from a thread, `chunk` every `pause_s`,
    until stopped (or `limit`), every tenth a repeat of the id five back: input that keeps
    coming while workers are fenced and replaced. `expected` is the exact output: first
    occurrences in input order."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        chunk: int = 250,
        pause_s: float = 0.2,
        limit: int = 200_000,
    ) -> None:
        self.ids: list[str] = []
        self._bootstrap, self._topic = bootstrap, topic
        self._chunk, self._pause_s, self._limit = chunk, pause_s, limit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream", daemon=True)

    @property
    def expected(self) -> list[str]:
        return list(dict.fromkeys(self.ids))

    def start(self) -> Stream:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60) -> None:
        """Stop after the chunk in hand; everything in `ids` is then in the topic."""
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the input stream did not stop"

    def _run(self) -> None:
        producer = Producer(
            {"bootstrap.servers": self._bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        while not self._stop.is_set() and len(self.ids) < self._limit:
            first = len(self.ids)
            part = [
                f"s{i - 5}" if i % 10 == 9 else f"s{i}" for i in range(first, first + self._chunk)
            ]
            for n, message_id in enumerate(part):
                producer.produce(self._topic, event(message_id, first + n), partition=0)
            assert producer.flush(30) == 0, "input not delivered"
            self.ids += part
            self._stop.wait(self._pause_s)


class Streams:
    """The streams of one test, all stopped when it ends (a failed assertion included)."""

    def __init__(self) -> None:
        self._started: list[Stream] = []

    def start(self, bootstrap: str, topic: str, **kw: Any) -> Stream:
        stream = Stream(bootstrap, topic, **kw).start()
        self._started.append(stream)
        return stream

    def __enter__(self) -> Streams:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in self._started:
            stream.stop()


def log_records(path: Path) -> list[dict[str, Any]]:
    """The JSON log lines of a worker's output (librdkafka's own lines are skipped)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def wait_for_log(path: Path, message: str, timeout_s: float = 60) -> dict[str, Any]:
    """The first JSON log record with this message, waiting for it to appear."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            for record in log_records(path):
                if record.get("message") == message:
                    return record
        time.sleep(0.1)
    raise AssertionError(f"no {message!r} in {path} within {timeout_s}s:\n{tail(path)}")


def wait_exit(proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"worker still running after {timeout_s}s:\n{tail(log)}") from None


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def fenced_lines(path: Path) -> list[dict[str, Any]]:
    return [r for r in log_records(path) if r.get("level") == "ERROR" and "fenced" in r["message"]]


def committed_input(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offset of partition 0; -1 while the broker cannot tell yet
    (a fresh broker answers NOT_COORDINATOR while it loads its offsets topic)."""
    try:
        return int(local_kafka.committed_offsets(bootstrap, group, topic, [0])[0])
    except KafkaException:
        return -1


def wait_committed(
    bootstrap: str, group: str, topic: str, offset: int, log: Path, timeout_s: float = 120
) -> None:
    """Until the group's committed input offset reaches `offset` (a worker consumed all)."""
    deadline = time.monotonic() + timeout_s
    while committed_input(bootstrap, group, topic) < offset:
        assert time.monotonic() < deadline, f"input not consumed to {offset}:\n{tail(log)}"
        time.sleep(0.3)


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except OSError:
        return 0
