"""Ownership under the operator on the local cluster: the input topic grows under a
running pipeline (2 -> 4 partitions) while ids of the window are repeated, keyed by id;
the output stays exact, and no worker restarts or moves to a new epoch."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from kubernetes import client

from dedup_contract import names
from dedup_local import kafka as local_kafka
from dedup_local.kafka import KafkaBroker
from dedup_local.pod_health import log_problems, unhealthy
from dedup_local.real_cluster import RealCluster
from support.cluster_fixtures import ClusterNamespace
from support.kafka_fixtures import NewTopic
from support.operator_helpers import condition, get_pipeline, running_operator, wait_for
from support.ownership_pipeline import output_id, produce
from support.pipeline_traffic import create_pipeline, pipeline_body, ready_pipeline, topics

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("local_crds"),
    pytest.mark.cluster_group("local-cluster"),
]


def published(bootstrap: str, topic: str) -> Counter[str]:
    out = local_kafka.read_committed(bootstrap, f"{topic}-out", [0, 1], settle_s=1)
    return Counter(output_id(m) for m in out)


def test_the_input_topic_grows_under_a_running_pipeline(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns = cluster_namespace.name
    api = local_cluster.api_client()
    topic = topics(kafka, new_topic, 2)
    selector = f"{names.LABEL_PIPELINE}=grow"
    core = client.CoreV1Api(api)
    with running_operator(local_cluster.kubeconfig_path, ns, tmp_path / "operator.log") as op:
        create_pipeline(
            api, ns, pipeline_body("grow", kafka.bootstrap, topic, 2, local_cluster.storage_class)
        )
        ready_pipeline(api, ns, "grow", 2)
        ids = [f"g-{i}" for i in range(1500)]
        produce(kafka.bootstrap, topic, ((i, i, None) for i in ids))  # keyed by id, murmur2
        wait_for(lambda: len(published(kafka.bootstrap, topic)) >= len(ids), 120, "the ids")
        pods = {
            p.metadata.name: p.metadata.uid
            for p in core.list_namespaced_pod(ns, label_selector=selector).items
        }
        assert sorted(pods) == ["grow-p0-e1", "grow-p1-e1"]

        kafka.grow_topic(topic, 4)  # the producer below must see all 4
        more = [f"g-new-{i}" for i in range(500)]
        where = produce(kafka.bootstrap, topic, ((i, i, None) for i in ids + more))
        assert sum(p >= 2 for p in where.values()) > 500, "the repeats reached the new partitions"
        wait_for(
            lambda: len(published(kafka.bootstrap, topic)) >= len(ids) + len(more),
            120,
            "the new ids",
        )
        time.sleep(5)  # a repeat published late would show now
        counts = published(kafka.bootstrap, topic)
        assert counts == Counter(ids + more), (
            f"{sum(c > 1 for c in counts.values())} ids published more than once"
        )
        after = core.list_namespaced_pod(ns, label_selector=selector).items
        assert {p.metadata.name: p.metadata.uid for p in after} == pods, "no worker replaced"
        assert all(
            s.restart_count == 0
            for p in after
            for s in (p.status.container_statuses if p.status else None) or []
        )
        found = get_pipeline(api, ns, "grow") or {}
        epochs = {e["partition"]: e["epoch"] for e in found["status"]["partitions"]}
        assert epochs == {0: 1, 1: 1}

        def grown() -> dict[str, str] | None:  # checked every --topic-check-interval
            c = condition(get_pipeline(api, ns, "grow"), "TopicReady")
            return c if c and c["status"] == "True" and "4 partitions" in c["message"] else None

        wait_for(grown, 60, "TopicReady to see 4 input partitions")
        assert unhealthy(local_cluster, ns, selector) == []
        assert log_problems(op.log()) == []
