"""An upgrade a team can trust (issue 50), on real nodes, under traffic from start to end:
the previous release (versions.env: its chart, and its image built from its commit by the
same cached build, dedup_local.previous_release) installed with its own CRD and a pipeline
of 3 workers; `helm upgrade` to this commit's chart and image; `helm rollback` before
finalize, the old workers opening the stores the new ones wrote; the upgrade again;
`dedupctl finalize-upgrade`; then a rollback refused by the guard while the pipeline keeps
serving. The output is exact across all of it; the CRD's objects created at v1alpha1 end
stored at v1beta1; the pause in output per partition is printed for each roll.

The worker image is a field of each pipeline (the API server stores its default when the
pipeline is created), so `helm upgrade` moves the operator and each pipeline's workers
move when its spec.worker.image does: the second step of the upgrade, as the CHANGELOG
says (docs/operations.md, "Upgrading").

On the session's real-node cluster (`local_cluster`), as every test of the local-cluster
group; it replaces the CRD with the previous release's first and leaves this commit's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from kubernetes import client

from dedup_contract import names
from dedup_contract.release import VERSION
from dedup_local.chart import CHART, helm
from dedup_local.kafka import KafkaBroker
from dedup_local.pod_health import unhealthy
from dedup_local.previous_release import ensure_previous_release
from dedup_local.real_cluster import RealCluster
from support.operator_helpers import (
    delete_every_pipeline,
    drop_finalizers,
    get_pipeline,
    wait_for,
)
from support.pipeline_traffic import Traffic, assert_output_exact, ready_pipeline
from support.pipelines import cluster_pipeline_body

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("local-cluster")]

RELEASE, NAMESPACE, PIPELINE, WORKERS = "dedup-operator", "dedup-system", "events", 3
OPERATOR_SELECTOR = f"app.kubernetes.io/name={RELEASE}"
WORKER_SELECTOR = f"{names.LABEL_PIPELINE}={PIPELINE},{names.LABEL_COMPONENT}=worker"
NEW_IMAGE = "localhost/dedup-operator:dev"  # as each node's containerd holds it
RELEASED_CRD = CHART.parents[1] / "crds" / "released"


def helm_on(cluster: RealCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return helm(*args, "--kubeconfig", str(cluster.kubeconfig_path), timeout=330, check=False)


def must(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def image_values(repository_tag: str) -> list[str]:
    repository, tag = repository_tag.rsplit(":", 1)
    sets = [f"image.repository={repository}", f"image.tag={tag}", "image.pullPolicy=Never"]
    return [arg for value in sets for arg in ("--set", value)]


class OutputWatch:
    """Reads the output topic (read_committed) in a thread and notes when each record
    arrived, per partition: the pause of a roll is the longest gap between arrivals on a
    partition while it ran (the traffic sends to every partition every 0.2 s)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.arrivals: dict[int, list[float]] = {p: [] for p in range(partitions)}
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"upgrade-watch-{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.consume(500, 0.2):
                if message.error() is None:
                    self.arrivals[message.partition()].append(time.monotonic())

    def pauses(self, since: float, until: float) -> dict[int, float]:
        """Per partition, the longest time without output within [since, until]."""
        out = {}
        for p, times in self.arrivals.items():
            inside = [since, *[t for t in times if since <= t <= until], until]
            out[p] = max(b - a for a, b in itertools.pairwise(inside))
        return out

    @contextlib.contextmanager
    def running(self) -> Iterator[OutputWatch]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(10)
            self._consumer.close()


