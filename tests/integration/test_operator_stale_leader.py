"""A deposed leader cannot overwrite its successor: status writes carry the pipeline's
resourceVersion (a 409 is a Conflict, nothing written) and the acting replica re-checks
its leadership before each mutating call.

Two operator replicas against the real control plane with the fake kubelets of
test_operator_failover. The first leader freezes itself (SIGSTOP, the test-only fault
point `operator-before-handover-record`) right after deciding to begin a handover and
before recording it; the other replica takes over the leader Lease and completes the
whole handover; then the frozen one is resumed (SIGCONT) in the middle of its stale
pass. Exactly one handover is started and completed, and the partition's handover record
is recorded once and never comes back after the stale replica resumed (every version of
the pipeline watched)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from dedup_contract import names
from dedup_local.kafka import KafkaBroker
from dedup_operator.kube import Conflict, Kube
from dedup_operator.leader import LEASE_NAME
from support.kafka_fixtures import NewTopic
from support.kube_fixtures import KubeCluster, KubeNamespace
from support.operator_helpers import (
    get_pipeline,
    reasons_once_posted,
    running_operator,
    wait_for,
)
from support.simulated_kubelets import Kubelets, entry, kubelets_in, pipeline, simulated_output

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]


@pytest.fixture
def kubelets(kube_namespace: KubeNamespace) -> Iterator[Kubelets]:
    with kubelets_in(kube_namespace.api_client, kube_namespace.name, "sl", 2) as k:
        k.create_volumes("events", 2)
        yield k


class Versions:
    """Every version of the pipeline, from a watch: (resourceVersion, p0's epoch,
    p0's handover reason or None)."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.seen: list[tuple[str, int | None, str | None]] = []
        self._custom = client.CustomObjectsApi(api)
        self._ns = ns
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Versions:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._watch.stop()
        self._thread.join(timeout=70)

    def _run(self) -> None:
        with contextlib.suppress(ProtocolError):  # the stream cut by stop()
            self._stream()

    def _stream(self) -> None:
        for ev in self._watch.stream(
            self._custom.list_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            self._ns,
            names.PLURAL,
            timeout_seconds=600,
        ):
            obj = ev["object"]
            p0 = next(
                (
                    e
                    for e in (obj.get("status") or {}).get("partitions") or []
                    if e.get("partition") == 0
                ),
                {},
            )
            self.seen.append(
                (
                    obj["metadata"]["resourceVersion"],
                    p0.get("epoch"),
                    (p0.get("handover") or {}).get("reason"),
                )
            )


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state T in /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def test_leader_frozen_mid_handover_and_resumed_overwrites_nothing(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kubelets: Kubelets,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api, ns = kube_namespace.api_client, kube_namespace.name
    kubeconfig = kube_namespace.kubeconfig_path
    leases = client.CoordinationV1Api(api)
    topic = new_topic(partitions=2)
    # TopicReady: the output, kept for ever (the window is maxKeys only)
    kafka.create_topic(simulated_output(topic, "events"), 2, {"retention.ms": "-1"})

    def holder() -> str | None:
        try:
            spec = leases.read_namespaced_lease(LEASE_NAME, ns).spec
        except ApiException:
            return None
        return spec.holder_identity if spec is not None else None

    versions = Versions(api, ns).start()
    monkeypatch.setenv("DEDUP_TEST_FAULTS", "operator-before-handover-record=1")
    a_ctx = running_operator(kubeconfig, ns, tmp_path / "a.log", interval=0.5)
    a = a_ctx.__enter__()
    monkeypatch.delenv("DEDUP_TEST_FAULTS")
    b_ctx = None
    try:
        first = wait_for(holder, 90, "a leader")
        assert first == a.identity(), first
        b_ctx = running_operator(kubeconfig, ns, tmp_path / "b.log", interval=0.5)
        b = b_ctx.__enter__()
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            ns,
            names.PLURAL,
            pipeline(kafka.bootstrap, topic, kubelets.label),
        )

        def ready() -> bool:
            p = get_pipeline(api, ns, "events") or {}
            return (p.get("status") or {}).get("readyPartitions") == 2

        wait_for(ready, 90, "both partitions Ready")
        assert not stopped(a.process.pid)
        lost = entry(api, ns, 0)["node"]
        kubelets.lose(lost)

        # the leader decides to begin the handover and freezes before recording it
        wait_for(lambda: stopped(a.process.pid), 60, "the leader frozen", every=0.1)
        frozen = time.monotonic()
        assert not entry(api, ns, 0).get("handover"), "frozen before the record was written"

        # the other replica takes over and does the whole handover
        wait_for(
            lambda: (h := holder()) is not None and h == b.identity(),
            60,
            "the standby to lead",
            every=0.2,
        )

        def moved() -> dict[str, Any] | None:
            e = entry(api, ns, 0)
            return e if e.get("ready") and e.get("node") != lost and not e.get("handover") else None

        after = wait_for(moved, 120, "partition 0 moved by the new leader", every=0.3)
        assert after["epoch"] == 2 and after["lastHandover"]["reason"] == "NodeLost"
        print(f"handover done by the new leader {time.monotonic() - frozen:.1f}s after the freeze")

        # the old leader resumes in the middle of its stale pass
        resumed_at = len(versions.seen)
        os.kill(a.process.pid, signal.SIGCONT)
        wait_for(
            lambda: "abandoned" in a.log(),
            60,
            "the resumed replica to abandon its stale pass",
            every=0.2,
        )
        time.sleep(3)  # a few more passes of both replicas
        assert a.process.poll() is None and b.process.poll() is None
    finally:
        if a.process.poll() is None:
            os.kill(a.process.pid, signal.SIGCONT)
        a_ctx.__exit__(None, None, None)
        if b_ctx is not None:
            b_ctx.__exit__(None, None, None)
        versions.stop()

    # The stale pass stopped at its next write: at the leadership check before it, or, had
    # it passed that check just before the freeze, at the API server (409 on the
    # resourceVersion it read).
    abandoned = [line for line in a.log().splitlines() if "abandoned" in line]
    assert abandoned
    for line in abandoned:
        print(line)
        assert "no longer the leader" in line or "changed since this pass read it" in line
    reasons = reasons_once_posted(api, ns, "events", "FailoverStarted", "FailoverCompleted")
    assert reasons.count("FailoverStarted") == 1, reasons
    assert reasons.count("FailoverCompleted") == 1, reasons
    print("versions (resourceVersion, p0 epoch, p0 handover):", versions.seen)
    # one handover record, begun once (by the new leader) and ended once
    begun = [b for a, b in itertools.pairwise(versions.seen) if a[2] is None and b[2] is not None]
    assert len(begun) == 1, versions.seen
    # after the resume, no version of the pipeline brings the stale decision back
    assert all(e == 2 and h is None for _, e, h in versions.seen[resumed_at:]), versions.seen
    final = entry(api, ns, 0)
    assert final["epoch"] == 2 and final["pod"] == "events-p0-e2"
    pods = client.CoreV1Api(api).list_namespaced_pod(ns).items
    assert sorted(p.metadata.name for p in pods) == ["events-p0-e2", "events-p1-e1"]


def test_status_write_on_a_changed_pipeline_is_a_conflict(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    """The API server honours the resourceVersion in a status merge patch: a write based
    on an older version is refused, whoever made the newer one."""
    api, ns = kube_namespace.api_client, kube_namespace.name
    custom = client.CustomObjectsApi(api)
    body = pipeline("127.0.0.1:1", "t", "dedup.io/none")
    body["metadata"]["name"] = "occ"
    created = custom.create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.PLURAL, body
    )
    kube = Kube(api)
    seen = created["metadata"]["resourceVersion"]
    mine = kube.patch_status(ns, "occ", {"phase": "Pending"}, resource_version=seen)
    assert mine != seen
    with pytest.raises(Conflict):  # a successor's write happened after what `seen` saw
        kube.patch_status(ns, "occ", {"phase": "Failed"}, resource_version=seen)
    with pytest.raises(Conflict):
        kube.set_finalizer(ns, "occ", "dedup.io/x", present=True, resource_version=seen)
    after = custom.get_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, "occ")
    assert after["status"]["phase"] == "Pending" and not after["metadata"].get("finalizers")
    assert kube.set_finalizer(ns, "occ", "dedup.io/x", present=True, resource_version=mine)
    with kube.acting(lambda: False):
        from dedup_operator.kube import NotLeader

        with pytest.raises(NotLeader):
            kube.patch_status(ns, "occ", {"phase": "Failed"})
    kube.set_finalizer(ns, "occ", "dedup.io/x", present=False)


def test_a_pod_delete_hits_only_the_incarnation_the_pass_observed(
    kube: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    """A pass deletes the pod it saw (its uid, a precondition the API server checks): a
    pod created since under the same name is left alone."""
    api, ns = kube_namespace.api_client, kube_namespace.name
    core = client.CoreV1Api(api)
    pod = {
        "metadata": {"name": "events-p0-e1"},
        "spec": {"containers": [{"name": "w", "image": "dedup.io/none"}]},
    }
    seen = core.create_namespaced_pod(ns, pod).metadata.uid
    core.delete_namespaced_pod("events-p0-e1", ns, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, 30, "the first incarnation gone")
    successor = core.create_namespaced_pod(ns, pod).metadata.uid
    k = Kube(api)
    assert not k.delete_pod(ns, "events-p0-e1", force=True, uid=seen)
    assert core.read_namespaced_pod("events-p0-e1", ns).metadata.uid == successor
    assert k.delete_pod(ns, "events-p0-e1", force=True, uid=successor)
    assert not k.delete_pod(ns, "events-p0-e1", force=True, uid=successor)  # gone: no error
