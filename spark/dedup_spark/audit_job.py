"""`dedup-audit`: the independent, end-to-end audit of a pipeline's exactly-once claim.

Reads the input, output and dead-letter topics with Spark's Kafka source (read
committed), and the forwarded records waiting at their owners on the internal topic
(`--owned-topic`, from the consumer group's committed offsets), applies the worker's id
rules, and audits with the pure rules of `audit_rules.py` inside Spark under ownership
(`--workers`, the pipeline's spec.partitions): every record of an id, from any
partition, goes to one group (`source.id_groups`, the audit's own murmur2), invalid input
to a group per input partition with its dead letters; then the order of each output
partition per input partition in a second, small stage. Writes the findings (Parquet,
one row per finding) and `summary.json` (the totals and the counts per partition: the
input partition's and the output partition's of that number) to `--report-dir`, and the
summary into the ConfigMap `<pipeline>-reconciliation` (`--configmap`), which the
operator reads into the pipeline's status.

Records deleted by retention before the audit read them are reported as `unverifiable`
(counted, and named by offset in the findings): the audit learns each partition's log
start offsets and oldest retained records first (`input_state`). `--unverifiable fail`
(the default) fails an audit with any; `warn` passes it with a warning.

Its parts, none importing it: `audit_spec.py` (the run asked), `audit_sources.py` (the
topics read), `audit_report.py` (summary, findings, ConfigMap, exit code); docs/audit.md.

Exit codes: 0 the audit passed, 1 it failed (the summary says what), 2 it could not run
(bad arguments, Kafka, Spark or the API server refusing) -- one log line says why.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dedup_contract import names
from dedup_contract.ids import ID_SOURCES, IdSpec
from dedup_contract.logs import configure
from dedup_contract.names import default_consumer_group
from dedup_contract.timefmt import parse_rfc3339
from dedup_contract.window import parse_duration_ms
from dedup_spark import (
    audit_matching,
    audit_model,
    audit_report,
    audit_result,
    audit_rules,
    audit_sources,
)
from dedup_spark.audit_report import (
    COUNTS_KIND,
    DISTINCT_KIND,
    GROUP_SCHEMA,
    RESULT_SCHEMA,
    SOURCES_KIND,
    summarize,
    write_findings,
    write_summary,
)
from dedup_spark.audit_report import EXIT_ERROR as EXIT_ERROR
from dedup_spark.audit_report import EXIT_FAILED as EXIT_FAILED
from dedup_spark.audit_report import EXIT_PASSED as EXIT_PASSED
from dedup_spark.audit_report import publish_summary as publish_summary
from dedup_spark.audit_sources import DEAD, FORWARDED, INPUT, OUTPUT
from dedup_spark.audit_sources import InputState as InputState
from dedup_spark.audit_sources import input_state as input_state
from dedup_spark.audit_spec import AuditJob as AuditJob
from dedup_spark.audit_spec import JobError as JobError
from dedup_spark.placement import slot_keys
from dedup_spark.source import (
    KafkaSource,
    SourceError,
    ids_schema,
    ipc_bytes,
    parse_settings,
    unpack,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("dedup_spark.audit_job")

# --- the audit in Spark ----------------------------------------------------------------


def audit_frame(spark: SparkSession, job: AuditJob, state: InputState) -> DataFrame:
    """The audit groups' rows (GROUP_SCHEMA): one group per id bucket (all records of
    its ids, any partition) and one per input partition with invalid input or dead
    letters."""
    from pyspark.sql import functions as F

    buckets = state.buckets(job)
    union = audit_sources.source_frames(spark, job, state)

    settings = _GroupAudit(
        buckets,
        job.workers,
        job.audit_range,
        job.window_ms,
        job.slack_ms,
        state.committed if job.consumer_group is not None else None,
        state.retention,
    )

    def audit_group(table: pa.Table) -> pa.Table:  # Spark counts a callable object's `self`
        return settings(table)

    # Each group in a task of its own (placement.py).
    slots = buckets + max(1, state.partitions)
    slot = F.when(
        F.col("group").between(0, slots - 1),
        F.element_at(F.array(*(F.lit(key) for key in slot_keys(slots))), F.col("group") + 1),
    )
    return (
        union.withColumn("slot", slot)
        .repartition(slots, "slot")
        .groupBy("slot", "group")
        .applyInArrow(audit_group, GROUP_SCHEMA)
    )


@dataclass(frozen=True)
class _GroupAudit:
    """The function Spark runs per audit group (pickled to the executors)."""

    buckets: int
    workers: int
    audit_range: audit_model.AuditRange
    window_ms: int
    slack_ms: int
    committed: dict[int, int] | None
    retention: dict[int, audit_model.Retention] = field(default_factory=dict)

    def __call__(self, table: pa.Table) -> pa.Table:
        """`table`: one group's packed rows (source.GROUPED_SCHEMA) with their `kind`."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if table.num_rows == 0:
            return pa.Table.from_pylist([], schema=audit_report.group_schema())
        group = int(table.column("group")[0].as_py())
        kinds = table.column("kind")

        def of_kind(kind: int, schema: pa.Schema) -> pa.Table:
            rows = table.filter(pc.equal(kinds, kind)).column("rows")
            return unpack(rows, schema)

        rows: list[dict[str, Any]] = []
        if group < self.buckets:
            result, sources = audit_rules.audit_ids(
                audit_matching.IdColumns.of_tables(
                    of_kind(INPUT, ids_schema()),
                    of_kind(OUTPUT, ids_schema()),
                    of_kind(FORWARDED, audit_sources.forwarded_schema()),
                ),
                workers=self.workers,
                audit_range=self.audit_range,
                window_ms=self.window_ms,
                slack_ms=self.slack_ms,
                committed=self.committed,
                retention=self.retention,
            )
            rows.append(audit_report.group_row(None, DISTINCT_KIND, offset=result.distinct_ids))
            out_part = sources.column("partition")
            for p in pc.unique(out_part).to_pylist():
                part = sources.filter(pc.equal(out_part, p))
                rows.append(audit_report.group_row(p, SOURCES_KIND, rows=ipc_bytes(part)))
        else:
            partition = group - self.buckets
            inputs = of_kind(INPUT, ids_schema())
            inputs = inputs.filter(pc.is_null(inputs.column("id"))).sort_by("offset")
            result = audit_rules.audit_invalid(
                partition,
                inputs,
                of_kind(DEAD, audit_sources.dead_schema()),
                audit_range=self.audit_range,
                committed_offset=None
                if self.committed is None
                else self.committed.get(partition, 0),
            )
        rows.extend(audit_report.finding_row(f) for f in result.findings)
        for p in sorted(set(result.counts) | set(result.by_reason)):
            counts = {
                **{k: int(v) for k, v in result.counts.get(p, {}).items()},
                "deadLetteredByReason": dict(result.by_reason.get(p, {})),
            }
            rows.append(
                audit_report.group_row(p, COUNTS_KIND, detail=json.dumps(counts, sort_keys=True))
            )
        return pa.Table.from_pylist(rows, schema=audit_report.group_schema())