class LeadershipWatch:
    """Samples, every 0.3 s, who holds the operator's Lease and which release last
    reconciled the pipeline (status.operatorVersion): during the upgrade the new release's
    first status write must come from a replica that holds the Lease, never while an old
    replica does."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.api, self.ns = api, ns
        self.samples: list[tuple[float, str, str | None]] = []  # (when, holder, version)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        leases = client.CoordinationV1Api(self.api)
        while not self._stop.wait(0.3):
            with contextlib.suppress(Exception):
                # the status first: the Lease read after it names a holder at least as
                # late as the write (a Lease changing hands in between is seen by the next)
                found = get_pipeline(self.api, self.ns, PIPELINE) or {}
                version = (found.get("status") or {}).get("operatorVersion")
                lease = leases.read_namespaced_lease("dedup-operator-leader", NAMESPACE)
                holder = lease.spec.holder_identity or ""
                self.samples.append((time.monotonic(), holder, version))

    def first_new_write_holder(self, release: str) -> str | None:
        """The Lease's holder when status.operatorVersion first read `release`."""
        return next((holder for _, holder, v in self.samples if v == release), None)

    @contextlib.contextmanager
    def running(self) -> Iterator[LeadershipWatch]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(10)


def live(api: client.ApiClient, namespace: str, selector: str) -> list[Any]:
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector)
    return [p for p in pods.items if not p.metadata.deletion_timestamp]


def set_worker_image(cluster: RealCluster, ns: str, image: str) -> None:
    patch = {"spec": {"worker": {"image": image}}}
    cluster.kubectl("patch", "deduppipeline", PIPELINE, "-n", ns, "--type", "merge",
                    "-p", json.dumps(patch))  # fmt: skip


def rolled(
    cluster: RealCluster, ns: str, image: str, check: Callable[[Any], bool] = lambda pod: True
) -> None:
    """Wait until every worker runs `image` (and passes `check`), Ready, one per partition."""
    api = cluster.api_client()

    def done() -> bool:
        pods = live(api, ns, WORKER_SELECTOR)
        return (
            len(pods) == WORKERS
            and all(p.spec.containers[0].image == image and check(p) for p in pods)
            and all(
                p.status.container_statuses and all(s.ready for s in p.status.container_statuses)
                for p in pods
            )
        )

    try:
        wait_for(done, 420, f"every worker on {image}", every=2)
    except AssertionError:
        print(cluster.kubectl("get", "pods,events", "-n", ns, "-o", "wide").stdout)
        print(json.dumps((get_pipeline(api, ns, PIPELINE) or {}).get("status"), indent=1))
        raise
    ready_pipeline(api, ns, PIPELINE, WORKERS)


def operator_on(cluster: RealCluster, image: str) -> None:
    """The operator Deployment rolled out with `image` (every replica)."""
    cluster.kubectl("rollout", "status", "-n", NAMESPACE, f"deployment/{RELEASE}",
                    "--timeout=240s", timeout=260)  # fmt: skip
    api = cluster.api_client()
    wait_for(
        lambda: (
            {p.spec.containers[0].image for p in live(api, NAMESPACE, OPERATOR_SELECTOR)} == {image}
        ),
        120,
        f"the operator pods on {image}",
    )


def replace_crd_with(cluster: RealCluster, path: Any) -> None:
    """The DedupPipeline CRD as the previous release installed it: every pipeline of the
    cluster deleted first (finalizers dropped: no operator runs), the CRD deleted, the
    released one created."""
    delete_every_pipeline(cluster.api_client())
    cluster.kubectl("delete", "crd", names.CRD_NAME, "--ignore-not-found", "--wait=true",
                    timeout=120)  # fmt: skip
    cluster.kubectl("create", "-f", str(path))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{names.CRD_NAME}",
                    "--timeout=60s")  # fmt: skip


def stored_versions(cluster: RealCluster) -> list[str]:
    crd = json.loads(cluster.kubectl("get", "crd", names.CRD_NAME, "-o", "json").stdout)
    return list(crd["status"]["storedVersions"])


def dedupctl(cluster: RealCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dedupctl.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path)},
        timeout=60,
        check=False,
    )


