"""What a worker is told to do: its share (one partition number) of one pipeline, and how.

Filled from the CLI flags / environment (standalone) or from the pod spec the operator
renders (in Kubernetes); the same dataclass either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dedup_contract.ids import IdSpec
from dedup_contract.names import default_consumer_group
from dedup_contract.store import Ownership, StoreConfig, StoreOwner
from dedup_contract.window import WindowPolicy


def transactional_id(namespace: str, pipeline: str, partition: int) -> str:
    """The producer's `transactional.id`: stable per partition, so a replacement worker
    fences any zombie of the same partition at the broker (epoch bump)."""
    return f"dedup/{namespace}/{pipeline}/p{partition}"


@dataclass(frozen=True)
class LeaseSettings:
    """The partition's Lease this worker must hold to commit (in Kubernetes; docs/design.md,
    "The partition Lease"). Absent, the worker runs standalone and only Kafka's
    transactional fence guards it."""

    name: str  # `<pipeline>-p<N>` in the pipeline's namespace
    holder_identity: str  # the pod's name, `<pipeline>-p<N>-e<epoch>`
    epoch: int  # the epoch this worker was started for; the Lease's leaseTransitions
    duration_s: int = 15
    # how long to wait for an older epoch's hold to expire; None = 2 x duration
    acquire_timeout_s: int | None = None
    kubeconfig: Path | None = None  # None: in-cluster config

    def __post_init__(self) -> None:
        if not self.name or not self.holder_identity:
            raise ValueError("the Lease needs a name and a holder identity")
        if self.epoch < 1:
            raise ValueError(f"--epoch must be >= 1, got {self.epoch}")
        if self.duration_s < 1:
            raise ValueError(f"--lease-duration must be at least 1s, got {self.duration_s}s")
        if self.acquire_timeout_s is not None and self.acquire_timeout_s < 0:
            raise ValueError("--lease-acquire-timeout must not be negative")

    @property
    def acquire_timeout(self) -> int:
        return 2 * self.duration_s if self.acquire_timeout_s is None else self.acquire_timeout_s


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
    metrics_address: str = "0.0.0.0"  # in a pod: its IP (downward API status.podIP)
    lease: LeaseSettings | None = None
    # Ownership (dedup_worker.routing): the pipeline's internal topic, and the number of
    # workers the ids are divided among. Unset: the worker reads input partition
    # `partition` only and publishes every new id in it (producers must key by id).
    owned_topic: str | None = None
    workers: int | None = None
    # a store written before ownership is switched (the pipeline's switch, with every
    # worker of it stopped first), not refused
    ownership_switch: bool = False
    # the pipeline's upgrade is finalized: the store is written at format 3, which the
    # releases before it cannot open (store_format.FORMAT_VERSION_FINALIZED)
    finalized: bool = False

    def __post_init__(self) -> None:
        if self.partition < 0:
            raise ValueError(f"partition must be >= 0, got {self.partition}")
        if (self.owned_topic is None) != (self.workers is None):
            raise ValueError("--owned-topic and --workers go together (ownership)")
        if self.ownership_switch and self.owned_topic is None:
            raise ValueError("--ownership-switch needs --owned-topic and --workers")
        if self.finalized and self.owned_topic is None:
            raise ValueError("--finalized needs --owned-topic and --workers")
        if self.workers is not None and not 0 <= self.partition < self.workers:
            raise ValueError(
                f"--partition {self.partition} is not one of --workers {self.workers} "
                f"(0..{self.workers - 1})"
            )
        if self.owned_topic is not None and self.owned_topic in (
            self.input_topic,
            self.output_topic,
            self.dead_letter_topic,
        ):
            raise ValueError(
                "the internal topic must differ from the input, output and dead-letter topics"
            )
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
    def ownership(self) -> Ownership | None:
        """The store's ownership generation (None: the worker runs without ownership)."""
        return None if self.workers is None else Ownership(self.workers)

    @property
    def group(self) -> str:
        return self.consumer_group or default_consumer_group(self.pipeline)

    @property
    def transactional_id(self) -> str:
        return transactional_id(self.namespace, self.pipeline, self.partition)
