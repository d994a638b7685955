"""A DedupPipeline's `spec` as typed, frozen objects with the CRD's defaults.

`PipelineSpec.parse(name, namespace, spec)` reads the spec as the API server serves it
(camelCase dict) or as a user wrote it (defaults missing): every default below equals the
one in crds/dedup.io_dedupPipelines.yaml (tests/unit/dedup_operator/test_spec.py keeps them equal), so
both give the same object. The schema already rejected what it can; `parse` raises
`SpecError` with a readable message for what slipped through (an object written before a
rule existed, or a value only code can judge).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from dedup_contract import names
from dedup_contract.ids import IdSource, IdSpec
from dedup_contract.kafka_settings import unreadable_setting
from dedup_contract.window import parse_duration_ms
from dedup_operator.failover import FailoverPolicy, ReleaseVolume

DEFAULT_IMAGE: Final = "dedup-operator:0.2.0"
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_SECRET_KEY: Final = "kafka-config"


class SpecError(ValueError):
    """A spec the operator cannot act on; the message says which field and why."""


# ---------------------------------------------------------------------- quantities
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][0-9]+)?$")
_SUFFIX: Final[dict[str, float]] = {
    "": 1,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity(text: str | int | float, what: str = "quantity") -> float:
    """The value of a Kubernetes quantity (`500m` -> 0.5, `2Gi` -> 2147483648)."""
    if isinstance(text, int | float):
        return float(text)
    match = _QUANTITY.match(text.strip())
    if not match:
        raise SpecError(f"{what}: {text!r} is not a quantity such as 500m, 2 or 1Gi")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return float(number) * 10.0 ** int(suffix[1:])
    return float(number) * _SUFFIX[suffix]


def duration(text: str, what: str) -> timedelta:
    try:
        return timedelta(milliseconds=parse_duration_ms(text))
    except ValueError as exc:
        raise SpecError(f"{what}: {exc}") from None


# --------------------------------------------------------------------------- parts
@dataclass(frozen=True)
class SecretRef:
    secret_name: str
    key: str = DEFAULT_SECRET_KEY


@dataclass(frozen=True)
class KafkaSpec:
    bootstrap_servers: str
    input_topic: str
    output_topic: str
    consumer_group: str
    dead_letter_topic: str | None = None
    # librdkafka settings without credentials, in the order given
    config: tuple[tuple[str, str], ...] = ()
    security_ref: SecretRef | None = None
    # the internal topic, named by the user (it must exist; the operator never creates
    # or deletes it); None: the operator's own `names.owned_topic`
    owned_topic: str | None = None


@dataclass(frozen=True)
class MessageIdSpec:
    source: IdSource = "jsonField"
    field: str = "messageId"


@dataclass(frozen=True)
class WindowSpec:
    duration: str | None = None  # as written (the worker parses the same grammar)
    max_keys: int | None = None

    @property
    def duration_ms(self) -> int | None:
        """The duration in milliseconds (None: a window bounded by maxKeys only)."""
        return None if self.duration is None else parse_duration_ms(self.duration)


@dataclass(frozen=True)
class ResourcesSpec:
    requests: tuple[tuple[str, str], ...] = (("cpu", "500m"), ("memory", "512Mi"))
    limits: tuple[tuple[str, str], ...] = (("cpu", "2"), ("memory", "2Gi"))

    def as_dict(self) -> dict[str, dict[str, str]]:
        return {"requests": dict(self.requests), "limits": dict(self.limits)}

    def lookup_threads(self) -> int:
        """The worker's `--lookup-threads`: its CPU limit rounded up (request if no limit),
        1..64. Threads beyond the CPUs it may use only contend."""
        cpu = dict(self.limits).get("cpu") or dict(self.requests).get("cpu")
        if cpu is None:
            return 2
        return max(1, min(64, math.ceil(quantity(cpu, "worker.resources cpu") - 1e-9)))


@dataclass(frozen=True)
class WorkerSpec:
    image: str = DEFAULT_IMAGE
    batch_size: int = 5000
    linger_ms: int = 20
    block_cache_mb: int = 64
    log_level: str = "INFO"
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    node_selector: tuple[tuple[str, str], ...] = ()
    # core/v1 objects passed through to the pod as written
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class StorageSpec:
    size: str = "10Gi"
    storage_class_name: str | None = None
    retain_on_delete: bool = True


@dataclass(frozen=True)
class FailoverSpec:
    # Defaults (the CRD's; docs/operations.md#failover, "Timings"): a node is lost after
    # two missed node-Lease renewals (the kubelet renews every 10 s), well before the node
    # lifecycle controller's 40-50 s grace; a false alarm is harmless (the worker keeps its own Lease, nothing is
    # fenced, the handover is cancelled). The partition Lease: renewed every 5 s, held for
    # 10 s by the worker, run out for others after 15 s unchanged on their own clock.
    node_lost_after: timedelta = timedelta(seconds=20)
    lease_duration: timedelta = timedelta(seconds=15)
    release_volume: ReleaseVolume = ReleaseVolume.OUT_OF_SERVICE_TAINT
    detach_timeout: timedelta = timedelta(minutes=10)
    schedule_timeout: timedelta = timedelta(minutes=2)

    @property
    def lease_duration_seconds(self) -> int:
        return max(1, math.ceil(self.lease_duration.total_seconds()))

    def policy(self) -> FailoverPolicy:
        return FailoverPolicy(
            node_lost_after=self.node_lost_after,
            release_volume=self.release_volume,
            detach_timeout=self.detach_timeout,
            schedule_timeout=self.schedule_timeout,
        )


@dataclass(frozen=True)
class SparkSpec:
    image: str | None = None  # None: the worker image
    executors: int = 2
    master: str = "k8s"


@dataclass(frozen=True)
class ReconciliationSpec:
    """The scheduled audit (helper "spark" renders its CronJob / ScheduledSparkApplication)."""

    schedule: str
    lookback: timedelta = timedelta(hours=24)
    spark: SparkSpec = field(default_factory=SparkSpec)


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    namespace: str
    kafka: KafkaSpec
    partitions: int
    message_id: MessageIdSpec
    window: WindowSpec
    worker: WorkerSpec = field(default_factory=WorkerSpec)
    storage: StorageSpec = field(default_factory=StorageSpec)
    failover: FailoverSpec = field(default_factory=FailoverSpec)
    reconciliation: ReconciliationSpec | None = None
    # upgrade.finalizedRelease: the release whose upgrade `dedupctl finalize-upgrade`
    # finalized; its workers write the newest store format (DEDUP_FINALIZED)
    finalized_release: str | None = None
    # Not a spec field: whether the workers own ids (`owner(id) % workers`, misrouted
    # records forwarded through the internal topic). False only for a pipeline that ran
    # before ownership existed (dedup_operator.ownership_generation decides, from the status): its
    # workers are rendered as before. Under ownership `partitions` is the recorded
    # worker count (status.ownership.workers), not necessarily spec.partitions.
    ownership: bool = True
    # Not a spec field: the pipeline was switched to ownership from OwnershipOff
    # (status.ownership.switched): its workers get DEDUP_OWNERSHIP_SWITCH=true, which lets
    # them convert a store written before ownership (and is harmless once converted).
    ownership_switch: bool = False

    @property
    def workers(self) -> int:
        """The number of workers (one per partition index 0..workers-1)."""
        return self.partitions

    @property
    def owned_topic(self) -> str:
        """The internal topic: the user's `kafka.ownedTopic`, else the operator's own."""
        return self.kafka.owned_topic or names.owned_topic(self.namespace, self.name)

    @property
    def creates_owned_topic(self) -> bool:
        """Whether the operator creates (and deletes with the pipeline) the internal topic:
        under ownership, when the user did not name one."""
        return self.ownership and self.kafka.owned_topic is None

    @classmethod
    def parse(cls, name: str, namespace: str, spec: Mapping[str, Any]) -> PipelineSpec:
        try:
            return _parse(name, namespace, spec)
        except SpecError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise SpecError(f"spec of {namespace}/{name}: {detail}") from None


# --------------------------------------------------------------------------- parse
def _pairs(data: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in (data or {}).items())


def _parse(name: str, namespace: str, spec: Mapping[str, Any]) -> PipelineSpec:
    k = spec["kafka"]
    ref = k.get("securityRef")
    kafka = KafkaSpec(
        bootstrap_servers=str(k["bootstrapServers"]),
        input_topic=str(k["inputTopic"]),
        output_topic=str(k["outputTopic"]),
        dead_letter_topic=k.get("deadLetterTopic") or None,
        consumer_group=str(k.get("consumerGroup") or names.default_consumer_group(name)),
        config=_pairs(k.get("config")),
        security_ref=(
            SecretRef(str(ref["secretName"]), str(ref.get("key") or DEFAULT_SECRET_KEY))
            if ref
            else None
        ),
        owned_topic=str(k["ownedTopic"]) if k.get("ownedTopic") else None,
    )
    for key, value in kafka.config:  # they reach the workers as key=value text
        unreadable = unreadable_setting(key, value)
        if unreadable is not None:
            raise SpecError(f"kafka.config: {unreadable}")
    if kafka.output_topic == kafka.input_topic:
        raise SpecError("kafka.outputTopic must differ from kafka.inputTopic")
    if kafka.owned_topic is not None and kafka.owned_topic in (
        kafka.input_topic,
        kafka.output_topic,
        kafka.dead_letter_topic,
    ):
        raise SpecError(
            "kafka.ownedTopic must differ from kafka.inputTopic, outputTopic and deadLetterTopic"
        )

    m = spec["messageId"]
    source = str(m["source"])
    field = str(m.get("field") or ("" if source != "key" else MessageIdSpec.field))
    try:  # the worker's own rules (one owner), told in the spec's terms
        IdSpec(source, field)  # type: ignore[arg-type]
    except ValueError as invalid:
        raise SpecError(f"messageId.{invalid}") from None
    message_id = MessageIdSpec(source, field)  # type: ignore[arg-type]

    w = spec["window"]
    window = WindowSpec(duration=w.get("duration"), max_keys=w.get("maxKeys"))
    if window.duration is None and window.max_keys is None:
        raise SpecError("window needs duration or maxKeys (or both)")
    if window.duration is not None:
        duration(window.duration, "window.duration")

    wk = spec.get("worker") or {}
    res = wk.get("resources") or {}
    resources = ResourcesSpec(
        requests=_pairs(res["requests"]) if "requests" in res else ResourcesSpec.requests,
        limits=_pairs(res["limits"]) if "limits" in res else ResourcesSpec.limits,
    )
    resources.lookup_threads()  # validates the cpu quantity
    log_level = str(wk.get("logLevel", WorkerSpec.log_level))
    if log_level not in LOG_LEVELS:
        raise SpecError(f"worker.logLevel must be one of {', '.join(LOG_LEVELS)}")
    worker = WorkerSpec(
        image=str(wk.get("image", WorkerSpec.image)),
        batch_size=int(wk.get("batchSize", WorkerSpec.batch_size)),
        linger_ms=int(wk.get("lingerMs", WorkerSpec.linger_ms)),
        block_cache_mb=int(wk.get("blockCacheMB", WorkerSpec.block_cache_mb)),
        log_level=log_level,
        resources=resources,
        node_selector=_pairs(wk.get("nodeSelector")),
        tolerations=tuple(wk.get("tolerations") or ()),
        affinity=wk.get("affinity") or None,
    )

    st = spec.get("storage") or {}
    storage = StorageSpec(
        size=str(st.get("size", StorageSpec.size)),
        storage_class_name=st.get("storageClassName") or None,
        retain_on_delete=bool(st.get("retainOnDelete", StorageSpec.retain_on_delete)),
    )
    if quantity(storage.size, "storage.size") <= 0:
        raise SpecError("storage.size must be a positive quantity such as 100Gi")

    fo = spec.get("failover") or {}
    defaults = FailoverSpec()
    failover = FailoverSpec(
        node_lost_after=(
            duration(fo["nodeLostAfter"], "failover.nodeLostAfter")
            if "nodeLostAfter" in fo
            else defaults.node_lost_after
        ),
        lease_duration=(
            duration(fo["leaseDuration"], "failover.leaseDuration")
            if "leaseDuration" in fo
            else defaults.lease_duration
        ),
        release_volume=ReleaseVolume(fo.get("releaseVolume", defaults.release_volume.value)),
        detach_timeout=(
            duration(fo["detachTimeout"], "failover.detachTimeout")
            if "detachTimeout" in fo
            else defaults.detach_timeout
        ),
        schedule_timeout=(
            duration(fo["scheduleTimeout"], "failover.scheduleTimeout")
            if "scheduleTimeout" in fo
            else defaults.schedule_timeout
        ),
    )
    if failover.lease_duration < timedelta(seconds=1):
        raise SpecError("failover.leaseDuration must be at least 1s (whole seconds)")

    rc = spec.get("reconciliation")
    reconciliation = None
    if rc:
        sp = rc.get("spark") or {}
        reconciliation = ReconciliationSpec(
            schedule=str(rc["schedule"]),
            lookback=(
                duration(rc["lookback"], "reconciliation.lookback")
                if "lookback" in rc
                else ReconciliationSpec.lookback
            ),
            spark=SparkSpec(
                image=sp.get("image") or None,
                executors=int(sp.get("executors", SparkSpec.executors)),
                master=str(sp.get("master", SparkSpec.master)),
            ),
        )

    partitions = int(spec["partitions"])
    if partitions < 1:
        raise SpecError("partitions must be at least 1")
    return PipelineSpec(
        name=name,
        namespace=namespace,
        kafka=kafka,
        partitions=partitions,
        message_id=message_id,
        window=window,
        worker=worker,
        storage=storage,
        failover=failover,
        reconciliation=reconciliation,
        finalized_release=str((spec.get("upgrade") or {}).get("finalizedRelease") or "") or None,
    )
