"""Smoke tests of the real control plane and of the DedupPipeline CRD it serves.

Nothing is mocked: etcd, kube-apiserver, kube-controller-manager and kubectl are the
binaries `make setup-kube` builds. The schema and CEL rules of
crds/dedup.io_dedupPipelines.yaml are checked by the apiserver itself, and garbage
collection by the controller-manager.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_local.paths import versions
from support.kube_fixtures import KubeCluster, KubeNamespace

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]

GROUP, VERSION, PLURAL = "dedup.io", "v1alpha1", "deduppipelines"


def pipeline(name: str, **spec_changes: Any) -> dict[str, Any]:
    """A valid DedupPipeline setting every part of the spec (fields: docs/crd.md), with spec
    overrides."""
    spec: dict[str, Any] = {
        "kafka": {
            "bootstrapServers": "kafka-bootstrap:9092",
            "inputTopic": "events",
            "outputTopic": "events-deduped",
            "deadLetterTopic": "events-dlq",
            "consumerGroup": "dedup-events",
            "securityRef": {"secretName": "kafka-client"},
        },
        "partitions": 12,
        "messageId": {"source": "jsonField", "field": "messageId"},
        "window": {"duration": "672h", "maxKeys": 2_000_000_000},
        "worker": {
            "image": "ghcr.io/example/dedup-operator:0.1.0",
            "batchSize": 5000,
            "lingerMs": 20,
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            "nodeSelector": {"pool": "dedup"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "dedup"}],
        },
        "storage": {"size": "100Gi", "storageClassName": "gp3"},
        "failover": {"leaseDuration": "15s", "releaseVolume": "OutOfServiceTaint"},
        "reconciliation": {
            "schedule": "0 3 * * *",
            "lookback": "24h",
            "spark": {
                "image": "ghcr.io/example/dedup-operator:0.1.0",
                "executors": 4,
                "master": "k8s",
            },
        },
    }
    for path, value in spec_changes.items():
        *parents, leaf = path.split("__")
        node = spec
        for key in parents:
            node = node[key]
        if value is DELETE:
            del node[leaf]
        else:
            node[leaf] = copy.deepcopy(value)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DedupPipeline",
        "metadata": {"name": name},
        "spec": spec,
    }


DELETE = object()


def custom(ns: KubeNamespace) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(ns.api_client)


def create(ns: KubeNamespace, body: dict[str, Any]) -> dict[str, Any]:
    result = custom(ns).create_namespaced_custom_object(GROUP, VERSION, ns.name, PLURAL, body)
    assert isinstance(result, dict)
    return result


def rejection(call: Callable[[], object]) -> str:
    """Run an API call that must be rejected as invalid; return the Status message."""
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 422, (
        f"expected 422 Invalid, got {info.value.status}: {info.value.body}"
    )
    return str(json.loads(info.value.body or "{}").get("message", info.value.body))


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)
    return time.monotonic() - t0


def test_control_plane_serves_pinned_version(kube: KubeCluster) -> None:
    info = client.VersionApi(kube.api_client).get_code()
    assert info.git_version == f"v{versions()['KUBERNETES_VERSION']}"
    readyz = kube.control_plane.kubectl("get", "--raw", "/readyz?verbose").stdout
    assert "readyz check passed" in readyz


def test_valid_pipeline_is_accepted_with_defaults_and_columns(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    ns = kube_namespace
    created = create(ns, pipeline("events"))
    assert created["spec"]["partitions"] == 12
    # Schema defaults are applied by the apiserver.
    assert created["spec"]["failover"]["nodeLostAfter"] == "20s"
    assert created["spec"]["storage"]["retainOnDelete"] is True
    # The minimal form (id from the key, size-bounded window) is valid too.
    minimal = pipeline("minimal", messageId={"source": "key"}, window={"maxKeys": 1000})
    for key in ("worker", "storage", "failover", "reconciliation"):
        del minimal["spec"][key]
    del minimal["spec"]["kafka"]["deadLetterTopic"]
    create(ns, minimal)

    # The status subresource takes status; the printer columns show it.
    custom(ns).patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        ns.name,
        PLURAL,
        "events",
        {
            "status": {
                "phase": "Running",
                "readyPartitions": 11,
                "duplicatesDropped": 4242,
                "observedGeneration": 1,
            }
        },
        _content_type="application/merge-patch+json",
    )
    table = ns.cluster.control_plane.kubectl("get", "dp", "-n", ns.name, "events").stdout
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "READY", "PARTITIONS", "DUPLICATES", "AGE"]
    assert row.split()[:5] == ["events", "Running", "11", "12", "4242"]


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("partitions-zero", {"partitions": 0}, "should be greater than or equal to 1"),
    (
        "source-enum",
        {"messageId__source": "body"},
        'supported values: "jsonField", "header", "key"',
    ),
    ("same-topics", {"kafka__outputTopic": "events"}, "outputTopic must differ from inputTopic"),
    (
        "dlq-is-input",
        {"kafka__deadLetterTopic": "events"},
        "deadLetterTopic must differ from inputTopic and outputTopic",
    ),
    (
        "header-no-field",
        {"messageId": {"source": "header"}},
        "field is required when source is jsonField or header",
    ),
    (
        "json-no-field",
        {"messageId": {"source": "jsonField"}},
        "field is required when source is jsonField or header",
    ),
    ("bad-duration", {"window__duration": "28 days"}, "spec.window.duration in body should match"),
    ("empty-window", {"window": {}}, "window needs duration or maxKeys (or both)"),
    (
        "max-keys-zero",
        {"window__maxKeys": 0},
        "spec.window.maxKeys in body should be greater than or equal to 1",
    ),
    ("no-kafka", {"kafka": DELETE}, "spec.kafka: Required value"),
    (
        "bad-topic-name",
        {"kafka__inputTopic": "events/raw"},
        "spec.kafka.inputTopic in body should match",
    ),
    (
        "bad-size",
        {"storage__size": "lots"},
        "storage.size must be a positive quantity such as 100Gi",
    ),
]


@pytest.mark.parametrize(("case", "changes", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_pipeline_is_rejected_with_clear_message(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    case: str,
    changes: dict[str, Any],
    message: str,
) -> None:
    body = rejection(lambda: create(kube_namespace, pipeline(case, **changes)))
    assert message in body


def test_kubectl_apply_of_bad_pipeline_fails_with_message(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    bad = pipeline("same", kafka__outputTopic="events")
    result = kube_namespace.cluster.control_plane.kubectl(
        "apply", "-n", kube_namespace.name, "-f", "-", input=yaml.safe_dump(bad), check=False
    )
    assert result.returncode != 0
    assert "outputTopic must differ from inputTopic" in result.stderr


def test_a_field_the_crd_does_not_have_is_refused_by_kubectl_and_pruned_by_the_api(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    """`spec.storage.snapshots` was removed (nothing acted on it). The schema is
    structural and preserves no unknown fields under spec, so the API server prunes
    them. kubectl asks for strict field validation (its default `--validate=strict`)
    and is refused with the field's name; a client that does not ask (fieldValidation
    Warn, the API's default) gets the object without the field and a warning."""
    ns = kube_namespace
    snapshots = {"schedule": "0 */6 * * *", "volumeSnapshotClassName": "csi-snap", "keep": 4}
    old = pipeline("snapshots", storage={"size": "100Gi", "snapshots": snapshots})
    result = ns.cluster.control_plane.kubectl(
        "apply", "-n", ns.name, "-f", "-", input=yaml.safe_dump(old), check=False
    )
    assert result.returncode != 0
    assert 'unknown field "spec.storage.snapshots"' in result.stderr
    with pytest.raises(ApiException) as strict:
        custom(ns).create_namespaced_custom_object(
            GROUP, VERSION, ns.name, PLURAL, old, field_validation="Strict"
        )
    assert strict.value.status == 400
    message = json.loads(strict.value.body or "{}").get("message", "")
    assert 'unknown field "spec.storage.snapshots"' in message
    created = create(ns, old)
    assert created["spec"]["storage"] == {"size": "100Gi", "retainOnDelete": True}


