"""DedupPipeline bodies for the operator on a cluster (tests, benches): one builder, the tests
add what they are about (failover timings, reconciliation, storage options)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dedup_contract import names

WORKER_ON_CLUSTER: dict[str, Any] = {
    "image": "dedup-operator:dev",
    "resources": {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    },
}
"""The worker of a pipeline on the local cluster: the checkout's image, small requests."""


def pipeline_body(
    name: str,
    bootstrap: str,
    topic: str,
    partitions: int = 1,
    *,
    dead_letters: bool = True,
    kafka_fields: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """`topic` in, `<topic>-out` out (`<topic>-dlq` for dead letters), ids in JSON field
    `messageId`, a 1h window; `kafka_fields` adds or replaces fields of spec.kafka (an
    output of its own, a consumer group), `spec` top-level spec fields."""
    kafka = {"bootstrapServers": bootstrap, "inputTopic": topic, "outputTopic": f"{topic}-out"}
    if dead_letters:
        kafka["deadLetterTopic"] = f"{topic}-dlq"
    kafka.update(kafka_fields or {})
    return {
        "apiVersion": f"{names.GROUP}/{names.VERSION}",
        "kind": names.KIND,
        "metadata": {"name": name},
        "spec": {
            "kafka": kafka,
            "partitions": partitions,
            "messageId": {"source": "jsonField", "field": "messageId"},
            "window": {"duration": "1h"},
            **spec,
        },
    }


def cluster_pipeline_body(
    name: str,
    bootstrap: str,
    topic: str,
    storage_class: str,
    partitions: int = 1,
    *,
    worker: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pipeline whose workers run on the local cluster (`worker` adds worker fields)."""
    return pipeline_body(
        name,
        bootstrap,
        topic,
        partitions,
        worker={**WORKER_ON_CLUSTER, **(worker or {})},
        storage={"size": "1Gi", "storageClassName": storage_class},
        **spec,
    )