def _order_group(table: pa.Table) -> pa.Table:
    """The order stage: one output partition's sources -> its order violations."""
    import pyarrow as pa

    sources = unpack(table.column("rows"), audit_rules.SOURCES_SCHEMA)
    found = audit_rules.order_violations(sources)
    return pa.Table.from_pylist(
        [audit_report.finding_row(f) for f in found], schema=audit_report.result_schema()
    )


def run(spark: SparkSession, job: AuditJob, state: InputState | None = None) -> dict[str, Any]:
    """Audit, write the report, and return the summary. `state`: from
    `input_state(job)`, read here if not given."""
    from pyspark.sql import functions as F

    started = datetime.now(UTC)
    if state is None:
        state = input_state(job)
    result = audit_frame(spark, job, state).cache()
    try:
        kind = F.col("kind")
        counts_rows = result.where(kind.isin(COUNTS_KIND, DISTINCT_KIND)).collect()
        ordered = (
            result.where(kind == F.lit(SOURCES_KIND))
            .select("partition", "rows")
            .repartition(max(1, job.workers), "partition")
            .groupBy("partition")
            .applyInArrow(_order_group, RESULT_SCHEMA)
        )
        # Retention's deleted input spans, decided here (a partition may have no group).
        lost = audit_result.AuditResult()
        for p in sorted(state.retention):
            lost.merge(audit_rules.lost_input(p, state.retention[p], job.audit_range))
        findings = (
            result.where(~kind.isin(COUNTS_KIND, DISTINCT_KIND, SOURCES_KIND))
            .drop("rows")
            .unionByName(ordered)
            .unionByName(
                spark.createDataFrame(
                    [audit_report.finding_row(f) for f in lost.findings],
                    GROUP_SCHEMA,
                ).drop("rows")
            )
            .cache()
        )
        try:
            write_findings(spark, findings, f"{job.report_dir.rstrip('/')}/findings")
            order_counts = (
                findings.where(kind == F.lit(audit_model.ORDER_VIOLATION))
                .groupBy("partition")
                .count()
                .collect()
            )
        finally:
            findings.unpersist()
    finally:
        result.unpersist()
    partition_counts, distinct = audit_report.partition_counts(
        counts_rows,
        order_counts,
        lost.counts,
        state.partitions,
        state.committed if job.consumer_group is not None else None,
    )
    summary = summarize(job, partition_counts, started, datetime.now(UTC), distinct)
    write_summary(spark, job.report_dir, summary)
    if job.configmap:
        publish_summary(job, summary)
    return summary


