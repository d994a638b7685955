"""The Spark-operator path, started the way the Spark operator starts it: `spark-submit
--deploy-mode cluster` (the Spark operator runs exactly this) of the audit the operator
schedules, against the local cluster with containers.

spark-submit (pyspark's, on this machine, with the cluster's admin kubeconfig as the Spark
operator has its own account) creates the driver pod, its ConfigMap of Spark properties
and its Service. The driver pod runs the project's image with Spark's cluster-mode
arguments (`driver --properties-file /opt/spark/conf/spark.properties --class
org.apache.spark.deploy.PythonRunner <audit_job.py> <args>`): the image's entrypoint,
`dedup-entrypoint driver`, starts spark-submit in client mode inside the pod, and the
driver, with the audit's ServiceAccount (the operator's minimal Role), asks the API server
for executor pods. The topics hold what a real worker published; the audit passes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dedup_contract import names
from dedup_local.kafka import KafkaBroker
from dedup_local.patience import patient_timeout
from dedup_local.pipelines import pipeline_body
from dedup_local.spark_pods import PROJECT_IMAGE, ExecutorWatch
from dedup_operator.desired import scheduled_audit
from dedup_operator.desired.owner import Owner
from dedup_operator.spec import PipelineSpec
from dedup_spark.entrypoint import spark_home
from dedup_worker.loop import DedupWorker
from support.cluster_fixtures import ClusterNamespace
from support.worker_helpers import (
    event,
    produce,
    read_committed,
    run_until_consumed,
    unique,
    worker_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("containers")]


def _without_owner(body: dict[str, Any]) -> dict[str, Any]:
    """The operator's object with no owner (no DedupPipeline exists here for the garbage
    collector to find)."""
    body["metadata"].pop("ownerReferences", None)
    return body


def _api_server(kubeconfig: Path) -> str:
    config = yaml.safe_load(kubeconfig.read_text())
    server: str = config["clusters"][0]["cluster"]["server"]
    return server


def submit_command(
    template: dict[str, Any], namespace: str, master: str, driver: str, pod_template: Path
) -> list[str]:
    """spark-submit in cluster mode of a ScheduledSparkApplication's run, from its
    rendered `template` (the fields the Spark operator turns into spark-submit's)."""
    conf = {
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": template["image"],
        "spark.kubernetes.container.image.pullPolicy": "Never",
        "spark.kubernetes.authenticate.driver.serviceAccountName": template["driver"][
            "serviceAccount"
        ],
        "spark.kubernetes.authenticate.executor.serviceAccountName": template["executor"][
            "serviceAccount"
        ],
        "spark.kubernetes.driver.pod.name": driver,
        "spark.kubernetes.driver.podTemplateFile": str(pod_template),
        "spark.driver.cores": str(template["driver"]["cores"]),
        "spark.driver.memory": template["driver"]["memory"],
        "spark.kubernetes.driver.request.cores": "250m",  # a small machine
        "spark.executor.instances": str(template["executor"]["instances"]),
        "spark.executor.cores": str(template["executor"]["cores"]),
        "spark.executor.memory": template["executor"]["memory"],
        "spark.kubernetes.submission.waitAppCompletion": "true",
        "spark.kubernetes.report.interval": "5s",
    }
    assert template["type"] == "Python" and template["mode"] == "cluster"
    return [
        str(spark_home() / "bin" / "spark-submit"),
        *("--master", f"k8s://{master}", "--deploy-mode", "cluster"),
        *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
        template["mainApplicationFile"],
        *template["arguments"],
    ]


def test_a_cluster_mode_driver_pod_audits_real_worker_output(
    kafka: KafkaBroker, container_namespace: ClusterNamespace, tmp_path: Path
) -> None:
    ns, api = container_namespace.name, container_namespace.api_client
    cluster = container_namespace.cluster
    name = unique("clustermode")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    # the internal topic the rendered audit reads for pending forwards (one worker:
    # nothing is forwarded; the operator would have created it)
    kafka.create_topic(names.owned_topic(ns, name), 1)
    ids = [f"ev-{i % 150}" for i in range(200)]  # 50 repeats within the window
    produce(kafka.bootstrap, f"{name}-in", [*(event(i) for i in ids), b"{not json"])
    run_until_consumed(DedupWorker(worker_config(kafka.bootstrap, tmp_path, name)), len(ids) + 1)
    assert len(read_committed(kafka.bootstrap, f"{name}-out")) == 150

    body = pipeline_body(
        name,
        kafka.bootstrap,
        f"{name}-in",
        kafka_fields={"outputTopic": f"{name}-out", "deadLetterTopic": f"{name}-dlq"},
        worker={"image": PROJECT_IMAGE},
        reconciliation={
            "schedule": "0 0 1 1 *",
            "lookback": "2h",
            "spark": {"image": PROJECT_IMAGE, "executors": 2, "master": "k8s"},
        },
    )
    spec = PipelineSpec.parse(name, ns, body["spec"])
    owner = Owner(name=name, namespace=ns, uid="none")
    core: Any = client.CoreV1Api(api)
    rbac: Any = client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(
        ns, _without_owner(scheduled_audit.service_account(spec, owner))
    )
    rbac.create_namespaced_role(ns, _without_owner(scheduled_audit.role(spec, owner)))
    rbac.create_namespaced_role_binding(
        ns, _without_owner(scheduled_audit.role_binding(spec, owner))
    )

    # The rendered ScheduledSparkApplication's run; its driver section (env with the
    # downward API, the /reports mount) goes into the driver pod as the Spark operator
    # puts it there, through a pod template.
    template = scheduled_audit.scheduled_spark_application(spec, owner)["spec"]["template"]
    pod_template = tmp_path / "driver-template.yaml"
    pod_template.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "spec": {
                    "containers": [
                        {
                            "name": "spark-kubernetes-driver",
                            "env": template["driver"]["env"],
                            "volumeMounts": template["driver"]["volumeMounts"],
                        }
                    ],
                    "volumes": template["volumes"],
                },
            }
        )
    )
    driver = f"{name}-driver"
    server = _api_server(cluster.kubeconfig_path)
    command = submit_command(template, ns, server, driver, pod_template)
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path)}
    watch = ExecutorWatch(api, ns)
    try:
        submitted = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=patient_timeout(900),
            check=False,
        )
    finally:
        watch.stop()
    log = cluster.pod_log(ns, driver)
    (tmp_path / "driver.log").write_text(log)
    print(f"spark-submit:\n{submitted.stderr[-3000:]}\ndriver log:\n{log[-4000:]}")
    print(f"executors: {watch.seen}")

    pod = core.read_namespaced_pod(driver, ns)
    assert pod.status.phase == "Succeeded", log[-5000:]
    container = pod.spec.containers[0]
    # Spark's cluster-mode pod: no command (the image's entrypoint), its driver args
    assert not container.command
    assert container.args[:3] == ["driver", "--properties-file", "/opt/spark/conf/spark.properties"]
    assert scheduled_audit.APPLICATION_FILE.removeprefix("local://") in " ".join(container.args)
    assert pod.spec.service_account_name == names.reconciliation_job(name)
    assert "dedup_spark.entrypoint" in log and "starting the driver" in log, log[-3000:]
    assert submitted.returncode == 0, submitted.stderr[-3000:]

    assert len(watch.seen) >= 2, watch.seen
    for executor, seen in watch.seen.items():
        assert ("Pod", driver) in seen.owners, (executor, seen)
        assert "Running" in seen.phases, (executor, seen)
        assert seen.container_ids and all(c.startswith("podman://") for c in seen.container_ids)

    result = core.read_namespaced_config_map(names.reconciliation_result(name), ns)
    summary = json.loads(result.data["summary.json"])
    assert summary["passed"] is True, summary
    assert summary["totals"]["input"] == 201 and summary["totals"]["published"] == 150, summary
