"""The audit's report (`dedup-audit`, `audit_job.py`): the rows an audit group returns
(`RESULT_SCHEMA`, `GROUP_SCHEMA` and their kinds), the counts per partition gathered from
them, the JSON summary (docs/design.md, "Result to the pipeline"), the findings (Parquet)
and `summary.json` written to the report directory, the summary published into the
result ConfigMap, and the exit code the summary decides."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import urlparse

from dedup_contract import names
from dedup_contract.timefmt import format_micro_time
from dedup_spark import audit_model, audit_result
from dedup_spark.audit_spec import AuditJob, JobError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("dedup_spark.audit_job")
"""The job's logger: the verdict's lines come from the job, as before the report had a
module of its own."""

EXIT_PASSED: Final = 0
EXIT_FAILED: Final = 1
EXIT_ERROR: Final = 2

COUNTS_KIND: Final = "counts"
DISTINCT_KIND: Final = "distinct"
SOURCES_KIND: Final = "sources"
RESULT_SCHEMA: Final = (
    "partition INT, kind STRING, id STRING, offset BIGINT, timestamp_ms BIGINT, detail STRING"
)
GROUP_SCHEMA: Final = RESULT_SCHEMA + ", rows BINARY"
"""What an audit group returns: findings, `counts` per partition, the group's `distinct`
ids (in `offset`), and its `sources` per output partition (packed, for the order stage)."""


# --- the rows of the audit's result ----------------------------------------------------


def group_row(
    partition: int | None,
    kind: str,
    *,
    offset: int | None = None,
    detail: str | None = None,
    rows: bytes | None = None,
) -> dict[str, Any]:
    return {
        "partition": partition,
        "kind": kind,
        "id": None,
        "offset": offset,
        "timestamp_ms": None,
        "detail": detail,
        "rows": rows,
    }


def finding_row(f: audit_model.Finding) -> dict[str, Any]:
    return {
        "partition": f.partition,
        "kind": f.kind,
        "id": f.id,
        "offset": f.offset,
        "timestamp_ms": f.timestamp_ms,
        "detail": f.detail,
        "rows": None,
    }


def group_schema() -> pa.Schema:
    import pyarrow as pa

    return result_schema().append(pa.field("rows", pa.binary()))


def result_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("partition", pa.int32()),
            ("kind", pa.string()),
            ("id", pa.string()),
            ("offset", pa.int64()),
            ("timestamp_ms", pa.int64()),
            ("detail", pa.string()),
        ]
    )


# --- the counts and the summary --------------------------------------------------------


def partition_counts(
    counts_rows: Iterable[Any],
    order_counts: Iterable[Any],
    lost: Mapping[int, Mapping[str, int]],
    partitions: int,
    committed: Mapping[int, int] | None,
) -> tuple[dict[int, dict[str, Any]], int]:
    """The counts per partition number, and the distinct ids across partitions, from the
    groups' `counts` and `distinct` rows, the order stage's violations per output
    partition (rows of `partition` and `count`) and the counts of the input retention
    deleted (`lost`); every input partition of the `partitions` has an entry. With the
    pipeline's `committed` offsets (None: no consumer group), each entry has its
    `committedOffset` (None past the input's partitions)."""
    counts: dict[int, dict[str, Any]] = {}
    distinct = 0

    def counts_of(p: int) -> dict[str, Any]:
        return counts.setdefault(p, {"deadLetteredByReason": {}})

    for row in counts_rows:
        if row["kind"] == DISTINCT_KIND:
            distinct += int(row["offset"])
            continue
        got = json.loads(row["detail"])
        mine = counts_of(int(row["partition"]))
        for reason, n in got.pop("deadLetteredByReason", {}).items():
            by_reason = mine["deadLetteredByReason"]
            by_reason[reason] = by_reason.get(reason, 0) + int(n)
        for name, n in got.items():
            mine[name] = mine.get(name, 0) + int(n)
    for row in order_counts:
        mine = counts_of(int(row["partition"]))
        mine["orderViolations"] = mine.get("orderViolations", 0) + int(row["count"])
    for p, lost_counts in lost.items():
        mine = counts_of(p)
        for name, n in lost_counts.items():
            mine[name] = mine.get(name, 0) + int(n)
    for p in range(partitions):
        counts_of(p)
    if committed is not None:
        for p, mine in counts.items():
            mine["committedOffset"] = committed.get(p, 0) if p < partitions else None
    return counts, distinct


def summarize(
    job: AuditJob,
    partition_counts: Mapping[int, Mapping[str, Any]],
    started: datetime,
    finished: datetime,
    distinct: int | None = None,
) -> dict[str, Any]:
    """The JSON summary (docs/design.md, "Result to the pipeline") from the per-partition
    counts (partition `p`: the input partition's and the output partition's counts) and
    the distinct ids across partitions."""
    parts = [
        {
            "partition": p,
            **audit_result.totals_of(partition_counts[p]),
            **_extras(partition_counts[p]),
        }
        for p in sorted(partition_counts)
    ]
    totals = audit_result.add_totals(parts, distinct=distinct)
    by_reason: dict[str, int] = {}
    for part in parts:
        for reason, n in part.get("deadLetteredByReason", {}).items():
            by_reason[reason] = by_reason.get(reason, 0) + int(n)
    rng = job.audit_range
    return {
        "pipeline": job.pipeline,
        "namespace": job.namespace,
        "runId": job.run_id,
        "startedAt": format_micro_time(started),
        "finishedAt": format_micro_time(finished),
        "passed": audit_result.passed(totals, fail_on_unverifiable=job.fail_on_unverifiable),
        "unverifiable": "fail" if job.fail_on_unverifiable else "warn",
        "range": {
            "from": None if rng.from_ms is None else format_micro_time(_from_ms(rng.from_ms)),
            "to": None if rng.to_ms is None else format_micro_time(_from_ms(rng.to_ms)),
            "offsets": None
            if rng.offsets is None
            else {str(p): list(b) for p, b in sorted(rng.offsets.items())},
        },
        "window": {"ms": job.window_ms, "slackMs": job.slack_ms},
        "ownership": {"workers": job.workers, "ownedTopic": job.owned_topic},
        "consumerGroup": job.consumer_group,
        "totals": totals,
        "deadLetteredByReason": dict(sorted(by_reason.items())),
        "partitions": parts,
        "report": job.report_dir,
    }


def _extras(counts: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in counts.items() if k not in audit_result.COUNT_NAMES}


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def exit_code(summary: Mapping[str, Any]) -> int:
    """The job's exit code for its summary (EXIT_PASSED or EXIT_FAILED), with the verdict
    logged, and a warning for input retention deleted before the audit read it."""
    totals = summary["totals"]
    code = EXIT_PASSED if summary["passed"] else EXIT_FAILED
    if totals.get("unverifiable"):
        log.warning(
            "%d input record(s) could not be verified: deleted by retention before the audit "
            "read them (findings of kind 'unverifiable' name them)",
            totals["unverifiable"],
            extra={"unverifiable": totals["unverifiable"], "policy": summary["unverifiable"]},
        )
    log.info(
        "audit %s", "passed" if summary["passed"] else "FAILED", extra={"exit_code": code, **totals}
    )
    return code


# --- writing it ------------------------------------------------------------------------


def write_findings(spark: SparkSession, findings: DataFrame, path: str) -> None:
    """The findings as Parquet in one file at `path`. A path on the driver's own file
    system (no scheme, or `file:`) while executors run elsewhere (any master but
    `local[N]`, e.g. executor pods) is written by the driver from the collected findings:
    the executors cannot reach the driver pod's volume. They are the audit's defects (a
    row per duplicate, missing or mismatched record), not its input. Any other path
    (s3a:, hdfs:, ...) is written by Spark's executors."""
    url = urlparse(path)
    if url.scheme in ("", "file") and not (spark.sparkContext.master or "").startswith("local"):
        import pyarrow.parquet as pq

        local = Path(url.path)
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(parents=True)
        pq.write_table(findings.toArrow(), local / "part-00000.parquet")
        (local / "_SUCCESS").touch()
        return
    findings.coalesce(1).write.mode("overwrite").parquet(path)


def write_summary(spark: SparkSession, report_dir: str, summary: Mapping[str, Any]) -> None:
    """`summary.json` beside the findings, through Spark's Hadoop file system API, so a
    remote report location (s3a://, hdfs://, ...) gets it as a local directory does."""
    context: Any = spark.sparkContext
    path = context._jvm.org.apache.hadoop.fs.Path(f"{report_dir.rstrip('/')}/summary.json")
    fs = path.getFileSystem(context._jsc.hadoopConfiguration())
    out = fs.create(path, True)
    try:
        out.write(bytearray((json.dumps(summary, indent=2, sort_keys=True) + "\n").encode()))
    finally:
        out.close()


def publish_summary(job: AuditJob, summary: Mapping[str, Any]) -> None:
    """Create or replace the result ConfigMap (the operator reads it into the status)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from dedup_contract.kube_client import api_client

    try:
        api = api_client(job.kubeconfig or None)
    except Exception as exc:  # the kubernetes package raises its own ConfigException
        raise JobError(f"cannot configure the API client: {exc}") from None
    core = client.CoreV1Api(api)
    name = job.configmap or names.reconciliation_result(job.pipeline)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": job.namespace,
        "labels": {
            names.LABEL_PIPELINE: job.pipeline,
            names.LABEL_MANAGED_BY: names.MANAGER,
            names.LABEL_COMPONENT: "reconciliation",
        },
    }
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {names.RECONCILIATION_SUMMARY_KEY: json.dumps(summary, sort_keys=True)},
    }
    try:
        try:
            current = core.read_namespaced_config_map(name, job.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            core.create_namespaced_config_map(job.namespace, cast(Any, body))
        else:
            # Keep what the operator added (its owner reference).
            seen = current.metadata
            if seen is not None:
                metadata["ownerReferences"] = [
                    api.sanitize_for_serialization(ref)  # type: ignore[no-untyped-call]
                    for ref in seen.owner_references or []
                ]
                metadata["resourceVersion"] = seen.resource_version
            core.replace_namespaced_config_map(name, job.namespace, cast(Any, body))
    except ApiException as exc:
        raise JobError(
            f"cannot write ConfigMap {job.namespace}/{name}: {exc.status} {exc.reason}"
        ) from None
    finally:
        api.close()  # type: ignore[no-untyped-call]
