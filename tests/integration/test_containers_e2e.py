"""The operator's node-loss failover with its workers in real containers from the built
image (podman, runc: the image's user 65532, read-only root, the store on the partition's
volume given the pods' fsGroup) instead of processes of the checkout: a node killed during
traffic, the partition moves with its volume, the output exact (the same scenario and
checks as test_operator_e2e.py's process-runtime test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from dedup_contract import names
from dedup_local.cluster import LocalCluster
from dedup_local.kafka import KafkaBroker
from support.cluster_fixtures import ClusterNamespace
from support.kafka_fixtures import NewTopic
from support.pipeline_traffic import lose_a_node_during_traffic, topics

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("containers")]


def test_node_loss_moves_a_containerised_worker_with_its_volume(
    container_cluster: LocalCluster,
    container_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    topic = topics(kafka, new_topic, 2)
    lose_a_node_during_traffic(
        container_cluster, container_namespace.name, kafka, topic, tmp_path, None
    )
    # Every worker that ran, the replacement included, ran in a container from the image.
    pods = client.CoreV1Api(container_namespace.api_client).list_namespaced_pod(
        container_namespace.name, label_selector=f"{names.LABEL_PIPELINE}=events"
    )
    statuses = [s for pod in pods.items for s in pod.status.container_statuses or []]
    assert statuses and all((s.container_id or "").startswith("podman://") for s in statuses)