def test_partitions_can_grow_but_not_shrink(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    ns = kube_namespace
    create(ns, pipeline("events"))
    api = custom(ns)

    def set_partitions(n: int) -> object:
        return api.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            ns.name,
            PLURAL,
            "events",
            {"spec": {"partitions": n}},
            _content_type="application/merge-patch+json",
        )

    body = rejection(lambda: set_partitions(6))
    assert "partitions cannot be decreased" in body
    set_partitions(16)
    current = api.get_namespaced_custom_object(GROUP, VERSION, ns.name, PLURAL, "events")
    assert isinstance(current, dict)
    assert current["spec"]["partitions"] == 16
    assert "partitions cannot be decreased" in rejection(lambda: set_partitions(15))


def _owner_ref(obj: dict[str, Any] | Any, api_version: str, kind: str) -> client.V1OwnerReference:
    meta = obj["metadata"] if isinstance(obj, dict) else obj.metadata
    name = meta["name"] if isinstance(meta, dict) else meta.name
    uid = meta["uid"] if isinstance(meta, dict) else meta.uid
    return client.V1OwnerReference(api_version=api_version, kind=kind, name=name, uid=uid)


def _dependent(ns: KubeNamespace, name: str, owner: client.V1OwnerReference) -> None:
    client.CoreV1Api(ns.api_client).create_namespaced_config_map(
        ns.name,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name, owner_references=[owner]),
            data={"owned": "yes"},
        ),
    )


