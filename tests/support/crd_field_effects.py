"""No DedupPipeline field is accepted without effect: for each leaf field of the CRD's
`spec`, the test that changes it and asserts what it does (the objects the operator
renders, the worker's arguments, a handover's decision, the status, or an API action).

tests/unit/project/test_crd_field_effects.py walks the CRD's openAPIV3Schema and fails for a
leaf field missing here, for an entry naming no field of the CRD, and for an entry
naming a test function that does not exist. A new field needs its test and its line
here; a field nothing acts on does not belong in the API (hence no `storage.snapshots`:
docs/operations.md, "Pipelines", on backups).

A leaf is a schema node without `properties`: a scalar, a map (`additionalProperties`),
a list, or a passed-through core/v1 object (`x-kubernetes-preserve-unknown-fields`).
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Effect(NamedTuple):
    test: str  # "tests/<dir>/<file>.py::<function>"
    shows: str  # the effect the test asserts


DESIRED = "tests/unit/dedup_operator/test_desired.py"
AUDIT = "tests/unit/dedup_operator/test_desired_audit.py"
EFFECTS = "tests/unit/dedup_operator/test_spec_effects.py"
WORKER_ARGS = f"{EFFECTS}::test_worker_fields_reach_the_workers_arguments"
POD = f"{EFFECTS}::test_image_requests_node_selector_and_tolerations_reach_the_worker_pod"

FIELD_EFFECTS: Final[dict[str, Effect]] = {
    # ------------------------------------------------------------------------- kafka
    "spec.kafka.bootstrapServers": Effect(WORKER_ARGS, "the worker's --bootstrap-servers"),
    "spec.kafka.inputTopic": Effect(WORKER_ARGS, "the worker's --input-topic"),
    "spec.kafka.outputTopic": Effect(WORKER_ARGS, "the worker's --output-topic"),
    "spec.kafka.deadLetterTopic": Effect(WORKER_ARGS, "the worker's --dead-letter-topic"),
    "spec.kafka.consumerGroup": Effect(WORKER_ARGS, "the worker's --consumer-group"),
    "spec.kafka.config": Effect(
        f"{DESIRED}::test_kafka_credentials_come_from_the_secret",
        "DEDUP_KAFKA_CONFIG of the worker pod holds the settings, before the Secret's",
    ),
    "spec.kafka.securityRef.secretName": Effect(
        f"{DESIRED}::test_kafka_credentials_come_from_the_secret",
        "the worker pod's secretKeyRef names the Secret",
    ),
    "spec.kafka.securityRef.key": Effect(
        f"{EFFECTS}::test_security_ref_key_names_the_secrets_key",
        "the worker pod's secretKeyRef names the key",
    ),
    "spec.kafka.ownedTopic": Effect(
        f"{DESIRED}::test_workers_get_the_internal_topic_and_the_worker_count",
        "DEDUP_OWNED_TOPIC of the worker pod names it, and the operator does not create it",
    ),
    # -------------------------------------------------------------------- partitions
    "spec.partitions": Effect(
        f"{DESIRED}::test_pipeline_objects",
        "the workers' Role names one Lease per partition (DEDUP_WORKERS: "
        "test_workers_get_the_internal_topic_and_the_worker_count)",
    ),
    # --------------------------------------------------------------- messageId, window
    "spec.messageId.source": Effect(WORKER_ARGS, "the worker's --id-source"),
    "spec.messageId.field": Effect(WORKER_ARGS, "the worker's --id-field"),
    "spec.window.duration": Effect(
        f"{DESIRED}::test_worker_pod_runs_the_worker_with_its_flags_from_env",
        "DEDUP_WINDOW_DURATION of the worker pod",
    ),
    "spec.window.maxKeys": Effect(
        f"{DESIRED}::test_the_pod_env_is_a_valid_worker_configuration",
        "the worker's window.max_keys, read from its pod's environment",
    ),
    # ------------------------------------------------------------------------ worker
    "spec.worker.image": Effect(POD, "the worker container's image"),
    "spec.worker.batchSize": Effect(WORKER_ARGS, "the worker's --batch-size"),
    "spec.worker.lingerMs": Effect(WORKER_ARGS, "the worker's --linger-ms"),
    "spec.worker.blockCacheMB": Effect(WORKER_ARGS, "the worker's --block-cache-mb"),
    "spec.worker.logLevel": Effect(WORKER_ARGS, "the worker's --log-level"),
    "spec.worker.resources.requests": Effect(POD, "the worker container's requests"),
    "spec.worker.resources.limits": Effect(
        f"{DESIRED}::test_worker_pod_is_restricted_probed_and_spread",
        "the worker container's limits (and --lookup-threads from the CPU limit)",
    ),
    "spec.worker.nodeSelector": Effect(POD, "the worker pod's nodeSelector"),
    "spec.worker.tolerations": Effect(POD, "the worker pod's tolerations"),
    "spec.worker.affinity": Effect(
        f"{DESIRED}::test_replacement_avoids_the_lost_node_and_keeps_user_affinity",
        "the worker pod's affinity: the user's terms plus the lost node excluded",
    ),
    # ----------------------------------------------------------------------- storage
    "spec.storage.size": Effect(
        f"{DESIRED}::test_volume_claim_and_lease", "the PVC's storage request"
    ),
    "spec.storage.storageClassName": Effect(
        f"{DESIRED}::test_volume_claim_and_lease", "the PVC's storageClassName"
    ),
    "spec.storage.retainOnDelete": Effect(
        "tests/integration/test_operator.py::test_delete_keeps_volumes_only_when_asked",
        "the finalizer, and the PVCs kept (owner reference dropped) or deleted",
    ),
    # ---------------------------------------------------------------------- failover
    "spec.failover.nodeLostAfter": Effect(
        f"{EFFECTS}::test_node_lost_after_decides_when_a_handover_begins",
        "a NodeLost handover begins, or not yet, for the same silent node",
    ),
    "spec.failover.leaseDuration": Effect(
        f"{DESIRED}::test_volume_claim_and_lease",
        "the partition Lease's leaseDurationSeconds",
    ),
    "spec.failover.releaseVolume": Effect(
        f"{EFFECTS}::test_release_volume_decides_how_a_lost_nodes_volume_is_released",
        "taint the node, force-delete the pod, or wait for someone's taint",
    ),
    "spec.failover.detachTimeout": Effect(
        f"{EFFECTS}::test_detach_timeout_decides_when_a_stuck_volume_degrades",
        "VolumeNotDetached (Degraded) after it, not before",
    ),
    "spec.failover.scheduleTimeout": Effect(
        f"{EFFECTS}::test_schedule_timeout_decides_when_an_unplaceable_pod_degrades",
        "Unschedulable (Degraded) after it, not before",
    ),
    # ---------------------------------------------------------------- reconciliation
    "spec.reconciliation.schedule": Effect(
        f"{AUDIT}::test_cron_job_without_the_spark_operator", "the audit CronJob's schedule"
    ),
    "spec.reconciliation.lookback": Effect(
        f"{AUDIT}::test_cron_job_command_is_what_dedup_reconcile_accepts",
        "the audit's --lookback and the range dedup-audit derives from it",
    ),
    "spec.reconciliation.spark.image": Effect(
        f"{AUDIT}::test_explicit_master_keeps_the_cron_job", "the audit container's image"
    ),
    "spec.reconciliation.spark.executors": Effect(
        f"{AUDIT}::test_cron_job_command_is_what_dedup_reconcile_accepts",
        "the audit's --executors",
    ),
    # ----------------------------------------------------------------------- upgrade
    "spec.upgrade.finalizedRelease": Effect(
        WORKER_ARGS, "the worker's --finalized: its store written at format 3"
    ),
    "spec.reconciliation.spark.master": Effect(
        f"{AUDIT}::test_explicit_master_keeps_the_cron_job",
        "the audit's --master, and a CronJob even under the Spark operator",
    ),
}
