"""The stand-in node agent (local/dedup_local/cluster/, what the `containers` group and
most benches still run on) on the real control plane: pods run as processes on node agents,
volumes from the pool attach through the real attach/detach controller, and node faults
go through the real node lifecycle controller, pod GC and taint eviction."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_local.cluster import ClusterTimings, LocalCluster
from dedup_local.control_plane import KubectlError
from dedup_local.kafka import KafkaBroker
from support.cluster_fixtures import ClusterNamespace
from support.operator_helpers import rollout_status, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("containers")]

PROJECT_IMAGE = "dedup-operator:dev"


def apply(cluster: LocalCluster, ns: str, manifest: str) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifest)


def pod_json(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def pods(cluster: LocalCluster, ns: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json")
    return list(json.loads(out.stdout)["items"])


def phase_of(cluster: LocalCluster, ns: str, name: str, phase: str) -> dict[str, Any] | None:
    p = pod_json(cluster, ns, name)
    return p if p and p.get("status", {}).get("phase") == phase else None


def wait_phase(cluster: LocalCluster, ns: str, name: str, phase: str, timeout: float) -> None:
    """Wait for pod `name` to reach `phase`; on timeout, print what the namespace holds
    (pods, claims, attachments, events) before failing."""
    try:
        wait_for(lambda: phase_of(cluster, ns, name, phase), timeout, f"{name} {phase}")
    except AssertionError:
        print(cluster.kubectl("get", "pods,pvc,events", "-n", ns, "-o", "wide").stdout)
        print(cluster.kubectl("get", "volumeattachments", "-o", "wide").stdout)
        raise


def node_condition(core: client.CoreV1Api, node: str) -> str:
    conds = core.read_node(node).status.conditions or []
    return next(c.status for c in conds if c.type == "Ready")


def test_deployment_ready_by_http_probe_and_deleted_within_grace(
    stand_in_cluster: LocalCluster, stand_in_namespace: ClusterNamespace
) -> None:
    ns = stand_in_namespace.name
    apply(stand_in_cluster, ns, """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 4
      containers:
      - name: web
        image: python:3.11
        command: [python3, -m, http.server, --bind, $(POD_IP), "8080"]
        workingDir: /
        env:
        - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1}
        livenessProbe: {tcpSocket: {port: http}, periodSeconds: 2}
""")  # fmt: skip
    try:
        rollout_status(stand_in_cluster, ns, "deployment/web", 90)
    except KubectlError:  # (once in CI, under the four groups' load): what the pod waited on
        print(stand_in_cluster.kubectl("describe", "pods", "-n", ns, check=False).stdout)
        print(stand_in_cluster.kubectl("get", "events", "-n", ns, "-o", "wide").stdout)
        raise
    table = stand_in_cluster.kubectl("get", "pods", "-n", ns, "-o", "wide").stdout
    print(table)
    [pod] = pods(stand_in_cluster, ns, "app=web")
    assert " 1/1 " in table and "Running" in table
    status = pod["status"]
    assert status["podIP"].startswith("127.") and status["podIP"] != "127.0.0.1"
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {
        "PodScheduled": "True", "Initialized": "True", "ContainersReady": "True", "Ready": "True",
    }  # fmt: skip
    assert "GET / HTTP" in stand_in_cluster.pod_log(ns, pod["metadata"]["name"])

    started = time.monotonic()
    stand_in_cluster.kubectl("delete", "deployment", "web", "-n", ns, "--wait=true")
    wait_for(lambda: not pods(stand_in_cluster, ns, "app=web"), 30, "the pod to be gone")
    took = time.monotonic() - started
    print(f"deleted in {took:.1f}s (grace 4s)")
    assert took < 4 + 10


def test_jobs_complete_and_fail_per_backoff_limit(
    stand_in_cluster: LocalCluster, stand_in_namespace: ClusterNamespace
) -> None:
    ns = stand_in_namespace.name
    for name, code, limit in (("ok", 0, 0), ("bad", 3, 1)):
        apply(stand_in_cluster, ns, f"""
apiVersion: batch/v1
kind: Job
metadata: {{name: {name}}}
spec:
  backoffLimit: {limit}
  template:
    spec:
      restartPolicy: Never
      containers:
      - {{name: main, image: busybox, command: [sh, -c, "echo run $(JOB); exit {code}"],
         env: [{{name: JOB, value: {name}}}]}}
