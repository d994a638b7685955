"""Pause, don't die, with real processes: kube-apiserver really stopped for 30 s while
Lease-fenced workers deduplicate a steady input. Every worker pauses (not ready, still
alive, nothing committed) and none exits; when the API server is back on the same port
and etcd, each renews its Lease at its own epoch and commits again within seconds; an
independent read_committed reader finds the output exact.

The control plane is this module's own (etcd + kube-apiserver, no controllers): stopping
the session's shared API server would disturb every other test of the process."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dedup_local.control_plane import ControlPlane
from dedup_local.paths import free_port
from dedup_worker.config import LeaseSettings, WorkerConfig
from support.fencing_helpers import (
    Stream,
    Streams,
    committed_input,
    log_records,
    tail,
    wait_committed,
    wait_exit,
    wait_for_log,
)
from support.worker_helpers import output_ids, start_worker, unique, worker_config

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]

LEASE_S = 5  # renew deadline 3.3 s: paused well within the outage
OUTAGE_S = 30.0
WORKERS = 2
BACK_WITHIN_S = 5.0  # from /readyz answering again to each worker's next commit


@pytest.fixture(scope="module")
def control_plane() -> Iterator[ControlPlane]:
    plane = ControlPlane(with_controllers=False)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def streams() -> Iterator[Streams]:
    with Streams() as started:
        yield started


@dataclass
class Running:
    cfg: WorkerConfig
    log: Path
    proc: Any
    port: int
    stream: Stream

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def committed(self) -> int:
        return committed_input(self.cfg.bootstrap_servers, self.cfg.group, self.cfg.input_topic)


def start_one(
    kafka: Any, tmp_path: Path, plane: ControlPlane, leases: Any, streams: Streams
) -> Running:
    name = unique("outage")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    lease_name = f"{name}-p0"
    leases.create_namespaced_lease(
        "default",
        {"metadata": {"name": lease_name}, "spec": {"leaseTransitions": 0}},
    )
    cfg = worker_config(kafka.bootstrap, tmp_path, name, batch_size=1000)
    cfg = replace(
        cfg,
        namespace="default",
        lease=LeaseSettings(
            lease_name, f"{lease_name}-e1", 1, LEASE_S, kubeconfig=plane.kubeconfig_path
        ),
    )
    stream = streams.start(kafka.bootstrap, cfg.input_topic)
    log, port = tmp_path / f"{name}.log", free_port()
    proc = start_worker(cfg, log, metrics_port=port)
    return Running(cfg, log, proc, port, stream)


def wait_until(what: str, check: Any, timeout_s: float, workers: list[Running]) -> float:
    """Poll `check()` every 50 ms; the time it first held."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            logs = "\n\n".join(f"{w.log}:\n{tail(w.log, 15)}" for w in workers)
            raise AssertionError(f"{what} not within {timeout_s}s\n{logs}")
        time.sleep(0.05)
    return time.monotonic()


def test_workers_pause_through_an_api_server_outage_and_resume_exactly(
    kafka: Any, tmp_path: Path, control_plane: ControlPlane, streams: Streams
) -> None:
    api = control_plane.api_client()
    leases = client.CoordinationV1Api(api)
    workers = [start_one(kafka, tmp_path, control_plane, leases, streams) for _ in range(WORKERS)]
    try:
        for w in workers:
            wait_for_log(w.log, "first transaction committed")
        time.sleep(2)  # traffic flowing, the Lease renewed a few times

        control_plane.stop_apiserver()
        stopped = time.monotonic()
        for w in workers:
            wait_for_log(
                w.log,
                "paused: the Lease hold lapsed; no consuming or committing until it is renewed",
                timeout_s=LEASE_S,
            )
        paused_at = [w.committed() for w in workers]
        for w in workers:
            assert http_status(f"{w.url}/readyz") == 503, "paused: not ready"
            assert http_status(f"{w.url}/healthz") == 200, "paused: alive, no restart"
        remaining = OUTAGE_S - (time.monotonic() - stopped)
        time.sleep(max(0.0, remaining))
        assert [w.committed() for w in workers] == paused_at, "nothing committed while paused"
        assert all(w.proc.poll() is None for w in workers), "no worker exited"

        control_plane.start_apiserver()  # returns once /readyz answers
        back = time.monotonic()
        print(f"API server down {back - stopped:.1f}s")
        for w, before in zip(workers, paused_at, strict=True):
            at = wait_until(
                f"{w.cfg.pipeline} committing again",
                lambda w=w, before=before: w.committed() > before,
                BACK_WITHIN_S,
                workers,
            )
            print(f"{w.cfg.pipeline}: committing again {at - back:.2f}s after the API returned")
        for w in workers:
            assert http_status(f"{w.url}/readyz") == 200
            metrics = urlread(f"{w.url}/metrics")
            assert 'dedup_paused{partition="0"' in metrics
            assert sample(metrics, "dedup_paused") == 0
            # at least the outage's pause: with a 3.3 s renew deadline, a renewal slowed
            # by a starved CPU (a CI run at load 17) can add a pause of its own, which
            # ends the same way (resumed at our epoch, nothing fenced, checked below)
            assert sample(metrics, "dedup_pauses_total") >= 1
            assert sample(metrics, "dedup_fencing_events_total") == 0

        for w in workers:
            w.stream.stop()
            wait_committed(
                kafka.bootstrap, w.cfg.group, w.cfg.input_topic, len(w.stream.ids), w.log
            )
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.terminate()
    for w in workers:
        assert wait_exit(w.proc, w.log, 30) == 0, tail(w.log)
        messages = [r["message"] for r in log_records(w.log)]
        assert messages.count("worker ready") == 1, "never restarted"
        assert "resumed: the Lease is held again at our epoch" in messages
        assert not [r for r in log_records(w.log) if r.get("level") == "ERROR"], tail(w.log)
        assert output_ids(kafka.bootstrap, w.cfg.output_topic) == w.stream.expected
        assert w.cfg.lease is not None
        lease = leases.read_namespaced_lease(w.cfg.lease.name, "default")
        assert lease.spec.holder_identity == w.cfg.lease.holder_identity
        assert lease.spec.lease_transitions == 1
    api.close()  # type: ignore[no-untyped-call]


def http_status(url: str) -> int:
    """The status of a GET, 503 included (urllib raises it as an error)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def urlread(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def sample(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")
