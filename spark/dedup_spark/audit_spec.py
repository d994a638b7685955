"""What one run of the audit (`dedup-audit`, `audit_job.py`) is asked to do: `AuditJob`,
from the command line, and `JobError`, the audit unable to run as asked. Shared by the
job, its sources (`audit_sources.py`) and its report (`audit_report.py`), which never
import the job."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from dedup_contract.ids import IdSpec
from dedup_spark import audit_model
from dedup_spark.source import KafkaSource


class JobError(Exception):
    """The audit cannot run as asked; the message is for a person."""


@dataclass(frozen=True)
class AuditJob:
    """Everything one audit run needs (from the command line)."""

    pipeline: str
    namespace: str
    kafka: KafkaSource
    input_topic: str
    output_topic: str
    dead_letter_topic: str | None
    id_spec: IdSpec
    window_ms: int
    slack_ms: int
    audit_range: audit_model.AuditRange
    report_dir: str
    consumer_group: str | None  # None: audit all input, committed or not
    workers: int  # the pipeline's spec.partitions: owner(id) = murmur2(id) % workers
    owned_topic: str | None = None  # the internal topic of forwarded records
    configmap: str | None = None
    kubeconfig: str | None = None
    fail_on_unverifiable: bool = True
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def read_since_ms(self) -> int | None:
        """How far back to read: the range's start minus a window (earlier publications)."""
        if self.audit_range.from_ms is None:
            return None
        return self.audit_range.from_ms - self.window_ms - self.slack_ms