def _gone(ns: KubeNamespace, name: str) -> Callable[[], bool]:
    core = client.CoreV1Api(ns.api_client)

    def check() -> bool:
        try:
            core.read_namespaced_config_map(name, ns.name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    return check


def test_garbage_collector_deletes_dependents_of_deleted_configmap(
    kube_namespace: KubeNamespace,
) -> None:
    ns = kube_namespace
    core = client.CoreV1Api(ns.api_client)
    owner = core.create_namespaced_config_map(
        ns.name, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"), data={"a": "b"})
    )
    _dependent(ns, "dependent", _owner_ref(owner, "v1", "ConfigMap"))
    time.sleep(0.5)
    assert not _gone(ns, "dependent")(), "the dependent must live while its owner does"
    core.delete_namespaced_config_map("owner", ns.name)
    waited = wait_until(_gone(ns, "dependent"), 60, "GC to delete the dependent ConfigMap")
    print(f"garbage collected after {waited:.1f}s")


def test_garbage_collector_deletes_dependents_of_deleted_pipeline(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    ns = kube_namespace
    owner = create(ns, pipeline("events"))
    _dependent(ns, "events-config", _owner_ref(owner, f"{GROUP}/{VERSION}", "DedupPipeline"))
    custom(ns).delete_namespaced_custom_object(GROUP, VERSION, ns.name, PLURAL, "events")
    # Quick because the fixture installs the CRD before the controller-manager starts;
    # kinds added later are only picked up by the GC's 30s discovery resync.
    waited = wait_until(_gone(ns, "events-config"), 120, "GC to delete the pipeline's ConfigMap")
    print(f"garbage collected after {waited:.1f}s")


def test_kubectl_and_helm_binaries_run(kube: KubeCluster) -> None:
    kubectl = kube.control_plane.kubectl("version", "-o", "json").stdout
    assert json.loads(kubectl)["serverVersion"]["gitVersion"].startswith("v1.")
    helm = subprocess.run(
        [str(kube.control_plane.binaries.helm), "version", "--short"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert helm.stdout.startswith(f"v{versions()['HELM_VERSION']}")


def test_scheduler_binds_pod_to_registered_node(kube_namespace: KubeNamespace) -> None:
    """kube-scheduler runs: a pod is bound to a (kubelet-less) node that reports Ready."""
    ns = kube_namespace
    core = client.CoreV1Api(ns.api_client)
    node_name = f"node-{ns.name[-6:]}"
    core.create_node(
        client.V1Node(
            metadata=client.V1ObjectMeta(name=node_name, labels={"dedup.io/smoke-node": node_name})
        )
    )
    try:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        capacity = {"cpu": "4", "memory": "8Gi", "pods": "110"}
        core.patch_node_status(
            node_name,
            {
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                }
            },
            _content_type="application/strategic-merge-patch+json",
        )
        core.create_namespaced_pod(
            ns.name,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="sleeper"),
                spec=client.V1PodSpec(
                    containers=[client.V1Container(name="main", image="example.invalid/sleeper")],
                    node_selector={"dedup.io/smoke-node": node_name},
                    tolerations=[client.V1Toleration(operator="Exists")],
                ),
            ),
        )

        def bound() -> bool:
            pod = core.read_namespaced_pod("sleeper", ns.name)
            return pod.spec is not None and pod.spec.node_name == node_name

        wait_until(bound, 30, "the scheduler to bind the pod")
    finally:
        core.delete_node(node_name)
