"""The one place for the names and label keys of everything the operator creates, and
the names the parts share in Kafka.

Per partition N of pipeline P: PVC `P-pN`, Lease `P-pN`, worker Pod `P-pN-e<epoch>`.
Per pipeline: ServiceAccount/Role/RoleBinding `P-worker`, headless Service `P-workers`,
PodDisruptionBudget `P-workers`; in Kafka, the internal topic `<namespace>.P-owned` that
workers forward the records they do not own through (unless `spec.kafka.ownedTopic`
names one), and the consumer group `dedup-P` whose committed offsets are the input
position (the worker commits it, the operator renders it, the Spark jobs read it).
"""

from __future__ import annotations

import re
from typing import Final

GROUP: Final = "dedup.io"
VERSION: Final = "v1alpha1"
"""The version the operator and dedupctl talk (the workers read no pipeline): served
beside STORAGE_VERSION with the same schema (no conversion), so every object is seen
whatever it is stored at."""
STORAGE_VERSION: Final = "v1beta1"
"""The version the API server stores DedupPipelines at (crds/; the storage migration of
dedup_operator.storage_version moves those written before it)."""
CRD_NAME: Final = "deduppipelines.dedup.io"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "DedupPipeline"
PLURAL: Final = "deduppipelines"

# label keys
LABEL_PIPELINE: Final = "dedup.io/pipeline"
LABEL_PARTITION: Final = "dedup.io/partition"
LABEL_EPOCH: Final = "dedup.io/epoch"
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
MANAGER: Final = "dedup-operator"
COMPONENT_WORKER: Final = "worker"

# annotations
ANNOTATION_SPEC_HASH: Final = "dedup.io/spec-hash"
# on a worker pod: the release of the operator that made it (dedup_contract.release)
ANNOTATION_OPERATOR_VERSION: Final = "dedup.io/operator-version"
ANNOTATION_STORED_VERSION: Final = "dedup.io/stored-version"
"""On a DedupPipeline: the storage version the operator rewrote it at (the write that moves
an object stored at an older version to the storage version)."""
# on a Node the operator tainted out-of-service: the pipelines ("namespace/name",
# comma-separated) that rely on that taint; it is lifted with the last of them
ANNOTATION_TAINT_BY: Final = "dedup.io/out-of-service-taint-by"
# on a DedupPipeline whose workers started before ownership (condition OwnershipOff):
# "true" asks the operator to switch it to ownership (`dedupctl switch-ownership`). One
# way; it has no effect on a pipeline under ownership (an Event says so) and none after
# the switch.
ANNOTATION_SWITCH_TO_OWNERSHIP: Final = "dedup.io/switch-to-ownership"

# finalizer of a pipeline that keeps its volumes (retainOnDelete: true)
FINALIZER_RETAIN_VOLUMES: Final = "dedup.io/retain-volumes"
# finalizer of a pipeline while it relies on an out-of-service taint it added to a node
FINALIZER_TAINTS: Final = "dedup.io/out-of-service-taints"
# finalizer of a pipeline whose internal topic the operator creates (set before it
# creates it): deleting the pipeline deletes that topic, never a user-named one
FINALIZER_OWNED_TOPIC: Final = "dedup.io/owned-topic"

# the worker container
CONTAINER: Final = "worker"
METRICS_PORT: Final = 9400
METRICS_PORT_NAME: Final = "metrics"
STORE_VOLUME: Final = "store"
STORE_MOUNT: Final = "/var/lib/dedup"
STORE_PATH: Final = f"{STORE_MOUNT}/store"
TMP_VOLUME: Final = "tmp"
WORKER_COMMAND: Final = "dedup-worker"
RUN_AS_USER: Final = 65532


def volume_claim(pipeline: str, partition: int) -> str:
    return f"{pipeline}-p{partition}"


def lease(pipeline: str, partition: int) -> str:
    return f"{pipeline}-p{partition}"


def worker_pod(pipeline: str, partition: int, epoch: int) -> str:
    return f"{pipeline}-p{partition}-e{epoch}"


def owned_topic(namespace: str, pipeline: str) -> str:
    """The internal topic the operator creates for a pipeline: worker w forwards a record
    whose id it does not own to partition owner(id) of it (namespaced, so two
    namespaces' pipelines of one name on one Kafka do not share it)."""
    return f"{namespace}.{pipeline}-owned"


def default_consumer_group(pipeline: str) -> str:
    """The consumer group whose committed offsets are the input position."""
    return f"dedup-{pipeline}"


def service_account(pipeline: str) -> str:
    return f"{pipeline}-worker"


def role(pipeline: str) -> str:
    return f"{pipeline}-worker"


def metrics_service(pipeline: str) -> str:
    return f"{pipeline}-workers"


def disruption_budget(pipeline: str) -> str:
    return f"{pipeline}-workers"


RECONCILIATION_SUMMARY_KEY: Final = "summary.json"
"""The key of the audit's JSON summary in the result ConfigMap."""


def reconciliation_result(pipeline: str) -> str:
    """The ConfigMap the audit job writes its summary into and the operator reads."""
    return f"{pipeline}-reconciliation"


COMPONENT_RECONCILIATION: Final = "reconciliation"


def reconciliation_job(pipeline: str) -> str:
    """The scheduled audit's CronJob or ScheduledSparkApplication, and its
    ServiceAccount/Role/RoleBinding."""
    return f"{pipeline}-reconcile"


def reconciliation_labels(pipeline: str) -> dict[str, str]:
    """Labels of the scheduled audit's objects and pods."""
    return {**pipeline_labels(pipeline), LABEL_COMPONENT: COMPONENT_RECONCILIATION}


_POD = re.compile(r"^(?P<pipeline>.+)-p(?P<partition>[0-9]+)-e(?P<epoch>[0-9]+)$")


def parse_worker_pod(name: str) -> tuple[str, int, int] | None:
    """(pipeline, partition, epoch) of a worker pod's name, or None."""
    match = _POD.match(name)
    if not match:
        return None
    return match["pipeline"], int(match["partition"]), int(match["epoch"])


def pipeline_labels(pipeline: str) -> dict[str, str]:
    """Labels of everything a pipeline owns."""
    return {
        LABEL_PIPELINE: pipeline,
        LABEL_NAME: "dedup-worker",
        LABEL_INSTANCE: pipeline,
        LABEL_MANAGED_BY: MANAGER,
        LABEL_PART_OF: "dedup-operator",
    }


def worker_selector(pipeline: str) -> dict[str, str]:
    """The selector of a pipeline's worker pods (Service, PDB, anti-affinity)."""
    return {LABEL_PIPELINE: pipeline, LABEL_COMPONENT: COMPONENT_WORKER}


def partition_labels(pipeline: str, partition: int) -> dict[str, str]:
    return {**pipeline_labels(pipeline), LABEL_PARTITION: str(partition)}


def worker_labels(pipeline: str, partition: int, epoch: int) -> dict[str, str]:
    return {
        **partition_labels(pipeline, partition),
        LABEL_COMPONENT: COMPONENT_WORKER,
        LABEL_EPOCH: str(epoch),
    }