def test_upgrade_rollback_finalize_under_traffic(
    local_cluster: RealCluster, kafka_broker_factory: Callable[..., KafkaBroker]
) -> None:
    cluster = local_cluster
    api = cluster.api_client()
    previous = ensure_previous_release()
    old_image = previous.node_tags[0]
    print(f"previous release {previous.version} ({previous.commit[:12]}): {old_image}")
    replace_crd_with(cluster, RELEASED_CRD / previous.version / "dedup.io_dedupPipelines.yaml")
    assert stored_versions(cluster) == ["v1alpha1"]

    broker = kafka_broker_factory(host=cluster.broker_host)
    topic = f"upgrade-{uuid.uuid4().hex[:8]}"
    for name in (topic, f"{topic}-out", f"{topic}-dlq"):
        broker.create_topic(name, WORKERS)
    ns = f"upgrade-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    local_values = ["--set", "operator.bindPodIP=false"]
    timings: dict[str, float] = {}
    pauses: dict[str, dict[int, float]] = {}
    try:
        # The previous release, as its users run it: its chart (CRD from its crds/, here
        # already applied) and its image, a pipeline of 3 workers created at v1alpha1.
        t0 = time.monotonic()
        must(helm_on(cluster, "install", RELEASE, str(previous.chart), "--namespace", NAMESPACE,
                     "--create-namespace", *image_values(old_image), *local_values,
                     "--wait", "--timeout", "300s"))  # fmt: skip
        timings[f"helm install {previous.version}"] = time.monotonic() - t0
        body = cluster_pipeline_body(
            PIPELINE, broker.bootstrap, topic, cluster.storage_class, WORKERS,
            worker={"batchSize": 200, "lingerMs": 20, "image": old_image},
        )  # fmt: skip
        body["apiVersion"] = f"{names.GROUP}/v1alpha1"
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
        ready_pipeline(api, ns, PIPELINE, WORKERS)

        traffic = Traffic(broker.bootstrap, topic, WORKERS)
        watch = OutputWatch(broker.bootstrap, f"{topic}-out", WORKERS)
        with traffic.running(), watch.running():
            wait_for(lambda: traffic.sent > 1000, 60, "traffic before the upgrade")

            def step(what: str, action: Callable[[], None]) -> None:
                started = time.monotonic()
                action()
                ended = time.monotonic()
                timings[what] = ended - started
                sent = traffic.sent
                wait_for(lambda: traffic.sent > sent + 300, 60, f"traffic after: {what}")
                time.sleep(3)  # the output of the last batches, before the pauses are read
                pauses[what] = watch.pauses(started, ended)

            def upgrade() -> None:
                must(helm_on(cluster, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
                             "--take-ownership", *image_values(NEW_IMAGE), *local_values,
                             "--wait", "--timeout", "300s"))  # fmt: skip
                operator_on(cluster, NEW_IMAGE)
                set_worker_image(cluster, ns, NEW_IMAGE)
                rolled(cluster, ns, NEW_IMAGE, made_by(VERSION))

            # 1. The upgrade: the operator, then each worker, one partition at a time. The
            # old operator pods' names: none of them may hold the Lease when the new
            # release's first status write lands.
            old_operators = {p.metadata.name for p in live(api, NAMESPACE, OPERATOR_SELECTOR)}
            with LeadershipWatch(api, ns).running() as leadership:
                step(f"upgrade {previous.version} -> {VERSION}", upgrade)
            holder = leadership.first_new_write_holder(VERSION)
            new_operators = {p.metadata.name for p in live(api, NAMESPACE, OPERATOR_SELECTOR)}
            print(f"the Lease when {VERSION} first wrote the status: {holder}")
            assert holder is not None, leadership.samples[-5:]
            assert any(holder.startswith(f"{pod}-") for pod in new_operators), (
                holder,
                new_operators,
            )
            assert not any(holder.startswith(f"{pod}-") for pod in old_operators)
            found = get_pipeline(api, ns, PIPELINE) or {}
            assert found["status"]["operatorVersion"] == VERSION
            # The CRD: created at v1alpha1, served at both, stored at v1beta1 once the
            # new operator rewrote it and pruned storedVersions.
            wait_for(lambda: stored_versions(cluster) == ["v1beta1"], 90, "storedVersions pruned")
            for version in ("v1alpha1", "v1beta1"):
                got = client.CustomObjectsApi(api).get_namespaced_custom_object(
                    names.GROUP, version, ns, names.PLURAL, PIPELINE
                )
                assert got["apiVersion"] == f"{names.GROUP}/{version}"
                assert got["spec"]["partitions"] == WORKERS
                annotations = got["metadata"].get("annotations") or {}
                assert annotations.get(names.ANNOTATION_STORED_VERSION) == "v1beta1"

            # 2. Back before finalize: the old operator, then the old workers, which open
            # the stores the new ones wrote (still format 2).
            def rollback() -> None:
                must(helm_on(cluster, "rollback", RELEASE, "1", "--namespace", NAMESPACE,
                             "--wait", "--timeout", "300s"))  # fmt: skip
                operator_on(cluster, old_image)
                set_worker_image(cluster, ns, old_image)
                rolled(cluster, ns, old_image)

            step(f"rollback {VERSION} -> {previous.version}", rollback)
            kept = get_pipeline(api, ns, PIPELINE) or {}
            assert kept["status"].get("operatorVersion") == VERSION, (
                "the old operator keeps the status fields it does not know"
            )
            assert unhealthy(cluster, ns, WORKER_SELECTOR) == [], "old workers on new stores"

            # 3. Forward again, then finalize: the workers roll with DEDUP_FINALIZED.
            step(f"upgrade again {previous.version} -> {VERSION}", upgrade)
            refused = dedupctl(cluster, "finalize-upgrade", PIPELINE, "-n", ns)
            assert refused.returncode == 2 and "add --yes" in refused.stderr, refused
            finalized = dedupctl(cluster, "finalize-upgrade", PIPELINE, "-n", ns, "--yes")
            assert finalized.returncode == 0, finalized.stderr
            print(finalized.stdout)
            step(
                "finalize (workers roll to format 3)",
                lambda: rolled(cluster, ns, NEW_IMAGE, finalized_env),
            )

            # 4. A rollback now is refused by the guard, and the new release keeps serving.
            t0 = time.monotonic()
            denied = helm_on(cluster, "rollback", RELEASE, "1", "--namespace", NAMESPACE,
                             "--wait", "--timeout", "120s")  # fmt: skip
            timings["rollback refused"] = time.monotonic() - t0
            assert denied.returncode != 0, denied.stdout
            assert "StoreTooNew" in denied.stderr and previous.version in denied.stderr, (
                denied.stderr
            )
            print(f"helm rollback after finalize: {denied.stderr.strip().splitlines()[-1]}")
            operator_on(cluster, NEW_IMAGE)
            sent = traffic.sent
            wait_for(lambda: traffic.sent > sent + 300, 60, "traffic after the refusal")
        t0 = time.monotonic()
        assert_output_exact(broker.bootstrap, topic, traffic)
        print(f"sent {traffic.sent} records ({traffic.duplicates} duplicates); output exact "
              f"across every step, checked in {time.monotonic() - t0:.1f}s")  # fmt: skip
        for what, by_partition in pauses.items():
            print(f"pause in output, {what}: "
                  + ", ".join(f"p{p} {s:.1f}s" for p, s in sorted(by_partition.items()))
                  + f"; took {timings[what]:.0f}s in all")  # fmt: skip
        print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
        # Health of what this release runs: 0 restarts, no ERROR line, no permission warning.
        assert unhealthy(cluster, NAMESPACE, OPERATOR_SELECTOR) == []
        assert unhealthy(cluster, ns, WORKER_SELECTOR) == []
    finally:
        with contextlib.suppress(Exception):
            for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
                cluster.kubectl("delete", kind, "dedup-operator-finalized", "--ignore-not-found")
        helm_on(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        for item in (client.CustomObjectsApi(api).list_namespaced_custom_object(
                names.GROUP, names.VERSION, ns, names.PLURAL).get("items") or []):  # fmt: skip
            drop_finalizers(api, ns, item["metadata"]["name"])
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


def made_by(release: str) -> Callable[[Any], bool]:
    def check(pod: Any) -> bool:
        annotations = pod.metadata.annotations or {}
        return bool(annotations.get(names.ANNOTATION_OPERATOR_VERSION) == release)

    return check


def finalized_env(pod: Any) -> bool:
    env = {e.name: e.value for e in pod.spec.containers[0].env or []}
    return env.get("DEDUP_FINALIZED") == "true"
