"""The DedupPipeline API as a user meets it: `kubectl apply` of invalid pipelines fails
with a readable message from the real apiserver (schema + CEL rules of
crds/dedup.io_dedupPipelines.yaml), and the defaults the apiserver fills in are the ones
the operator's spec.py assumes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from dedup_operator.spec import PipelineSpec
from support.kube_fixtures import KubeCluster, KubeNamespace

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]

DELETE = object()


def pipeline(name: str = "events", **changes: Any) -> dict[str, Any]:
    """A valid, small pipeline with `a__b=value` overrides (DELETE removes a key)."""
    spec: dict[str, Any] = {
        "kafka": {
            "bootstrapServers": "kafka:9092",
            "inputTopic": "events",
            "outputTopic": "events-deduped",
            "deadLetterTopic": "events-dlq",
            "config": {"security.protocol": "SASL_SSL"},
            "securityRef": {"secretName": "kafka-client"},
        },
        "partitions": 4,
        "messageId": {"source": "jsonField", "field": "messageId"},
        "window": {"duration": "7d"},
        "worker": {"resources": {"limits": {"cpu": "2", "memory": "2Gi"}}},
        "storage": {"size": "10Gi", "storageClassName": "fast"},
    }
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            del node[leaf]
        else:
            node[leaf] = copy.deepcopy(value)
    return {
        "apiVersion": "dedup.io/v1alpha1",
        "kind": "DedupPipeline",
        "metadata": {"name": name},
        "spec": spec,
    }


def apply(ns: KubeNamespace, body: dict[str, Any]) -> tuple[int, str]:
    result = ns.cluster.control_plane.kubectl(
        "apply", "-n", ns.name, "-f", "-", input=yaml.safe_dump(body), check=False
    )
    return result.returncode, result.stderr


# (case, body, expected message in kubectl's stderr)
INVALID_NEW: list[tuple[str, dict[str, Any], str]] = [
    ("zero-partitions", pipeline(partitions=0), "should be greater than or equal to 1"),
    (
        "same-topics",
        pipeline(kafka__outputTopic="events"),
        "outputTopic must differ from inputTopic",
    ),
    (
        "dlq-is-output",
        pipeline(kafka__deadLetterTopic="events-deduped"),
        "deadLetterTopic must differ from inputTopic and outputTopic",
    ),
    ("empty-window", pipeline(window={}), "window needs duration or maxKeys (or both)"),
    ("window-zero", pipeline(window__duration="0h"), "window.duration must be longer than zero"),
    (
        "window-fraction",
        pipeline(window__duration="1.5h"),
        "spec.window.duration in body should match",
    ),
    (
        "header-without-field",
        pipeline(messageId={"source": "header"}),
        "field is required when source is jsonField or header",
    ),
    (
        "source-enum",
        pipeline(messageId__source="body"),
        'supported values: "jsonField", "header", "key"',
    ),
    (
        "inline-password",
        pipeline(kafka__config={"sasl.password": "hunter2"}),
        "kafka.config must not hold credentials",
    ),
    (
        "limit-below-request",
        pipeline(worker__resources={"requests": {"cpu": "2"}, "limits": {"cpu": "500m"}}),
        "each resource limit must be at least its request",
    ),
    (
        "cpu-not-quantity",
        pipeline(worker__resources={"limits": {"cpu": "two"}}),
        "must be a quantity such as 500m, 2 or 1Gi",
    ),
    ("bad-size", pipeline(storage__size="lots"), "storage.size must be a positive quantity"),
    (
        "release-enum",
        pipeline(failover__releaseVolume="Pray"),
        'supported values: "OutOfServiceTaint", "WaitForDetach", "External"',
    ),
    (
        "lease-zero",
        pipeline(failover__leaseDuration="0s"),
        "failover.leaseDuration must be at least 1s",
    ),
    (
        "node-lost-days",
        pipeline(failover__nodeLostAfter="1d"),
        "spec.failover.nodeLostAfter in body should match",
    ),
    (
        "batch-zero",
        pipeline(worker__batchSize=0),
        "spec.worker.batchSize in body should be greater than or equal to 1",
    ),
    (
        "no-bootstrap",
        pipeline(kafka__bootstrapServers=DELETE),
        "spec.kafka.bootstrapServers: Required value",
    ),
    (
        "long-name",
        pipeline(name="a" * 41),
        "metadata.name must be at most 40 characters",
    ),
    (
        # issue 18: the driver would send its service-account token in clear to any host
        "http-spark-master",
        pipeline(
            reconciliation={"schedule": "0 3 * * *", "spark": {"master": "k8s://http://x:80"}}
        ),
        "an http master would send the driver's service-account token unencrypted",
    ),
    (
        "spark-master-elsewhere",
        pipeline(reconciliation={"schedule": "@daily", "spark": {"master": "yarn"}}),
        "spark.master must be k8s (the in-cluster API server), local[N]",
    ),
]


@pytest.mark.parametrize(("case", "body", "message"), INVALID_NEW, ids=[c[0] for c in INVALID_NEW])
def test_kubectl_apply_rejects_invalid_pipeline(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    case: str,
    body: dict[str, Any],
    message: str,
) -> None:
    code, stderr = apply(kube_namespace, body)
    assert code != 0, f"{case} was accepted"
    assert message in stderr, stderr


# (case, change applied to an existing pipeline, expected message)
INVALID_UPDATES: list[tuple[str, dict[str, Any], str]] = [
    ("shrink-partitions", pipeline(partitions=3), "partitions cannot be decreased"),
    ("other-input", pipeline(kafka__inputTopic="clicks"), "inputTopic cannot change"),
    ("other-id", pipeline(messageId__field="id"), "messageId cannot change"),
    ("shrink-volume", pipeline(storage__size="5Gi"), "storage.size cannot shrink"),
    ("other-class", pipeline(storage__storageClassName="slow"), "storageClassName cannot change"),
]


def test_kubectl_apply_rejects_invalid_changes(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    code, stderr = apply(kube_namespace, pipeline())
    assert code == 0, stderr
    failures = []
    for case, body, message in INVALID_UPDATES:
        code, stderr = apply(kube_namespace, body)
        if code == 0 or message not in stderr:
            failures.append(f"{case}: exit {code}: {stderr.strip()}")
    assert not failures, "\n".join(failures)
    # What may change does: more partitions, a bigger volume, a new batch size.
    code, stderr = apply(
        kube_namespace, pipeline(partitions=6, storage__size="20Gi", worker__batchSize=100)
    )
    assert code == 0, stderr


def test_apiserver_defaults_are_the_ones_spec_py_assumes(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace
) -> None:
    minimal = {
        "apiVersion": "dedup.io/v1alpha1",
        "kind": "DedupPipeline",
        "metadata": {"name": "minimal"},
        "spec": {
            "kafka": {"bootstrapServers": "k:9092", "inputTopic": "a", "outputTopic": "b"},
            "partitions": 2,
            "messageId": {"source": "key"},
            "window": {"maxKeys": 1000},
        },
    }
    code, stderr = apply(kube_namespace, minimal)
    assert code == 0, stderr
    stored = yaml.safe_load(
        kube_namespace.cluster.control_plane.kubectl(
            "get", "dp", "minimal", "-n", kube_namespace.name, "-o", "yaml"
        ).stdout
    )
    from_server = PipelineSpec.parse("minimal", kube_namespace.name, stored["spec"])
    from_code = PipelineSpec.parse("minimal", kube_namespace.name, minimal["spec"])
    assert from_server == from_code


@pytest.mark.parametrize("master", ["k8s", "local[2]", "local[*]", "k8s://https://10.96.0.1:443"])
def test_spark_masters_that_keep_the_token_in_the_cluster_are_accepted(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace, master: str
) -> None:
    body = pipeline(reconciliation={"schedule": "@daily", "spark": {"master": master}})
    code, stderr = apply(kube_namespace, body)
    assert code == 0, stderr


def test_example_pipeline_is_valid(dedup_crd: KubeCluster, kube_namespace: KubeNamespace) -> None:
    from dedup_local.paths import REPO_ROOT

    example = yaml.safe_load((REPO_ROOT / "examples" / "events-pipeline.yaml").read_text())
    example["metadata"]["namespace"] = kube_namespace.name
    code, stderr = apply(kube_namespace, example)
    assert code == 0, stderr
    PipelineSpec.parse("events", kube_namespace.name, example["spec"])