# --- command line ----------------------------------------------------------------------


ALIAS = "dedup-reconcile"  # the audit's old entry point, kept for Jobs rendered before


def build_parser() -> argparse.ArgumentParser:  # size-limit: exempt (argparse builder)
    invoked = os.path.basename(sys.argv[0]) if sys.argv else ""
    p = argparse.ArgumentParser(
        prog=ALIAS if invoked == ALIAS else "dedup-audit",
        description=(
            "Audit a pipeline end to end: read its input, output and dead-letter topics "
            "(read committed) with Spark and report, grouping each id across partitions under "
            "ownership (owner = murmur2(id) % --workers): ids published twice within the "
            "window anywhere, publications not on their owner's output partition, valid "
            "input occurrences with no publication of their id within window + slack, output "
            "ids with no input, output out of input order per (input partition, output "
            "partition), output whose key, value or headers differ from every input "
            "occurrence of its id, what retention deleted before it could be checked, and "
            "the counts."
        ),
        epilog=(
            "Kafka client settings (security) come from --kafka-config or env "
            "DEDUP_KAFKA_CONFIG, key=value[,key=value] in librdkafka names as for the worker. "
            "Exit codes: 0 the audit passed, 1 it failed, 2 it could not run."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--pipeline", required=True)
    p.add_argument("--namespace", default=os.environ.get("DEDUP_NAMESPACE", "default"))
    p.add_argument("--bootstrap-servers", required=True)
    p.add_argument("--kafka-config", default=os.environ.get("DEDUP_KAFKA_CONFIG", ""))
    p.add_argument("--input-topic", required=True)
    p.add_argument("--output-topic", required=True)
    p.add_argument("--dead-letter-topic")
    p.add_argument(
        "--workers",
        type=int,
        help="the pipeline's worker count (spec.partitions), the owner function's modulus "
        "(required)",
    )
    p.add_argument(
        "--owned-topic",
        help="the internal topic of forwarded records (<namespace>.<pipeline>-owned): its "
        "records above the group's committed offsets make their input occurrence pending",
    )
    p.add_argument("--id-source", default="jsonField", choices=list(ID_SOURCES))
    p.add_argument("--id-field", default="messageId")
    p.add_argument("--window", required=True, help="the pipeline's window duration, e.g. 672h")
    p.add_argument(
        "--window-slack",
        help="how much longer than --window the worker may keep an id (default: a quarter "
        "of the window, the worker's 4 generations)",
    )
    when = p.add_mutually_exclusive_group()
    when.add_argument("--lookback", help="audit input of the last DURATION (e.g. 24h)")
    when.add_argument("--from", dest="from_", help="RFC 3339 start (with --to)")
    when.add_argument(
        "--offsets", help="per-partition input offset ranges P:START-END[,P:START-END]"
    )
    p.add_argument("--to", help="RFC 3339 end (default: now)")
    p.add_argument(
        "--consumer-group",
        help="group whose committed offsets bound what is checked (default: dedup-<pipeline>)",
    )
    p.add_argument(
        "--all-input",
        action="store_true",
        help="check all input in range, committed by the pipeline or not",
    )
    p.add_argument(
        "--unverifiable",
        choices=["fail", "warn"],
        default="fail",
        help="what records deleted by retention before the audit read them do: fail the "
        "audit, or pass it with a warning (they are counted and named either way)",
    )
    p.add_argument("--report-dir", required=True, help="directory or URL for the report")
    p.add_argument(
        "--configmap",
        nargs="?",
        const="",
        help="write the summary into this ConfigMap (bare flag: <pipeline>-reconciliation)",
    )
    p.add_argument("--kubeconfig", help="kubeconfig for --configmap (default: in-cluster)")
    p.add_argument("--master", default="local[2]", help="local[N], k8s, or k8s://https://...")
    p.add_argument("--image", help="executor image (--master k8s)")
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--executor-cores", type=int, default=1)
    p.add_argument("--executor-memory", default="1g")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", default="json", choices=["json", "text"])
    return p


def job_from_args(args: argparse.Namespace, now_ms: int | None = None) -> AuditJob:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    try:
        window_ms = parse_duration_ms(args.window)
        slack_ms = parse_duration_ms(args.window_slack) if args.window_slack else -(-window_ms // 4)
        id_spec = IdSpec(args.id_source, args.id_field)
        if args.offsets:
            rng = audit_model.AuditRange(offsets=parse_offsets(args.offsets))
        elif args.from_:
            to_ms = _parse_time(args.to) if args.to else now_ms
            rng = audit_model.AuditRange(_parse_time(args.from_), to_ms)
        else:
            lookback = parse_duration_ms(args.lookback or "24h")
            to_ms = _parse_time(args.to) if args.to else now_ms
            rng = audit_model.AuditRange(to_ms - lookback, to_ms)
        settings = parse_settings(args.kafka_config)
    except (ValueError, SourceError) as exc:
        raise JobError(str(exc)) from None
    if args.to and args.offsets:
        raise JobError("--to goes with --from or --lookback, not --offsets")
    if args.workers is None:
        raise JobError(
            "--workers is required: the pipeline's spec.partitions, which decides each id's "
            "owner (the output's partition count is not it: extra partitions stay empty)"
        )
    if args.workers < 1:
        raise JobError(f"--workers must be positive, not {args.workers}")
    group = None if args.all_input else args.consumer_group or default_consumer_group(args.pipeline)
    return AuditJob(
        pipeline=args.pipeline,
        namespace=args.namespace,
        kafka=KafkaSource(args.bootstrap_servers, settings),
        input_topic=args.input_topic,
        output_topic=args.output_topic,
        dead_letter_topic=args.dead_letter_topic,
        id_spec=id_spec,
        window_ms=window_ms,
        slack_ms=slack_ms,
        audit_range=rng,
        report_dir=args.report_dir,
        consumer_group=group,
        workers=args.workers,
        owned_topic=args.owned_topic,
        configmap=None
        if args.configmap is None
        else args.configmap or names.reconciliation_result(args.pipeline),
        kubeconfig=args.kubeconfig,
        fail_on_unverifiable=args.unverifiable == "fail",
    )


def parse_offsets(text: str) -> dict[int, tuple[int, int]]:
    ranges: dict[int, tuple[int, int]] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        try:
            part, span = item.split(":")
            start, end = span.split("-")
            p, s, e = int(part), int(start), int(end)
        except ValueError:
            raise ValueError(f"offset range {item!r} is not PARTITION:START-END") from None
        if p < 0 or s < 0 or e < s:
            raise ValueError(f"offset range {item!r} is empty or negative")
        ranges[p] = (s, e)
    if not ranges:
        raise ValueError("--offsets names no partition")
    return ranges


def _parse_time(text: str) -> int:
    return int(parse_rfc3339(text).timestamp() * 1000)


def _session(args: argparse.Namespace, app_name: str) -> SparkSession:
    from dedup_spark.session import SparkSettings, spark_session

    return spark_session(
        app_name,
        SparkSettings(
            master=args.master,
            image=args.image,
            executors=args.executors,
            executor_cores=args.executor_cores,
            executor_memory=args.executor_memory,
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(args.log_level, args.log_format)
    try:
        job = job_from_args(args)
    except JobError as exc:
        log.error("bad arguments: %s", exc, extra={"exit_code": EXIT_ERROR})
        return EXIT_ERROR
    try:
        state = input_state(job)  # fails fast, before Spark starts
    except JobError as exc:
        log.error("audit could not run: %s", exc, extra={"exit_code": EXIT_ERROR})
        return EXIT_ERROR
    try:
        spark = _session(args, f"dedup-reconcile-{job.pipeline}")
    except Exception as exc:  # a JVM or cluster failing to start: one line, not a trace
        log.error("cannot start Spark: %s", _first_line(exc), extra={"exit_code": EXIT_ERROR})
        return EXIT_ERROR
    try:
        summary = run(spark, job, state)
    except JobError as exc:
        log.error("audit could not run: %s", exc, extra={"exit_code": EXIT_ERROR})
        return EXIT_ERROR
    except Exception as exc:  # Spark's Py4J/analysis errors carry a JVM trace
        log.error("audit could not run: %s", _first_line(exc), extra={"exit_code": EXIT_ERROR})
        return EXIT_ERROR
    finally:
        spark.stop()
    return audit_report.exit_code(summary)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]


if __name__ == "__main__":
    sys.exit(main())