""")  # fmt: skip
    batch = client.BatchV1Api(stand_in_namespace.api_client)

    def condition(job: str, type_: str) -> bool:
        conds = batch.read_namespaced_job(job, ns).status.conditions or []
        return any(c.type == type_ and c.status == "True" for c in conds)

    wait_for(lambda: condition("ok", "Complete"), 60, "job ok Complete")
    wait_for(lambda: condition("bad", "Failed"), 90, "job bad Failed")
    assert batch.read_namespaced_job("bad", ns).status.failed == 2
    failed = pods(stand_in_cluster, ns, "job-name=bad")
    assert {
        p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] for p in failed
    } == {3}
    assert "run bad" in stand_in_cluster.pod_log(ns, failed[0]["metadata"]["name"])


def volume_claim(claim: str) -> str:
    return f"""
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {claim}}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: dedup-local
  resources: {{requests: {{storage: 1Gi}}}}
"""


def pod_with_claim(name: str, claim: str, script: str, extra: str = "") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: Never
  {extra}
  containers:
  - name: main
    image: busybox
    command: [sh, -c, {json.dumps(script)}]
    volumeMounts: [{{name: data, mountPath: /var/lib/dedup}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}]
"""


def claim_bound(cluster: LocalCluster, ns: str, claim: str) -> bool:
    found = json.loads(cluster.kubectl("get", "pvc", claim, "-n", ns, "-o", "json").stdout)
    return bool(found.get("status", {}).get("phase") == "Bound")


def test_pvc_attached_by_the_attach_detach_controller_keeps_data_for_the_next_pod(
    stand_in_cluster: LocalCluster, stand_in_namespace: ClusterNamespace
) -> None:
    ns = stand_in_namespace.name
    # The claim bound before its pod exists: a pod the scheduler first saw with its
    # immediate claim not yet bound ("unbound immediate PersistentVolumeClaims. not
    # found") stayed Pending for more than 180 s after the bind, once in CI (2026-11-27;
    # not tried again, where no event moves it, before the scheduler's flush of
    # unschedulable pods after 5 minutes). This test is about the attach/detach
    # controller, not that race.
    apply(stand_in_cluster, ns, volume_claim("data"))
    wait_for(lambda: claim_bound(stand_in_cluster, ns, "data"), 120, "claim data Bound")
    apply(stand_in_cluster, ns, pod_with_claim("writer", "data", "echo hello > /var/lib/dedup/f"))
    # Up to 180 s: attaching and a container under the load of four test groups side by
    # side (60 s ran out once in CI, 2026-11-26).
    wait_phase(stand_in_cluster, ns, "writer", "Succeeded", 180)
    storage = client.StorageV1Api(stand_in_namespace.api_client)
    core = client.CoreV1Api(stand_in_namespace.api_client)
    pv_name = core.read_namespaced_persistent_volume_claim("data", ns).spec.volume_name
    [va] = [
        v
        for v in storage.list_volume_attachment().items
        if v.spec.source.persistent_volume_name == pv_name
    ]
    assert va.status.attached and "external-attacher/local.dedup.dev" in va.metadata.finalizers
    writer_node = pod_json(stand_in_cluster, ns, "writer")["spec"]["nodeName"]  # type: ignore[index]
    stand_in_cluster.kubectl("delete", "pod", "writer", "-n", ns)
    # The next pod on a different node: the volume must move.
    apply(stand_in_cluster, ns, pod_with_claim(
        "reader", "data", "cat /var/lib/dedup/f",
        extra=("affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: "
               "{nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: NotIn, "
               f"values: [{writer_node}]}}]}}]}}}}}}"),
    ))  # fmt: skip
    wait_phase(stand_in_cluster, ns, "reader", "Succeeded", 180)
    assert stand_in_cluster.pod_log(ns, "reader").strip() == "hello"
    assert not (Path("/var/lib/dedup") / "f").exists()  # the host's path was never touched


