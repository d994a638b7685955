"""Clock skew changes nothing: real worker processes whose wall clocks are 30 s behind
and 30 s ahead (the test-only fault setting DEDUP_FAULT_CLOCK_SKEW_S, which shifts the
times a worker writes into its Lease), a real kube-apiserver and Kafka.

- worker A (epoch 1, clock -30 s) holds the Lease: its renewTime looks 30 s old, six
  Lease durations "expired" by anyone's wall clock. The operator's view (its own
  `LeaseClock` and `failover.partition_action`, as the reconcile loop runs them) never
  counts it expired and decides nothing while A renews;
- worker B (epoch 2, clock +30 s), started meanwhile, does not take the Lease (no early
  takeover): it waits for a full duration without a change, which never comes, and
  exits 3 when its acquire timeout runs out; A never notices and keeps committing;
- A is killed (no release): B, started again, takes the Lease only after a full
  duration seen unchanged on its own clock, after A is gone (no overlap). Its renewTime
  now looks 30 s in the future; the operator's view still counts from its changes;
- output exact. Short Leases (5 s) keep it quick (about 40 s)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dedup_contract.exit_codes import EXIT_FENCED
from dedup_contract.lease_clock import SKEW_ENV, LeaseClock
from dedup_operator.failover import (
    FailoverPolicy,
    NodeView,
    PartitionObservation,
    PodView,
    Steady,
    partition_action,
)
from dedup_operator.observed import lease_view
from dedup_worker.config import LeaseSettings, WorkerConfig
from support.fencing_helpers import (
    Streams,
    committed_input,
    fenced_lines,
    log_records,
    tail,
    wait_committed,
    wait_exit,
    wait_for_log,
)
from support.kube_fixtures import KubeNamespace
from support.worker_helpers import output_ids, start_worker, unique, worker_config

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]


@pytest.fixture
def streams() -> Iterator[Streams]:
    """Input streams started by the test, stopped at its end whatever happens."""
    with Streams() as started:
        yield started


LEASE_S = 5
SKEW_S = 30


def with_lease(cfg: WorkerConfig, epoch: int, kubeconfig: Path, **kw: Any) -> WorkerConfig:
    name = f"{cfg.pipeline}-p{cfg.partition}"
    lease = LeaseSettings(name, f"{name}-e{epoch}", epoch, LEASE_S, kubeconfig=kubeconfig, **kw)
    return replace(cfg, lease=lease)


class OperatorView:
    """What the operator's reconcile loop sees of the partition: the Lease through its
    own LeaseClock, and the decision for a healthy worker pod on a healthy node."""

    def __init__(self, leases: Any, namespace: str, name: str) -> None:
        self.leases, self.namespace, self.name = leases, namespace, name
        self.clock = LeaseClock()
        self.api = leases.api_client

    def look(self, holder_pod: str, epoch: int) -> tuple[Any, Any]:
        raw = self.leases.read_namespaced_lease(self.name, self.namespace)
        view = lease_view(self.api.sanitize_for_serialization(raw), self.clock)
        now = datetime.now(UTC)
        obs = PartitionObservation(
            partition=0,
            pods=(PodView(holder_pod, epoch, "node-a", "Running", ready=True),),
            nodes={"node-a": NodeView("node-a", "True", now - timedelta(hours=1))},
            lease=view,
            attachments=(),
            handover=None,
        )
        return raw, (view, partition_action(obs, FailoverPolicy(), now))


def test_skewed_worker_clocks_cause_no_early_takeover_and_no_overlap(
    kafka: Any, tmp_path: Path, kube_namespace: KubeNamespace, streams: Streams
) -> None:
    ns = kube_namespace.name
    leases = client.CoordinationV1Api(kube_namespace.api_client)
    name = unique("skew")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    base = replace(worker_config(kafka.bootstrap, tmp_path, name), namespace=ns)
    lease_name = f"{name}-p0"
    leases.create_namespaced_lease(
        ns,
        {
            "metadata": {"name": lease_name},
            "spec": {"leaseTransitions": 0, "leaseDurationSeconds": LEASE_S},
        },
    )
    kubeconfig = kube_namespace.kubeconfig_path
    behind, ahead = {SKEW_ENV: str(-SKEW_S)}, {SKEW_ENV: str(SKEW_S)}
    a_cfg = with_lease(base, 1, kubeconfig)
    a_log, b_log, b2_log = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "b2.log"
    view = OperatorView(leases, ns, lease_name)
    stream = streams.start(kafka.bootstrap, base.input_topic)

    a = start_worker(a_cfg, a_log, env=behind)
    b = b2 = None
    try:
        wait_for_log(a_log, "first transaction committed")
        # B (clock ahead) tries to take the Lease from A (clock behind) while A is healthy
        b_cfg = with_lease(
            replace(base, store_path=tmp_path / "b-store"),
            2,
            kubeconfig,
            acquire_timeout_s=3 * LEASE_S,
        )
        b = start_worker(b_cfg, b_log, env=ahead)
        a_offsets = []
        watched_until = time.monotonic() + 3 * LEASE_S
        while time.monotonic() < watched_until:
            raw, (seen, decision) = view.look(f"{lease_name}-e1", 1)
            # A's renewTime looks SKEW_S old: "expired" by any wall clock ...
            age = (datetime.now(UTC) - raw.spec.renew_time).total_seconds()
            assert age > SKEW_S - LEASE_S, age
            # ... but it keeps changing: never run out for the operator, nothing decided
            assert raw.spec.holder_identity == f"{lease_name}-e1", "early takeover"
            assert not seen.expired(), seen
            assert decision.action == Steady(), decision
            a_offsets.append(committed_input(kafka.bootstrap, base.group, base.input_topic))
            time.sleep(0.25)
        # B's acquire timeout runs from its own start, which a busy machine (the suite's
        # groups side by side) delays by seconds: what counts is how it ends, not when.
        assert wait_exit(b, b_log, 12 * LEASE_S) == EXIT_FENCED, tail(b_log)
        assert "not taken within" in " ".join(r["message"] for r in fenced_lines(b_log)), tail(
            b_log
        )
        assert a.poll() is None and not fenced_lines(a_log), tail(a_log)
        assert not any(r.get("message") == "took the Lease" for r in log_records(b_log))

        # A dies without releasing; B (clock ahead) takes over a full duration later
        a.send_signal(signal.SIGKILL)
        a.wait()
        killed = time.time()
        b2_cfg = with_lease(replace(base, store_path=tmp_path / "b2-store"), 2, kubeconfig)
        b2 = start_worker(b2_cfg, b2_log, env=ahead)
        started = time.time()
        took = wait_for_log(b2_log, "took the Lease", timeout_s=12 * LEASE_S)
        first = wait_for_log(b2_log, "first transaction committed")
        assert took["previous_holder"] == f"{lease_name}-e1"
        assert first["commit_sent"] >= started + LEASE_S - 0.5 > killed, (killed, started, first)
        # B's renewTime looks SKEW_S in the future; the operator counts from its changes
        watched_until = time.monotonic() + 2 * LEASE_S
        while time.monotonic() < watched_until:
            raw, (seen, decision) = view.look(f"{lease_name}-e2", 2)
            assert raw.spec.holder_identity == f"{lease_name}-e2"
            assert (raw.spec.renew_time - datetime.now(UTC)).total_seconds() > SKEW_S - LEASE_S
            assert not seen.expired() and decision.action == Steady(), (seen, decision)
            time.sleep(0.25)

        stream.stop()
        wait_committed(kafka.bootstrap, base.group, base.input_topic, len(stream.ids), b2_log)
        b2.terminate()
        assert wait_exit(b2, b2_log, 60) == 0, tail(b2_log)
        # released on a clean stop: free for the operator at once, whatever B's clock said
        _, (seen, _) = view.look(f"{lease_name}-e2", 2)
        assert seen.free and seen.expired()
    finally:
        for proc in (a, b, b2):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert output_ids(kafka.bootstrap, base.output_topic) == stream.expected
    assert max(a_offsets) > min(a_offsets), "A kept committing while B waited"
    print(
        f"A killed {killed:.2f}; B started {started:.2f}, first commit sent "
        f"{first['commit_sent']:.2f} ({first['commit_sent'] - killed:.2f}s after the kill)"
    )
