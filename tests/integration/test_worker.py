"""The dedup worker against the real broker: exact output, zombie fencing, lost volume,
window expiry, dead letters and metrics."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dedup_contract.window import WindowPolicy
from dedup_local.paths import free_port
from dedup_worker.fencing import Fenced
from dedup_worker.loop import DLQ_OFFSET, DLQ_REASON, DedupWorker
from support.worker_helpers import (
    drain,
    event,
    output_ids,
    payload_ids,
    produce,
    read_committed,
    run_until_consumed,
    start_worker,
    unique,
    worker_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]


@pytest.fixture
def pipeline(kafka: Any, tmp_path: Path) -> Any:
    """A fresh pipeline name with its three topics (1 partition each)."""
    name = unique("wk")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    return name


def test_output_holds_each_id_once_in_input_order(
    kafka: Any, tmp_path: Path, pipeline: str
) -> None:
    cfg = worker_config(kafka.bootstrap, tmp_path, pipeline, batch_size=100)
    # duplicates inside one batch (a, a) and far apart (id-5 again after 1000 others)
    ids = ["a", "b", "a"] + [f"id-{i}" for i in range(1000)] + ["id-5", "b", "z", "id-999"]
    produce(kafka.bootstrap, cfg.input_topic, (event(i, n) for n, i in enumerate(ids)))
    run_until_consumed(DedupWorker(cfg), len(ids))

    expected = list(dict.fromkeys(ids))
    out = read_committed(kafka.bootstrap, cfg.output_topic)
    assert payload_ids(out) == expected
    assert output_ids(kafka.bootstrap, cfg.output_topic) == expected
    # the first occurrence is the one published, with its payload untouched
    assert json.loads(out[0].value())["n"] == 0
    assert json.loads(out[1].value())["n"] == 1


def test_restart_resumes_without_loss_or_duplicate(
    kafka: Any, tmp_path: Path, pipeline: str
) -> None:
    cfg = worker_config(kafka.bootstrap, tmp_path, pipeline)
    first = [f"m{i}" for i in range(300)]
    produce(kafka.bootstrap, cfg.input_topic, (event(i) for i in first))
    run_until_consumed(DedupWorker(cfg), len(first))
    second = [f"m{i}" for i in range(250, 400)]
    produce(kafka.bootstrap, cfg.input_topic, (event(i) for i in second))
    run_until_consumed(DedupWorker(cfg), len(second))
    assert output_ids(kafka.bootstrap, cfg.output_topic) == [f"m{i}" for i in range(400)]


def test_zombie_is_fenced_and_output_stays_exact(kafka: Any, tmp_path: Path, pipeline: str) -> None:
    cfg = worker_config(kafka.bootstrap, tmp_path, pipeline, batch_size=50)
    ids = [f"z{i}" for i in range(200)] * 2
    produce(kafka.bootstrap, cfg.input_topic, (event(i) for i in ids))

    old = DedupWorker(cfg)
    old.start()
    consumed = 0
    while consumed < 100:
        consumed += old.process_batch().consumed
    # A replacement starts for the same partition (on its own copy of the volume, as a
    # zombie on a partitioned node would keep the old one): init_transactions fences `old`.
    new_cfg = worker_config(
        kafka.bootstrap, tmp_path, pipeline, batch_size=50, store_path=tmp_path / "new-volume"
    )
    shutil.copytree(cfg.store_path, new_cfg.store_path)
    new = DedupWorker(new_cfg)
    new.start()
    with pytest.raises(Fenced, match="another worker took over"):
        for _ in range(100):
            old.process_batch()
    old.close()
    assert old.metrics.fencing_events._value.get() >= 1
    drain(new)
    new.close()
    assert output_ids(kafka.bootstrap, cfg.output_topic) == [f"z{i}" for i in range(200)]


def test_lost_volume_is_rebuilt_from_the_output_topic(
    kafka: Any, tmp_path: Path, pipeline: str
) -> None:
    cfg = worker_config(kafka.bootstrap, tmp_path, pipeline)
    produce(kafka.bootstrap, cfg.input_topic, (event(f"v{i}") for i in range(500)))
    run_until_consumed(DedupWorker(cfg), 500)
    shutil.rmtree(cfg.store_path)  # the volume is gone

    produce(kafka.bootstrap, cfg.input_topic, (event(f"v{i}") for i in range(400, 600)))
    rebuilt = DedupWorker(cfg)
    run_until_consumed(rebuilt, 200)
    assert rebuilt.metrics.recovered_ids._value.get() == 500
    assert output_ids(kafka.bootstrap, cfg.output_topic) == [f"v{i}" for i in range(600)]


def test_expired_id_passes_again_by_count(kafka: Any, tmp_path: Path, pipeline: str) -> None:
    cfg = worker_config(
        kafka.bootstrap,
        tmp_path,
        pipeline,
        window=WindowPolicy(duration_ms=None, max_keys=1000),
        batch_size=100,
    )
    ids = ["old"] + [f"f{i}" for i in range(3000)] + ["old", "f2999"]
    produce(kafka.bootstrap, cfg.input_topic, (event(i) for i in ids))
    worker = DedupWorker(cfg)
    run_until_consumed(worker, len(ids))
    out = output_ids(kafka.bootstrap, cfg.output_topic)
    assert out.count("old") == 2, "an id pushed out of the window by count is published again"
    assert out.count("f2999") == 1, "a recent id is still deduplicated"
    assert worker.metrics.expired_ids._value.get() > 0


def test_expired_id_passes_again_by_time(kafka: Any, tmp_path: Path, pipeline: str) -> None:
    hour = 3600 * 1000
    cfg = worker_config(
        kafka.bootstrap,
        tmp_path,
        pipeline,
        window=WindowPolicy(duration_ms=hour, max_keys=None),
        batch_size=1,  # expiry runs between batches; one batch would merge the repeats
    )
    t0 = int(time.time() * 1000) - 10 * hour
    ids = ["x", "y", "x", "late", "x", "y"]
    times = [t0, t0 + 1000, t0 + 2000, t0 + 3 * hour, t0 + 3 * hour + 1, t0 + 3 * hour + 2]
    produce(kafka.bootstrap, cfg.input_topic, (event(i) for i in ids), timestamps=times)
    run_until_consumed(DedupWorker(cfg), len(ids))
    assert output_ids(kafka.bootstrap, cfg.output_topic) == ["x", "y", "late", "x", "y"]


BAD_INPUT: list[tuple[bytes | None, str]] = [
    (b'{"messageId": "ok-1"}', ""),
    (b'{"messageId": ', "not_json"),
    (b'{"payload": 1}', "missing_id"),
    (bytes(range(256)), "not_utf8"),
    (json.dumps({"messageId": "x" * 10_000}).encode(), "id_too_long"),
    (b"", "empty_value"),
    (None, "null_value"),
    (b'{"messageId": null}', "id_null"),
    (b'{"messageId": ""}', "id_empty"),
    (b'{"messageId": {"a": 1}}', "id_not_scalar"),
    (b"[1, 2]", "not_object"),
    (json.dumps({"messageId": "ünïcødé-✓"}).encode(), ""),
    (json.dumps({"messageId": "ünïcødé-✓"}).encode(), ""),
    (b'{"messageId": 42}', ""),
]


def test_bad_input_goes_to_the_dead_letter_topic_with_reasons(
    kafka: Any, tmp_path: Path, pipeline: str
) -> None:
    cfg = worker_config(kafka.bootstrap, tmp_path, pipeline, batch_size=4)
    produce(kafka.bootstrap, cfg.input_topic, (v for v, _ in BAD_INPUT))
    worker = DedupWorker(cfg)
    run_until_consumed(worker, len(BAD_INPUT))

    assert output_ids(kafka.bootstrap, cfg.output_topic) == ["ok-1", "ünïcødé-✓", "42"]
    dead = read_committed(kafka.bootstrap, cfg.dead_letter_topic or "")
    expected = [(offset, reason) for offset, (_, reason) in enumerate(BAD_INPUT) if reason]
    got = sorted(
        (int(dict(m.headers())[DLQ_OFFSET]), dict(m.headers())[DLQ_REASON].decode()) for m in dead
    )
    assert [o for o, _ in got] == [o for o, _ in expected], "every bad record is dead-lettered once"
    assert {o: r for o, r in got}[1] == "not_json"
    assert got == expected, "each with the reason its defect deserves"
    by_offset = {int(dict(m.headers())[DLQ_OFFSET]): m for m in dead}
    assert by_offset[3].value() == bytes(range(256)), "the dead letter keeps the original bytes"


def test_cli_serves_metrics_and_probes_and_stops_on_sigterm(
    kafka: Any, tmp_path: Path, pipeline: str
) -> None:
    cfg = worker_config(kafka.bootstrap, tmp_path, pipeline)
    produce(kafka.bootstrap, cfg.input_topic, [event("a"), event("a"), event("b"), b"garbage"])
    port = free_port()
    proc = start_worker(cfg, tmp_path / "worker.log", metrics_port=port)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        body = ""
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"{base}/metrics", timeout=2).read().decode()
                if (
                    'dedup_records_in_total{partition="0"' in body
                    and "dedup_records_in_total{" in body
                    and " 4.0" in _line(body, "dedup_records_in_total")
                ):
                    break
            except OSError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail(
                f"metrics never showed 4 records in:\n{body}\n{(tmp_path / 'worker.log').read_text()}"
            )
        for series in (
            "dedup_records_out_total",
            "dedup_duplicates_total",
            "dedup_dead_letters_total",
            "dedup_batch_commit_seconds_bucket",
            "dedup_store_keys",
            "dedup_store_bytes",
            "dedup_expired_ids_total",
            "dedup_transactions_total",
            "dedup_consumer_lag",
            "dedup_recovery_seconds",
            "dedup_window_age_seconds",
            "dedup_fencing_events_total",
        ):
            assert series in body, series
        assert " 2.0" in _line(body, "dedup_records_out_total")
        assert " 1.0" in _line(body, "dedup_duplicates_total")
        assert 'reason="not_json"' in body
        assert float(_line(body, "dedup_store_bytes").split()[-1]) > 0
        assert urllib.request.urlopen(f"{base}/healthz", timeout=2).status == 200
        assert urllib.request.urlopen(f"{base}/readyz", timeout=2).status == 200
    finally:
        proc.terminate()
        code = proc.wait(timeout=30)
    log = (tmp_path / "worker.log").read_text()
    assert code == 0, log
    assert "stopped cleanly" in log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(rec["message"] == "worker ready" for rec in lines), "structured JSON logs"


def _line(body: str, name: str) -> str:
    return next((line for line in body.splitlines() if line.startswith(name + "{")), "")


def test_worker_starts_on_a_broker_that_just_started(
    kafka_broker_factory: Any, tmp_path: Path
) -> None:
    # A fresh broker answers NOT_COORDINATOR while it loads its offsets topic; the
    # worker's first committed-offset lookup must wait that out, not crash.
    broker = kafka_broker_factory()
    for suffix in ("in", "out", "dlq"):
        broker.create_topic(f"fresh-{suffix}", 1)
    cfg = worker_config(broker.bootstrap, tmp_path, "fresh")
    produce(broker.bootstrap, cfg.input_topic, (event(f"f{i}") for i in range(50)))
    run_until_consumed(DedupWorker(cfg), 50)
    assert output_ids(broker.bootstrap, cfg.output_topic) == [f"f{i}" for i in range(50)]
