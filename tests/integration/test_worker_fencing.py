"""A standalone worker fenced by a newer one on the same transactional id exits with the
documented code (3) and one log line, however the fence reaches it — here mostly while it
is producing a batch (`produce` answering `_FATAL`), as a new user running two workers by
hand saw it happen. Both run as real processes, their metrics on one port of two
loopback addresses."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dedup_local.paths import free_port
from dedup_worker.cli import EXIT_FENCED
from support.fencing_helpers import (
    Streams,
    fenced_lines,
    http_status,
    tail,
    wait_committed,
    wait_exit,
    wait_for_log,
)
from support.worker_helpers import output_ids, start_worker, unique, worker_config

pytestmark = pytest.mark.integration


@pytest.fixture
def streams() -> Iterator[Streams]:
    """Input streams started by the test, stopped at its end whatever happens."""
    with Streams() as started:
        yield started


def test_zombie_fenced_while_producing_exits_3_with_one_line(
    kafka: Any, tmp_path: Path, streams: Streams
) -> None:
    name = unique("fence")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    # Big batches: the old worker spends most of its time inside produce() calls.
    cfg = worker_config(kafka.bootstrap, tmp_path, name, batch_size=5000, linger_ms=200)
    stream = streams.start(kafka.bootstrap, cfg.input_topic, chunk=3000, pause_s=0.1)
    port = free_port()
    old_log, new_log = tmp_path / "old.log", tmp_path / "new.log"
    old = start_worker(replace(cfg, metrics_address="127.0.0.2"), old_log, metrics_port=port)
    new: subprocess.Popen[bytes] | None = None
    try:
        wait_for_log(old_log, "first transaction committed")
        # The replacement on its own (empty) volume: init_transactions fences the old one
        # at the broker; it rebuilds its window from the output topic.
        new_cfg = replace(cfg, store_path=tmp_path / "new-volume", metrics_address="127.0.0.3")
        new = start_worker(new_cfg, new_log, metrics_port=port)
        code = wait_exit(old, old_log, timeout_s=60)
        old_text = old_log.read_text(errors="replace")
        assert code == EXIT_FENCED, old_text
        assert "Traceback" not in old_text, old_text
        lines = fenced_lines(old_log)
        assert len(lines) == 1, old_text
        assert "another worker took over" in lines[0]["message"]
        assert lines[0]["exit_code"] == EXIT_FENCED
        print("old worker learned of the fence:", lines[0]["message"])

        # the new worker serves its probes on the same port of its own address
        wait_for_log(new_log, "worker ready")
        assert http_status(f"http://127.0.0.3:{port}/healthz") == 200, tail(new_log)
        stream.stop()
        wait_committed(kafka.bootstrap, cfg.group, cfg.input_topic, len(stream.ids), new_log)
    finally:
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                proc.terminate()
    assert new is not None and wait_exit(new, new_log, 30) == 0, tail(new_log)
    assert output_ids(kafka.bootstrap, cfg.output_topic) == stream.expected


def test_two_workers_serve_metrics_on_one_port_of_two_addresses(kafka: Any, tmp_path: Path) -> None:
    port = free_port()
    procs, logs = [], []
    try:
        for address in ("127.0.0.2", "127.0.0.3"):
            name = unique("addr")
            for suffix in ("in", "out", "dlq"):
                kafka.create_topic(f"{name}-{suffix}", 1)
            cfg = replace(worker_config(kafka.bootstrap, tmp_path, name), metrics_address=address)
            logs.append(tmp_path / f"{address}.log")
            procs.append(start_worker(cfg, logs[-1], metrics_port=port))
        for address, log in zip(("127.0.0.2", "127.0.0.3"), logs, strict=True):
            wait_for_log(log, "worker ready")
            deadline = time.monotonic() + 10
            while http_status(f"http://{address}:{port}/readyz") != 200:
                assert time.monotonic() < deadline, tail(log)
                time.sleep(0.1)
            assert http_status(f"http://{address}:{port}/metrics") == 200
    finally:
        for proc in procs:
            proc.terminate()
    for proc, log in zip(procs, logs, strict=True):
        assert wait_exit(proc, log, 30) == 0, tail(log)