def test_killed_node_out_of_service_taint_moves_the_volume_to_a_replacement(
    stand_in_cluster: LocalCluster, stand_in_namespace: ClusterNamespace
) -> None:
    ns = stand_in_namespace.name
    api = stand_in_namespace.api_client
    core, storage = client.CoreV1Api(api), client.StorageV1Api(api)
    apply(stand_in_cluster, ns, """
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: state}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: dedup-local
  resources: {requests: {storage: 1Gi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: keeper}
spec:
  replicas: 1
  strategy: {type: Recreate}
  selector: {matchLabels: {app: keeper}}
  template:
    metadata: {labels: {app: keeper}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: main
        image: busybox
        command: [sh, -c, "[ -f /data/id ] || echo $(POD) > /data/id; echo data from $(cat /data/id); exec sleep 100000"]
        env: [{name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        volumeMounts: [{name: d, mountPath: /data}]
      volumes: [{name: d, persistentVolumeClaim: {claimName: state}}]
""")  # fmt: skip
    rollout_status(stand_in_cluster, ns, "deployment/keeper", 90)
    [first] = pods(stand_in_cluster, ns, "app=keeper")
    first_name, lost = first["metadata"]["name"], first["spec"]["nodeName"]
    wait_for(lambda: "data from" in stand_in_cluster.pod_log(ns, first_name), 20, "first pod's log")
    pv = core.read_namespaced_persistent_volume_claim("state", ns).spec.volume_name
    taint = client.V1Taint(
        key="node.kubernetes.io/out-of-service", value="nodeshutdown", effect="NoExecute"
    )
    steps: dict[str, float] = {}
    t0 = time.monotonic()

    def step(name: str) -> None:
        steps[name] = time.monotonic() - t0
        print(f"{steps[name]:6.1f}s {name}", flush=True)

    try:
        stand_in_cluster.kill(lost)
        step(f"killed {lost} running {first_name}")
        wait_for(lambda: node_condition(core, lost) == "Unknown", 60, "Ready=Unknown")
        step("node Ready=Unknown")
        wait_for(
            lambda: any(t.key == "node.kubernetes.io/unreachable" and t.effect == "NoExecute"
                        for t in core.read_node(lost).spec.taints or []),
            60, "unreachable NoExecute taint",
        )  # fmt: skip
        step("node tainted unreachable")
        node = core.read_node(lost)
        core.patch_node(lost, {"spec": {"taints": [*(node.spec.taints or []), taint]}})
        step("out-of-service taint applied")

        def gone() -> bool:
            try:
                core.read_namespaced_pod(first_name, ns)
                return False
            except ApiException as exc:
                return exc.status == 404

        wait_for(gone, 60, "pod GC to force-delete the pod")
        step("old pod deleted")

        def detached() -> bool:
            return not any(
                v.spec.source.persistent_volume_name == pv and v.spec.node_name == lost
                for v in storage.list_volume_attachment().items
            )

        wait_for(detached, 60, "the volume detached from the lost node")
        step("volume detached")

        def replacement() -> dict[str, Any] | None:
            ready = [p for p in pods(stand_in_cluster, ns, "app=keeper")
                     if p["status"].get("phase") == "Running" and p["spec"].get("nodeName") != lost]  # fmt: skip
            return ready[0] if ready else None

        new = wait_for(replacement, 60, "a replacement Running on another node")
        step(f"replacement {new['metadata']['name']} running on {new['spec']['nodeName']}")
        wait_for(
            lambda: "data from" in stand_in_cluster.pod_log(ns, new["metadata"]["name"]), 20, "log"
        )
        assert f"data from {first_name}" in stand_in_cluster.pod_log(ns, new["metadata"]["name"])
    finally:
        stand_in_cluster.restart(lost)
        node = core.read_node(lost)
        rest = [t for t in node.spec.taints or [] if t.key != taint.key]
        core.patch_node(lost, {"spec": {"taints": rest or None}})
        wait_for(lambda: node_condition(core, lost) == "True", 60, f"{lost} Ready again")


def test_partitioned_node_keeps_its_process_and_kafka_but_loses_the_api(
    stand_in_cluster: LocalCluster, stand_in_namespace: ClusterNamespace, kafka: KafkaBroker
) -> None:
    ns = stand_in_namespace.name
    host, port = kafka.bootstrap.rsplit(":", 1)
    script = f"""
import os, socket, ssl, time, urllib.request
ctx = ssl.create_default_context(cafile="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
url = "https://%s:%s/version" % (os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
while True:
    try:
        urllib.request.urlopen(url, context=ctx, timeout=1).read(); api = "ok"
    except Exception:
        api = "fail"
    try:
        socket.create_connection(("{host}", {port}), timeout=1).close(); k = "ok"
    except OSError:
        k = "fail"
    print("api", api, "kafka", k, flush=True)
    time.sleep(0.5)
"""
    apply(stand_in_cluster, ns, f"""
apiVersion: v1
kind: Pod
metadata: {{name: probe}}
spec:
  containers:
  - {{name: main, image: {PROJECT_IMAGE}, command: [python, -c, {json.dumps(script)}]}}
""")  # fmt: skip
    wait_for(lambda: phase_of(stand_in_cluster, ns, "probe", "Running"), 60, "probe Running")
    wait_for(lambda: "api ok kafka ok" in stand_in_cluster.pod_log(ns, "probe"), 30, "api ok")
    node = pod_json(stand_in_cluster, ns, "probe")["spec"]["nodeName"]  # type: ignore[index]
    runner = next(
        r
        for r in stand_in_cluster.agents[node].pods.values()
        if r.pod["metadata"]["name"] == "probe"
    )
    process = runner.containers[0].process
    assert process is not None
    try:
        stand_in_cluster.partition(node)
        seen = len(stand_in_cluster.pod_log(ns, "probe"))
        wait_for(
            lambda: "api fail kafka ok" in stand_in_cluster.pod_log(ns, "probe")[seen:],
            30,
            "api fail",
        )
        assert process.exit_code() is None
    finally:
        stand_in_cluster.heal(node)
    seen = len(stand_in_cluster.pod_log(ns, "probe"))
    wait_for(
        lambda: "api ok kafka ok" in stand_in_cluster.pod_log(ns, "probe")[seen:], 30, "api back"
    )
    assert process.exit_code() is None


