"""The scheduled audit (`dedup-audit`, spark/dedup_spark/audit_job.py) of a pipeline
with `spec.reconciliation`, as pure builders.

Always: ServiceAccount, Role and RoleBinding `P-reconcile` for the Spark driver. Then ONE
of two schedulers (`reconciliation_objects(..., spark_operator=...)`):

- the Spark operator's CRD `scheduledsparkapplications.sparkoperator.k8s.io` is installed
  and `spark.master` is `k8s`: a `ScheduledSparkApplication` (v1beta2) `P-reconcile`,
  cluster mode: the Spark operator submits the driver (the image's `dedup-entrypoint
  driver`), which asks for the executors. Its arguments keep `--master k8s`, which
  dedup-audit's own default `local[2]` would otherwise override;
- otherwise a `batch/v1` CronJob `P-reconcile` whose pod IS the Spark driver in client
  mode (`--master k8s`: session.py points Spark at the API server from inside the pod,
  with the pod's IP and name from the downward API so executor pods are owned by it).
  An explicit `spark.master` (`local[N]`, `k8s://...`) always uses the CronJob.

Both run at most one audit at a time (concurrency Forbid, always set: the Spark operator
starts nothing at all when its policy is empty) and keep 3 finished runs. The job writes
its summary into the ConfigMap `P-reconciliation`, which the operator reads into
`status.lastReconciliation` (dedup_operator.audit_status). Each scheduler object carries
the hash of its spec in `dedup.io/spec-hash`: the server fills defaults into what it
stores, so the operator compares hashes, not specs. Both objects field by field:
docs/audit.md, "Scheduled audits".
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any, Final

from dedup_contract import names
from dedup_contract.driver_pod import pod_identity_env
from dedup_operator.desired.owner import Owner, metadata
from dedup_operator.desired.partition import kafka_env
from dedup_operator.desired.pipeline import RBAC
from dedup_operator.spec import PipelineSpec

AUDIT_COMMAND: Final = "dedup-audit"
REPORT_DIR: Final = "/reports"
REPORT_VOLUME: Final = "reports"

# The Dockerfile installs the project into the venv /opt/dedup of python:3.11 (checked
# by tests/unit/dedup_operator/test_desired_audit.py): the job's module inside the image.
IMAGE_PYTHON: Final = "python3.11"
IMAGE_VENV: Final = "/opt/dedup"
APPLICATION_FILE: Final = (
    f"local://{IMAGE_VENV}/lib/{IMAGE_PYTHON}/site-packages/dedup_spark/audit_job.py"
)

SPARK_OPERATOR_GROUP: Final = "sparkoperator.k8s.io"
SPARK_OPERATOR_VERSION: Final = "v1beta2"
SCHEDULED_SPARK_APPLICATIONS: Final = "scheduledsparkapplications"
SPARK_APPLICATIONS: Final = "sparkapplications"
SCHEDULED_SPARK_APPLICATION_CRD: Final = f"{SCHEDULED_SPARK_APPLICATIONS}.{SPARK_OPERATOR_GROUP}"
# the label the Spark operator puts on each SparkApplication a schedule starts
SCHEDULED_APP_LABEL: Final = f"{SPARK_OPERATOR_GROUP}/scheduled-app-name"
SPARK_VERSION: Final = "4.0.0"

HISTORY_LIMIT: Final = 3
STARTING_DEADLINE_S: Final = 300
ACTIVE_DEADLINE: Final = timedelta(hours=6)
DRIVER_CORES: Final = 1
DRIVER_MEMORY: Final = "1g"
EXECUTOR_CORES: Final = 1
EXECUTOR_MEMORY: Final = "1g"

# What a Spark 4.0 driver on Kubernetes calls with the settings session.py gives it (the
# default `direct` pods allocator, executors deleted on termination, no decommissioning,
# no PVCs owned by the driver), read from the spark-kubernetes 4.0.0 classes' calls into
# the fabric8 client, and nothing more. Each verb with the call that needs it:
DRIVER_GRANTS: Final[tuple[tuple[str, str, str], ...]] = (
    ("pods", "get", "ExecutorPodsAllocator reads the driver's own pod (owner of executors)"),
    ("pods", "create", "ExecutorPodsAllocator creates the executor pods"),
    ("pods", "list", "ExecutorPodsPollingSnapshotSource lists the app's executor pods"),
    ("pods", "watch", "ExecutorPodsWatchSnapshotSource watches the app's executor pods"),
    ("pods", "delete", "ExecutorPodsLifecycleManager deletes finished or timed-out executors"),
    (
        "pods",
        "deletecollection",
        "the scheduler backend's stop() deletes the app's executor pods by label",
    ),
    ("configmaps", "create", "the scheduler backend creates the executors' config ConfigMap"),
    ("configmaps", "deletecollection", "its stop() deletes that ConfigMap by label"),
    ("services", "deletecollection", "its stop() deletes the app's Services by label"),
)
# Not granted (was before issue 18): pods patch (only for executorInactivation with
# deleteOnTermination=false, decommission labels, or the statefulset allocator's exec
# ids), configmaps get/list/watch/delete and services create/get/delete (a cluster-mode
# driver's Service and ConfigMap are created by whoever submits it, spark-submit or the
# Spark operator, with its own account).
DRIVER_RULES: Final[tuple[tuple[str, tuple[str, ...]], ...]] = tuple(
    (resource, tuple(verb for r, verb, _ in DRIVER_GRANTS if r == resource))
    for resource in dict.fromkeys(r for r, _, _ in DRIVER_GRANTS)
)
# and what the job does with its result ConfigMap, by name: read it, then replace it
# (`audit_report.publish_summary`; creating it when absent is `configmaps create` above:
# RBAC cannot limit create by name).
RESULT_VERBS: Final = ("get", "update")


def image(spec: PipelineSpec) -> str:
    """The audit's image: spark.image, else the worker's (one image has every entry point)."""
    assert spec.reconciliation is not None
    return spec.reconciliation.spark.image or spec.worker.image


def uses_spark_operator(spec: PipelineSpec, crd_installed: bool) -> bool:
    """ScheduledSparkApplication (True) or CronJob (False)."""
    return (
        crd_installed
        and spec.reconciliation is not None
        and spec.reconciliation.spark.master == "k8s"
    )


def _duration(value: timedelta) -> str:
    """`1h30m`-style text in whole seconds (the grammar of dedup_contract.window)."""
    seconds = max(1, int(value.total_seconds()))
    out = ""
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out += f"{seconds // size}{unit}"
            seconds %= size
    return out


def arguments(spec: PipelineSpec) -> list[str]:
    """`dedup-audit`'s flags from the spec, all but --master.

    `--window` is the pipeline's window duration; a window bounded only by maxKeys has
    no duration, and then the audited range (lookback) stands in for it. `--workers`:
    the worker count (under ownership the recorded one, `spec` as the workers run it);
    `--owned-topic` (the internal topic) under ownership only. A pipeline that ran
    before ownership is audited by the same rules: while its producers key by the id
    with murmur2 on exactly `spec.partitions` input partitions (its precondition), every
    id is on its owner's partition, and where they do not, the audit says so."""
    rc = spec.reconciliation
    assert rc is not None
    k = spec.kafka
    args = [
        "--pipeline", spec.name,
        "--namespace", spec.namespace,
        "--bootstrap-servers", k.bootstrap_servers,
        "--input-topic", k.input_topic,
        "--output-topic", k.output_topic,
    ]  # fmt: skip
    if k.dead_letter_topic:
        args += ["--dead-letter-topic", k.dead_letter_topic]
    args += [
        "--consumer-group", k.consumer_group,
        "--id-source", spec.message_id.source,
        "--id-field", spec.message_id.field,
        "--window", spec.window.duration or _duration(rc.lookback),
        "--lookback", _duration(rc.lookback),
        "--report-dir", REPORT_DIR,
        "--configmap", names.reconciliation_result(spec.name),
        "--image", image(spec),
        "--executors", str(rc.spark.executors),
        "--executor-cores", str(EXECUTOR_CORES),
        "--executor-memory", EXECUTOR_MEMORY,
    ]  # fmt: skip
    # the audit groups by id with its own hash and checks each publication is on its
    # owner's output partition; pending = forwarded but not yet consumed
    args += ["--workers", str(spec.workers)]
    if spec.ownership:
        args += ["--owned-topic", spec.owned_topic]
    return args


