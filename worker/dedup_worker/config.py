"""What a worker is told to do: one partition of one pipeline, and how.

Filled from the CLI flags / environment (standalone) or from the pod spec the operator
renders (in Kubernetes); the same dataclass either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dedup_worker.ids import IdSpec
from dedup_worker.store import StoreConfig, StoreOwner
from dedup_worker.window import WindowPolicy


def transactional_id(namespace: str, pipeline: str, partition: int) -> str:
    """The producer's `transactional.id`: stable per partition, so a replacement worker
    fences any zombie of the same partition at the broker (epoch bump)."""
    return f"dedup/{namespace}/{pipeline}/p{partition}"


def default_consumer_group(pipeline: str) -> str:
    """The consumer group whose committed offsets are the input position."""
    return f"dedup-{pipeline}"


@dataclass(frozen=True)
class WorkerConfig:
    bootstrap_servers: str
    input_topic: str
    output_topic: str
    partition: int
    store_path: Path
    window: WindowPolicy
    pipeline: str
    namespace: str = "default"
    dead_letter_topic: str | None = None
    consumer_group: str | None = None
    id_spec: IdSpec = field(default_factory=IdSpec)
    batch_size: int = 5000
    linger_ms: int = 20
    transaction_timeout_ms: int = 60_000
    store: StoreConfig = field(default_factory=StoreConfig)
    # Extra librdkafka settings (security, tuning), applied to consumer and producer.
    kafka_settings: dict[str, str] = field(default_factory=dict)
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        if self.partition < 0:
            raise ValueError(f"partition must be >= 0, got {self.partition}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.linger_ms < 0:
            raise ValueError(f"linger must be >= 0 ms, got {self.linger_ms}")
        if self.input_topic == self.output_topic:
            raise ValueError("the output topic must differ from the input topic")
        if self.dead_letter_topic in (self.input_topic, self.output_topic):
            raise ValueError("the dead-letter topic must differ from the input and output topics")

    @property
    def owner(self) -> StoreOwner:
        return StoreOwner(
            namespace=self.namespace, pipeline=self.pipeline, partition=self.partition
        )

    @property
    def group(self) -> str:
        return self.consumer_group or default_consumer_group(self.pipeline)

    @property
    def transactional_id(self) -> str:
        return transactional_id(self.namespace, self.pipeline, self.partition)
