"""`dedupctl` against a real pipeline on the local cluster whose workers run in
containers from the built image (what users run): the installed command run as a person
runs it (a subprocess, its output parsed, its exit code checked), every value compared
with what the cluster holds.

One pipeline for the module (2 partitions, a scheduled audit, `dedup-operator` as a real
process), shared by the tests in order: status, a handover (a worker pod deleted) and its
history, the audit before any run (`audit --now` on a real Spark run is checked in
test_operator_reconciliation.py), then the errors a person can cause, each with its exit code (no such pipeline, no cluster, forbidden, no CRD: a bare
API server started beside, in a thread while the pipeline starts).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dedup_contract import names
from dedup_contract.ownership import owner_reference
from dedup_local.cluster import LocalCluster
from dedup_local.control_plane import ControlPlane
from dedup_local.kafka import KafkaBroker
from dedupctl import cli as ctl
from support.cluster_fixtures import ClusterNamespace, _namespace
from support.kube_fixtures import CRD_FILES
from support.operator_helpers import (
    DEDUPCTL,
    OperatorProcess,
    dedupctl,
    free_port,
    get_pipeline,
    running_operator,
    wait_for,
)
from support.pipelines import cluster_pipeline_body
from support.worker_helpers import event, produce

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("containers")]

NAME = "ctl"
PARTITIONS = 2
NEVER = "0 0 1 1 *"  # once a year: the audit runs only when asked
IDS = {0: [f"a-{i % 150}" for i in range(200)], 1: [f"b-{i % 100}" for i in range(180)]}
MALFORMED = {0: 2, 1: 1}  # dead-lettered per partition


@dataclass
class Pipeline:
    ns: ClusterNamespace
    topic: str
    operator: OperatorProcess
    bare_api: Future[ControlPlane]

    @property
    def api(self) -> client.ApiClient:
        return self.ns.api_client

    def body(self) -> dict[str, Any]:
        found = get_pipeline(self.api, self.ns.name, NAME)
        assert found is not None
        return found


@pytest.fixture(scope="module")
def pipeline(
    container_cluster: LocalCluster,
    kafka: KafkaBroker,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pipeline]:
    assert container_cluster.control_plane is not None
    container_cluster.control_plane.install_crds(CRD_FILES)
    bare = ControlPlane(with_controllers=False)  # an API server without the CRD
    with ThreadPoolExecutor(1) as pool:

        def start_bare() -> ControlPlane:
            bare.start()
            return bare

        started = pool.submit(start_bare)
        try:
            topic = f"ctl-{os.getpid()}"
            for t in (topic, f"{topic}-out", f"{topic}-dlq"):
                kafka.create_topic(t, PARTITIONS)
            for p in range(PARTITIONS):
                values = [event(i) for i in IDS[p]] + [b"not json"] * MALFORMED[p]
                produce(kafka.bootstrap, topic, values, partition=p)
            namespaces = _namespace(container_cluster, request)
            ns = next(namespaces)
            log = tmp_path_factory.mktemp("dedupctl") / "operator.log"
            try:
                with running_operator(container_cluster.kubeconfig_path, ns.name, log) as op:
                    body = cluster_pipeline_body(
                        NAME,
                        kafka.bootstrap,
                        topic,
                        container_cluster.storage_class,
                        PARTITIONS,
                        failover={"nodeLostAfter": "5s", "leaseDuration": "5s"},
                        reconciliation={
                            "schedule": NEVER,
                            "lookback": "2h",
                            "spark": {"executors": 1},
                        },
                    )
                    client.CustomObjectsApi(ns.api_client).create_namespaced_custom_object(
                        names.GROUP, names.VERSION, ns.name, names.PLURAL, body
                    )
                    yield Pipeline(ns, topic, op, started)
            finally:
                namespaces.close()
        finally:
            bare.stop()


def settled(p: Pipeline, consumed: bool = False) -> dict[str, Any]:
    """The pipeline once Running with no lag; `consumed`: and the first workers' counters
    (status's, the operator's scrape of the workers) show every input record (a
    replacement worker's counters start at 0)."""
    total = sum(len(v) for v in IDS.values()) + sum(MALFORMED.values())

    def done() -> dict[str, Any] | None:
        body = p.body()
        s = body.get("status") or {}
        ok = s.get("phase") == "Running" and (not consumed or s.get("recordsIn") == total)
        return body if ok and s.get("consumerLag") == 0 else None

    return wait_for(done, 240, "the pipeline Running with its input consumed", every=1)


def test_status_shows_what_the_cluster_holds(pipeline: Pipeline) -> None:
    body = settled(pipeline, consumed=True)
    ns, kubeconfig = pipeline.ns.name, pipeline.ns.kubeconfig_path
    out = dedupctl("status", NAME, "-n", ns, "-o", "json", kubeconfig=kubeconfig)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schemaVersion"] == ctl_schema_version()
    (p,) = doc["pipelines"]
    status = body["status"]
    assert (p["namespace"], p["name"], p["phase"]) == (ns, NAME, "Running")
    assert (p["partitions"], p["readyPartitions"]) == (PARTITIONS, PARTITIONS)
    assert p["duplicatesDropped"] == status["duplicatesDropped"]
    assert p["duplicatesDropped"] == sum(len(v) - len(set(v)) for v in IDS.values())
    assert p["deadLetters"] == sum(MALFORMED.values())  # from the workers' /metrics
    pods = {
        pod.metadata.name: pod
        for pod in client.CoreV1Api(pipeline.api).list_namespaced_pod(ns).items
    }
    for q in p["partitionStatus"]:
        entry = status["partitions"][q["partition"]]
        assert (q["node"], q["pod"], q["epoch"]) == (entry["node"], entry["pod"], entry["epoch"])
        assert pods[q["pod"]].spec.node_name == q["node"]
        n = q["partition"]
        assert q["recordsIn"] == len(IDS[n]) + MALFORMED[n]  # worker n reads input n
        # under ownership worker n publishes the ids it owns, read anywhere
        owned = {
            i for ids in IDS.values() for i in ids if owner_reference(i.encode(), PARTITIONS) == n
        }
        assert q["recordsOut"] == len(owned)
        assert (q["deadLetters"], q["lag"], q["inputRate"]) == (MALFORMED[n], 0, 0.0)
    # a repeat is dropped by whichever worker meets it (its reader in its batch, else
    # its owner): only the sum is fixed
    assert sum(q["duplicatesDropped"] for q in p["partitionStatus"]) == p["duplicatesDropped"]
    forwarded = sum(q["forwarded"] for q in p["partitionStatus"])
    assert p["misroutedShare"] == round(
        forwarded / sum(q["recordsIn"] for q in p["partitionStatus"]), 4
    )

    table = dedupctl("status", "-n", ns, kubeconfig=kubeconfig)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:5] == ["NAMESPACE", "NAME", "PHASE", "READY", "IN/S"]
    assert lines[1].split()[:4] == [ns, NAME, "Running", f"{PARTITIONS}/{PARTITIONS}"]
    for q in p["partitionStatus"]:
        row = next(line for line in lines if line.startswith(f"{q['partition']}  "))
        assert row.split()[1:4] == [q["node"], q["pod"], str(q["epoch"])]

    as_yaml = dedupctl(
        "status", NAME, "-n", ns, "-o", "yaml", "--rate-sample", "0", kubeconfig=kubeconfig
    )
    assert yaml.safe_load(as_yaml.stdout)["pipelines"][0]["name"] == NAME

    # --watch -o json: one document per line and refresh, until Ctrl-C (exit 0)
    watch = subprocess.Popen(
        [DEDUPCTL, "status", NAME, "-n", ns, "-o", "json", "--watch", "--interval", "1",
         "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert watch.stdout is not None
    docs = [json.loads(watch.stdout.readline()) for _ in range(2)]
    watch.send_signal(signal.SIGINT)
    assert watch.wait(timeout=60) == 0
    assert [d["pipelines"][0]["phase"] for d in docs] == ["Running", "Running"]

    # `kubectl dedup`: kubectl finds the plugin on PATH
    kubectl = local_cluster_kubectl(pipeline)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    plugin = subprocess.run(
        [kubectl, "dedup", "status", NAME, "-n", ns, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert plugin.returncode == 0, plugin.stderr
    assert plugin.stdout.splitlines()[1].split()[:3] == [ns, NAME, "Running"]


def test_failovers_lists_the_handover_as_status_and_events_tell(pipeline: Pipeline) -> None:
    settled(pipeline)
    ns, kubeconfig = pipeline.ns.name, pipeline.ns.kubeconfig_path
    victim = pipeline.body()["status"]["partitions"][1]
    client.CoreV1Api(pipeline.api).delete_namespaced_pod(victim["pod"], ns)

    def handed_over() -> dict[str, Any] | None:
        entry = pipeline.body()["status"]["partitions"][1]
        last = entry.get("lastHandover") or {}
        return entry if last.get("fromPod") == victim["pod"] and entry.get("ready") else None

    entry = wait_for(handed_over, 180, "partition 1 handed over to a new pod", every=1)
    last = entry["lastHandover"]

    def told() -> dict[str, Any] | None:
        out = dedupctl("failovers", NAME, "-n", ns, "-o", "json", kubeconfig=kubeconfig)
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)["failovers"]
        return rows[-1] if rows and rows[-1]["finished"] and rows[-1]["started"] else None

    row = wait_for(told, 60, "the handover in dedupctl failovers (status and Events)")
    assert (row["partition"], row["reason"], row["outcome"]) == (1, last["reason"], "completed")
    assert (row["fromPod"], row["toPod"]) == (victim["pod"], entry["pod"])
    assert row["steps"] == last["steps"]
    assert row["totalSeconds"] == last["steps"]["ready"]
    table = dedupctl("failovers", NAME, "-n", ns, kubeconfig=kubeconfig)
    assert table.returncode == 0
    line = table.stdout.splitlines()[-1]
    assert f"{victim['pod']} on" in line and entry["pod"] in line
    assert f"{last['steps']['ready']:.1f}s" in line

    status = dedupctl("status", NAME, "-n", ns, "-o", "json", kubeconfig=kubeconfig)
    q1 = json.loads(status.stdout)["pipelines"][0]["partitionStatus"][1]
    assert q1["lastHandover"]["totalSeconds"] == last["steps"]["ready"]
    assert q1["epoch"] == entry["epoch"] == victim["epoch"] + 1


def test_audit_before_any_run_says_so(pipeline: Pipeline) -> None:
    """`audit --now` against a real Spark run, and `audit` of its result, are checked in
    test_operator_reconciliation's real scheduled run (one Spark audit fewer here)."""
    settled(pipeline)
    ns, kubeconfig = pipeline.ns.name, pipeline.ns.kubeconfig_path
    before = dedupctl("audit", NAME, "-n", ns, kubeconfig=kubeconfig)
    assert before.returncode == ctl.AUDIT_UNFINISHED, before.stdout  # none yet
    assert "no audit result yet" in before.stdout


def test_errors_a_person_can_cause_are_one_line_with_an_exit_code(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    ns, kubeconfig = pipeline.ns.name, pipeline.ns.kubeconfig_path

    def one_line(out: subprocess.CompletedProcess[str], code: int, text: str) -> None:
        assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
        assert out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith("dedupctl: ") and text in out.stderr, out.stderr
        assert "Traceback" not in out.stderr

    for command in (["status", "nope"], ["failovers", "nope"], ["audit", "nope"]):
        out = dedupctl(*command, "-n", ns, kubeconfig=kubeconfig)
        one_line(out, ctl.NOT_FOUND, f'pipeline "nope" not found in namespace {ns}')

    config = yaml.safe_load(kubeconfig.read_text())
    dead = tmp_path / "dead.kubeconfig"
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    dead.write_text(yaml.safe_dump(config))
    one_line(dedupctl("status", kubeconfig=dead), ctl.UNREACHABLE, "cannot reach the cluster at")
    one_line(dedupctl("status", kubeconfig=tmp_path / "none"), ctl.UNREACHABLE, "not found")
    one_line(
        dedupctl("status", "--context", "nope", kubeconfig=kubeconfig),
        ctl.UNREACHABLE,
        "no usable kubeconfig",
    )

    # a ServiceAccount that may do nothing: its own token in a kubeconfig
    core = client.CoreV1Api(pipeline.api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "nobody"}})
    token = core.create_namespaced_service_account_token(
        "nobody", ns, {"spec": {"expirationSeconds": 600}}
    ).status.token
    config = yaml.safe_load(kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    nobody = tmp_path / "nobody.kubeconfig"
    nobody.write_text(yaml.safe_dump(config))
    one_line(
        dedupctl("status", "-n", ns, kubeconfig=nobody), ctl.FORBIDDEN, "forbidden: cannot list"
    )
    one_line(dedupctl("status", NAME, "-n", ns, kubeconfig=nobody), ctl.FORBIDDEN, "forbidden")

    bare = pipeline.bare_api.result(timeout=300)
    for command in (["status"], ["status", NAME], ["failovers", NAME]):
        out = dedupctl(*command, kubeconfig=bare.kubeconfig_path)
        one_line(
            out, ctl.NO_CRD, "the DedupPipeline CRD (deduppipelines.dedup.io) is not installed"
        )


def ctl_schema_version() -> int:
    from dedupctl.view import STATUS_SCHEMA_VERSION

    return STATUS_SCHEMA_VERSION


def local_cluster_kubectl(p: Pipeline) -> str:
    cp = p.ns.cluster.control_plane
    assert cp is not None
    return str(cp.binaries.kubectl)