def command(spec: PipelineSpec) -> list[str]:
    """The CronJob container's command: the driver in client mode (or spark.master)."""
    assert spec.reconciliation is not None
    return [AUDIT_COMMAND, *arguments(spec), "--master", spec.reconciliation.spark.master]


def driver_env(spec: PipelineSpec) -> list[dict[str, Any]]:
    """The driver pod's identity (downward API, as session.py reads it) and the
    pipeline's Kafka settings, exactly as the workers get them."""
    return [*pod_identity_env(), *kafka_env(spec)]


def _labels(spec: PipelineSpec) -> dict[str, str]:
    return names.reconciliation_labels(spec.name)


def service_account(spec: PipelineSpec, owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(names.reconciliation_job(spec.name), owner, _labels(spec)),
        "automountServiceAccountToken": True,
    }


def role(spec: PipelineSpec, owner: Owner) -> dict[str, Any]:
    rules: list[dict[str, Any]] = [
        {"apiGroups": [""], "resources": [resource], "verbs": list(verbs)}
        for resource, verbs in DRIVER_RULES
    ]
    rules.append(
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [names.reconciliation_result(spec.name)],
            "verbs": list(RESULT_VERBS),
        }
    )
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "Role",
        "metadata": metadata(names.reconciliation_job(spec.name), owner, _labels(spec)),
        "rules": rules,
    }


def role_binding(spec: PipelineSpec, owner: Owner) -> dict[str, Any]:
    job = names.reconciliation_job(spec.name)
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding",
        "metadata": metadata(job, owner, _labels(spec)),
        "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": job},
        "subjects": [{"kind": "ServiceAccount", "name": job, "namespace": spec.namespace}],
    }


