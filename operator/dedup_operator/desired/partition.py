"""Per partition: the PVC `P-pN`, the Lease `P-pN` and the worker Pod `P-pN-e<epoch>`.

The worker is configured entirely through `DEDUP_*` environment variables (the worker's
flags, see worker/dedup_worker/cli.py and docs/design.md, "Worker configuration"). A
pod's template (everything but its name, epoch and placement of a replacement) is hashed
into the `dedup.io/spec-hash` annotation: a spec change shows up as a different hash and
is rolled one partition at a time.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Hashable
from typing import Any

from dedup_contract import names
from dedup_contract.kafka_settings import format_kafka_settings
from dedup_contract.release import VERSION
from dedup_operator.desired.owner import Owner, metadata
from dedup_operator.spec import PipelineSpec

HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
ZONE_TOPOLOGY = "topology.kubernetes.io/zone"


def volume_claim(spec: PipelineSpec, partition: int, owner: Owner) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(
            names.volume_claim(spec.name, partition),
            owner,
            names.partition_labels(spec.name, partition),
        ),
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": spec.storage.size}},
        },
    }
    if spec.storage.storage_class_name:
        body["spec"]["storageClassName"] = spec.storage.storage_class_name
    return body


def lease(spec: PipelineSpec, partition: int, owner: Owner) -> dict[str, Any]:
    """A free Lease at epoch 0; the first worker (epoch 1) takes it."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata(
            names.lease(spec.name, partition),
            owner,
            names.partition_labels(spec.name, partition),
        ),
        "spec": {
            "leaseDurationSeconds": spec.failover.lease_duration_seconds,
            "leaseTransitions": 0,
        },
    }


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def kafka_env(spec: PipelineSpec) -> list[dict[str, Any]]:
    """DEDUP_KAFKA_CONFIG: the inline (credential-free) settings, plus the Secret's
    settings through a secretKeyRef; both together by Kubernetes' $(VAR) expansion.
    Every pod that talks to the pipeline's Kafka gets exactly these (workers, the audit)."""
    inline = format_kafka_settings(spec.kafka.config)
    ref = spec.kafka.security_ref
    if ref is None:
        return [{"name": "DEDUP_KAFKA_CONFIG", "value": inline}] if inline else []
    secret = {"valueFrom": {"secretKeyRef": {"name": ref.secret_name, "key": ref.key}}}
    if not inline:
        return [{"name": "DEDUP_KAFKA_CONFIG", **secret}]
    return [
        {"name": "DEDUP_KAFKA_SECRET_CONFIG", **secret},
        {"name": "DEDUP_KAFKA_CONFIG", "value": f"{inline},$(DEDUP_KAFKA_SECRET_CONFIG)"},
    ]


def worker_env(spec: PipelineSpec, partition: int) -> list[dict[str, Any]]:
    """The worker's flags as DEDUP_* variables, all but its epoch. `spec` as the workers
    run it (`ownership.decide`): `partitions` is the recorded worker count."""
    plain: list[tuple[str, str | None]] = [
        ("DEDUP_BOOTSTRAP_SERVERS", spec.kafka.bootstrap_servers),
        ("DEDUP_INPUT_TOPIC", spec.kafka.input_topic),
        ("DEDUP_OUTPUT_TOPIC", spec.kafka.output_topic),
        ("DEDUP_DEAD_LETTER_TOPIC", spec.kafka.dead_letter_topic),
        ("DEDUP_CONSUMER_GROUP", spec.kafka.consumer_group),
        ("DEDUP_PARTITION", str(partition)),
        ("DEDUP_PIPELINE", spec.name),
        ("DEDUP_STORE_PATH", names.STORE_PATH),
        ("DEDUP_ID_SOURCE", spec.message_id.source),
        ("DEDUP_ID_FIELD", spec.message_id.field),
        ("DEDUP_WINDOW_DURATION", spec.window.duration),
        (
            "DEDUP_WINDOW_MAX_KEYS",
            None if spec.window.max_keys is None else str(spec.window.max_keys),
        ),
        ("DEDUP_BATCH_SIZE", str(spec.worker.batch_size)),
        ("DEDUP_LINGER_MS", str(spec.worker.linger_ms)),
        ("DEDUP_BLOCK_CACHE_MB", str(spec.worker.block_cache_mb)),
        ("DEDUP_LOOKUP_THREADS", str(spec.worker.resources.lookup_threads())),
        ("DEDUP_METRICS_PORT", str(names.METRICS_PORT)),
        ("DEDUP_LEASE_NAME", names.lease(spec.name, partition)),
        ("DEDUP_LEASE_DURATION", f"{spec.failover.lease_duration_seconds}s"),
        ("DEDUP_LOG_LEVEL", spec.worker.log_level),
        ("DEDUP_LOG_FORMAT", "json"),
    ]
    if spec.ownership:
        # owner(id) = murmur2(id) % workers: worker w reads input and internal-topic
        # partitions q with q % workers == w and forwards what it does not own. Not for a
        # pipeline that ran before ownership (OwnershipOff): its pods stay as they were.
        plain += [
            ("DEDUP_OWNED_TOPIC", spec.owned_topic),
            ("DEDUP_WORKERS", str(spec.workers)),
        ]
        if spec.ownership_switch:
            # switched from OwnershipOff: the worker completes a store written before
            # ownership (the ids it owns from every other output partition over the
            # window) and marks it an ownership store; without this a worker refuses such
            # a store (exit 5). Kept once converted: removing it would roll every pod.
            plain.append(("DEDUP_OWNERSHIP_SWITCH", "true"))
        if spec.finalized_release is not None:
            # the upgrade is finalized: the store is written at the newest format (the
            # releases before cannot open it; a rollback is refused by dedupctl's guard)
            plain.append(("DEDUP_FINALIZED", "true"))
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plain if v is not None]
    env += [
        {"name": "DEDUP_NAMESPACE", **_field("metadata.namespace")},
        {"name": "DEDUP_HOLDER_IDENTITY", **_field("metadata.name")},
        {"name": "DEDUP_METRICS_ADDRESS", **_field("status.podIP")},
    ]
    return env + kafka_env(spec)


