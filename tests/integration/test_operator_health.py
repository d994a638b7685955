"""The operator's /healthz and /readyz (the chart's probes) on real operator processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from dedup_operator.leader import LEASE_NAME
from support.kube_fixtures import KubeCluster, KubeNamespace
from support.operator_helpers import running_operator, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]


def test_leader_and_standby_are_both_live_and_ready(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace, tmp_path: Path
) -> None:
    ns = kube_namespace.name
    kubeconfig = kube_namespace.kubeconfig_path
    with (
        running_operator(kubeconfig, ns, tmp_path / "a.log") as a,
        running_operator(kubeconfig, ns, tmp_path / "b.log") as b,
    ):
        for op in (a, b):
            wait_for(lambda op=op: op.probe("/readyz")[0] == 200, 60, "/readyz 200")  # type: ignore[misc]
            assert op.probe("/readyz") == (200, "ready\n")
            assert op.probe("/healthz") == (200, "ok\n")
            assert op.probe("/nope")[0] == 404
            # the same port serves /metrics (--health-port == --metrics-port)
            assert "# TYPE dedup_operator_reconcile_seconds histogram" in op.metrics()
        leases = client.CoordinationV1Api(kube_namespace.api_client)

        def holder() -> str | None:
            spec = leases.read_namespaced_lease(LEASE_NAME, ns).spec
            return spec.holder_identity if spec is not None else None

        leader = wait_for(holder, 90, "a leader")
        assert leader in (a.identity(), b.identity())
        # the standby is Ready all the same (a rolling update counts it as available)
        standby = a if leader == b.identity() else b
        assert standby.probe("/readyz")[0] == 200
        assert "became leader" not in standby.log()
    assert a.process.returncode == 0 and b.process.returncode == 0


def test_a_health_port_in_use_fails_the_start(dedup_crd: KubeCluster, tmp_path: Path) -> None:
    """A port held by something else: the operator fails at once with one log line,
    instead of running without probes."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        log = tmp_path / "op.log"
        with running_operator(
            dedup_crd.kubeconfig_path,
            "default",
            log,
            extra=("--health-port", str(port), "--metrics-port", "0"),
        ) as op:
            code = op.process.wait(timeout=60)
        assert code == 1, op.log()
        assert "dedup-operator failed" in op.log() and "Traceback" not in op.log()