def spec_hash(body_spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body_spec, sort_keys=True).encode()).hexdigest()[:16]


def _with_hash(body: dict[str, Any]) -> dict[str, Any]:
    body["metadata"].setdefault("annotations", {})[names.ANNOTATION_SPEC_HASH] = spec_hash(
        body["spec"]
    )
    return body


def cron_job(spec: PipelineSpec, owner: Owner) -> dict[str, Any]:
    """The driver pod on a schedule: one at a time, 3 finished Jobs kept, no retries
    (a failed audit is a result, the next run is the retry)."""
    rc = spec.reconciliation
    assert rc is not None
    labels = _labels(spec)
    container = {
        "name": "reconcile",
        "image": image(spec),
        "command": command(spec),
        "env": driver_env(spec),
        "resources": {
            "requests": {"cpu": "500m", "memory": "1Gi"},
            "limits": {"memory": "2Gi"},
        },
        "volumeMounts": [{"name": REPORT_VOLUME, "mountPath": REPORT_DIR}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod_spec = {
        "serviceAccountName": names.reconciliation_job(spec.name),
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": names.RUN_AS_USER,
            "runAsGroup": names.RUN_AS_USER,
            "fsGroup": names.RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": REPORT_VOLUME, "emptyDir": {}}],
    }
    if spec.worker.node_selector:
        pod_spec["nodeSelector"] = dict(spec.worker.node_selector)
    if spec.worker.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.worker.tolerations]
    return _with_hash(
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": metadata(names.reconciliation_job(spec.name), owner, labels),
            "spec": {
                "schedule": rc.schedule,
                "concurrencyPolicy": "Forbid",
                "startingDeadlineSeconds": STARTING_DEADLINE_S,
                "successfulJobsHistoryLimit": HISTORY_LIMIT,
                "failedJobsHistoryLimit": HISTORY_LIMIT,
                "jobTemplate": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "backoffLimit": 0,
                        "activeDeadlineSeconds": int(ACTIVE_DEADLINE.total_seconds()),
                        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
                    },
                },
            },
        }
    )


def scheduled_spark_application(spec: PipelineSpec, owner: Owner) -> dict[str, Any]:
    """The same audit for the Spark operator: cluster mode, its driver and executors
    with the same ServiceAccount, env and labels."""
    rc = spec.reconciliation
    assert rc is not None
    labels = _labels(spec)
    env = driver_env(spec)
    return _with_hash(
        {
            "apiVersion": f"{SPARK_OPERATOR_GROUP}/{SPARK_OPERATOR_VERSION}",
            "kind": "ScheduledSparkApplication",
            "metadata": metadata(names.reconciliation_job(spec.name), owner, labels),
            "spec": {
                "schedule": rc.schedule,
                "concurrencyPolicy": "Forbid",
                "successfulRunHistoryLimit": HISTORY_LIMIT,
                "failedRunHistoryLimit": HISTORY_LIMIT,
                "template": {
                    "type": "Python",
                    "mode": "cluster",
                    "image": image(spec),
                    "mainApplicationFile": APPLICATION_FILE,
                    "arguments": [*arguments(spec), "--master", "k8s"],
                    "sparkVersion": SPARK_VERSION,
                    "restartPolicy": {"type": "Never"},
                    "volumes": [{"name": REPORT_VOLUME, "emptyDir": {}}],
                    "driver": {
                        "serviceAccount": names.reconciliation_job(spec.name),
                        "cores": DRIVER_CORES,
                        "memory": DRIVER_MEMORY,
                        "labels": labels,
                        "env": env,
                        "volumeMounts": [{"name": REPORT_VOLUME, "mountPath": REPORT_DIR}],
                    },
                    "executor": {
                        # What Spark does anyway when none is named (the driver's); said
                        # here so the executors' account is not left to a default.
                        "serviceAccount": names.reconciliation_job(spec.name),
                        "instances": rc.spark.executors,
                        "cores": EXECUTOR_CORES,
                        "memory": EXECUTOR_MEMORY,
                        "labels": labels,
                        "env": kafka_env(spec),
                    },
                },
            },
        }
    )


def scheduler(spec: PipelineSpec, owner: Owner, spark_operator: bool) -> dict[str, Any]:
    """The CronJob or the ScheduledSparkApplication (see `uses_spark_operator`)."""
    if uses_spark_operator(spec, spark_operator):
        return scheduled_spark_application(spec, owner)
    return cron_job(spec, owner)


def reconciliation_objects(
    spec: PipelineSpec, owner: Owner, spark_operator: bool
) -> list[dict[str, Any]]:
    """Everything the scheduled audit needs, in creation order; [] without
    spec.reconciliation. `spark_operator`: the ScheduledSparkApplication CRD exists."""
    if spec.reconciliation is None:
        return []
    return [
        service_account(spec, owner),
        role(spec, owner),
        role_binding(spec, owner),
        scheduler(spec, owner, spark_operator),
    ]