def test_service_account_token_lists_pods_per_rbac(
    stand_in_cluster: LocalCluster, stand_in_namespace: ClusterNamespace
) -> None:
    ns = stand_in_namespace.name
    script = f"""
from kubernetes import client, config
config.load_incluster_config()
core = client.CoreV1Api()
print("pods", len(core.list_namespaced_pod("{ns}").items), flush=True)
try:
    core.list_namespaced_secret("{ns}")
    print("secrets allowed")
except client.exceptions.ApiException as exc:
    print("secrets denied", exc.status)
"""
    apply(stand_in_cluster, ns, f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: lister}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: pod-lister}}
rules: [{{apiGroups: [""], resources: [pods], verbs: [list]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: lister}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-lister}}
subjects: [{{kind: ServiceAccount, name: lister}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: lister}}
spec:
  serviceAccountName: lister
  restartPolicy: Never
  containers:
  - {{name: main, image: {PROJECT_IMAGE}, command: [python, -c, {json.dumps(script)}]}}
""")  # fmt: skip
    wait_for(lambda: phase_of(stand_in_cluster, ns, "lister", "Succeeded"), 60, "lister Succeeded")
    out = stand_in_cluster.pod_log(ns, "lister")
    assert "pods 1" in out and "secrets denied 403" in out, out


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _alive(pid: int) -> bool:
    """Exists and is not a zombie (a dead process its parent has not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _describe(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        cmdline = "?"
    return f"{pid}: {cmdline[:200]}"


@pytest.mark.cluster_group("kafka-spark")
def test_no_process_left_after_stop() -> None:
    cluster = LocalCluster(nodes=1, timings=ClusterTimings.fast())
    with cluster:
        cluster.kubectl(
            "run",
            "sleeper",
            "--image=busybox",
            "--restart=Never",
            "--command",
            "--",
            "sleep",
            "1000",
        )
        wait_for(lambda: phase_of(cluster, "default", "sleeper", "Running"), 60, "sleeper Running")
        data_dir = str(cluster.data_dir)
        pids = [
            c.process.pid
            for r in cluster.agents["node-a"].pods.values()
            for c in r.containers
            if c.process
        ]
        # the pod's process runs (its command line names the data dir only until the
        # launcher execs the container's command, so that is no precondition)
        assert pids and all(_alive(p) for p in pids)

    def left() -> list[str]:
        found = _processes_mentioning(data_dir) + [p for p in pids if _alive(p)]
        return [_describe(p) for p in found]

    # A SIGKILLed process takes a moment to go on a loaded machine: allow it that.
    deadline = time.monotonic() + 15
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left(), left()
    assert not os.path.exists(data_dir)


def test_restarted_node_runs_the_pods_still_bound_to_it(
    stand_in_cluster: LocalCluster, stand_in_namespace: ClusterNamespace
) -> None:
    ns = stand_in_namespace.name
    apply(stand_in_cluster, ns, """
apiVersion: v1
kind: Pod
metadata: {name: sleeper}
spec:
  containers: [{name: main, image: busybox, command: [sh, -c, "echo up; exec sleep 100000"]}]
""")  # fmt: skip
    pod = wait_for(lambda: phase_of(stand_in_cluster, ns, "sleeper", "Running"), 60, "Running")
    node = pod["spec"]["nodeName"]

    def pid() -> int | None:
        agent = stand_in_cluster.agents.get(node)
        runners = (
            [r for r in agent.pods.values() if r.pod["metadata"]["name"] == "sleeper"]
            if agent
            else []
        )
        process = runners[0].containers[0].process if runners else None
        return process.pid if process is not None and process.exit_code() is None else None

    before = wait_for(pid, 20, "the process")
    wait_for(lambda: "up" in stand_in_cluster.pod_log(ns, "sleeper"), 20, "the first run's log")
    stand_in_cluster.restart(node)
    assert (
        not Path(f"/proc/{before}").exists()
        or "zombie" in Path(f"/proc/{before}/status").read_text()
    )
    after = wait_for(pid, 30, "the process after the restart")
    assert after != before

    def restarted() -> bool:
        p = pod_json(stand_in_cluster, ns, "sleeper") or {}
        statuses = p.get("status", {}).get("containerStatuses") or [{}]
        return (
            p.get("status", {}).get("phase") == "Running" and statuses[0].get("restartCount") == 1
        )

    wait_for(restarted, 30, "Running with restartCount 1")
    wait_for(lambda: stand_in_cluster.pod_log(ns, "sleeper").count("up") == 2, 20, "a second run")