def _affinity(spec: PipelineSpec) -> dict[str, Any]:
    """The user's affinity plus preferred anti-affinity spreading the pipeline's workers
    over nodes (strongly) and zones."""
    affinity: dict[str, Any] = copy.deepcopy(dict(spec.worker.affinity or {}))
    anti = affinity.setdefault("podAntiAffinity", {})
    preferred = anti.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    selector = {"matchLabels": names.worker_selector(spec.name)}
    for weight, topology in ((100, HOSTNAME_TOPOLOGY), (50, ZONE_TOPOLOGY)):
        preferred.append(
            {
                "weight": weight,
                "podAffinityTerm": {"labelSelector": selector, "topologyKey": topology},
            }
        )
    return affinity


def _probe(path: str, period: int, failures: int, initial_delay: int = 0) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": names.METRICS_PORT_NAME},
        "initialDelaySeconds": initial_delay,
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def worker_pod_template(spec: PipelineSpec, partition: int) -> dict[str, Any]:
    """The pod `spec` of partition's worker, the same for every epoch."""
    container = {
        "name": names.CONTAINER,
        "image": spec.worker.image,
        "command": [names.WORKER_COMMAND],
        "env": worker_env(spec, partition),
        "ports": [
            {
                "name": names.METRICS_PORT_NAME,
                "containerPort": names.METRICS_PORT,
                "protocol": "TCP",
            }
        ],
        "resources": spec.worker.resources.as_dict(),
        # a worker that exits on an error leaves its last lines (its one ERROR line) in
        # its status: how the operator learns a store was refused (StoreTooNew)
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": names.STORE_VOLUME, "mountPath": names.STORE_MOUNT},
            {"name": names.TMP_VOLUME, "mountPath": "/tmp"},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "readinessProbe": _probe("/readyz", period=2, failures=3),
        "livenessProbe": _probe("/healthz", period=10, failures=6, initial_delay=10),
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": names.service_account(spec.name),
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": names.RUN_AS_USER,
            "runAsGroup": names.RUN_AS_USER,
            "fsGroup": names.RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {
                "name": names.STORE_VOLUME,
                "persistentVolumeClaim": {"claimName": names.volume_claim(spec.name, partition)},
            },
            {"name": names.TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
        ],
        "affinity": _affinity(spec),
    }
    if spec.worker.node_selector:
        pod_spec["nodeSelector"] = dict(spec.worker.node_selector)
    if spec.worker.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.worker.tolerations]
    return pod_spec


def template_hash(spec: PipelineSpec, partition: int) -> str:
    """Hash of the worker pod template: differs iff the pod would differ. Remembered per
    (spec, partition): every pass compares each partition's pod with it, and building
    and hashing the template costs ~0.13 ms (a spec is frozen: equal specs share it; one
    holding the user's node selector, tolerations or affinity, dicts, is not hashable:
    remembered by its repr instead, ~0.02 ms)."""
    key: tuple[Hashable, int] = (spec, partition)
    try:
        found = _remembered.get(key)
    except TypeError:
        key = (repr(spec), partition)
        found = _remembered.get(key)
    if found is None:
        if len(_remembered) >= REMEMBERED_HASHES:
            _remembered.clear()
        text = json.dumps(worker_pod_template(spec, partition), sort_keys=True)
        found = _remembered[key] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return found


REMEMBERED_HASHES = 8192
_remembered: dict[tuple[Hashable, int], str] = {}


def worker_pod(
    spec: PipelineSpec,
    partition: int,
    epoch: int,
    owner: Owner,
    avoid_node: str | None = None,
) -> dict[str, Any]:
    """Partition's worker for `epoch` (>= 1); `avoid_node` keeps a replacement off the
    node it replaces."""
    pod_spec = worker_pod_template(spec, partition)
    pod_spec["containers"][0]["env"].append({"name": "DEDUP_EPOCH", "value": str(epoch)})
    if avoid_node:
        node_affinity = pod_spec["affinity"].setdefault("nodeAffinity", {})
        required = node_affinity.setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
        )
        terms = required.setdefault("nodeSelectorTerms", [])
        if not terms:
            terms.append({})
        away = {"key": "metadata.name", "operator": "NotIn", "values": [avoid_node]}
        for term in terms:
            term.setdefault("matchFields", []).append(away)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(
            names.worker_pod(spec.name, partition, epoch),
            owner,
            names.worker_labels(spec.name, partition, epoch),
            {
                names.ANNOTATION_SPEC_HASH: template_hash(spec, partition),
                names.ANNOTATION_OPERATOR_VERSION: VERSION,
            },
        ),
        "spec": pod_spec,
    }
