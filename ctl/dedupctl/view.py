"""What `dedupctl` shows, built from what the cluster holds (pure: no API calls).

The shell (`cli.py`) reads a pipeline, its Events, its audit result ConfigMap and its
workers' /metrics (through the API server's pod proxy) and hands them here as plain
dicts and text. Every field shown comes from there:

- per pipeline: `status.phase`, `readyPartitions`, `failovers`, `conditions`,
  `lastReconciliation` (written by the operator's pass, `reconcile.py`), and
  `duplicatesDropped`, `recordsIn`, `recordsOut`, `consumerLag`: the sums of the
  workers' own when every worker answered, else the status's (refreshed at most once
  per the operator's `--status-counters-interval`);
- per partition: `status.partitions[]` (`node`, `pod`, `epoch`, `phase`, `ready`, `lag`,
  `duplicates`, `handover`, `lastHandover`), and from the worker's own /metrics its
  records in and out, dead letters and input rate (two scrapes' difference over the time
  between them). A value nobody reported is None (shown as "—").

The JSON document of `status -o json` is `STATUS_SCHEMA_VERSION` 3 (its keys, and what
each version added: docs/operations.md#dedupctl); they are pinned by a unit test: add
keys only with a new version.

A handover that waits on Kubernetes' own 6-minute force-detach (its out-of-service taint
blocked by other workloads on the lost node, or `releaseVolume: WaitForDetach`) is said
in plain words under `force-detach:`, with the pods that block the taint, from the
handover's `release` and `releaseWhy` (`force_detach_text`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from dedup_contract import names, ownership_status, worker_metrics
from dedup_contract.handover import (
    DETACHED,
    FAILOVER_EVENTS,
    FORCE_DETACH,
    PLANNED_EVENTS,
    READY,
    RELEASED,
    STEPS,
    Release,
    taint_blocked_by,
)
from dedup_contract.timefmt import parse_time
from dedup_contract.worker_metrics import worker_counters

# The Events that begin and complete a handover; a completion's handover reason (None:
# a failover, whose reason its start told)
STARTED_EVENTS: Final = frozenset(
    started for _, started, _ in (FAILOVER_EVENTS, *PLANNED_EVENTS.values())
)
COMPLETED_EVENTS: Final[dict[str, str | None]] = {
    FAILOVER_EVENTS[2]: None,
    **{completed: reason.value for reason, (_, _, completed) in PLANNED_EVENTS.items()},
}

DASH: Final = "—"
STATUS_SCHEMA_VERSION: Final = 3


@dataclass(frozen=True)
class WorkerSample:
    """One scrape of a worker's /metrics, at `at` (seconds on the caller's monotonic clock)."""

    at: float
    records_in: float
    records_out: float
    duplicates: float
    dead_letters: float
    lag: float
    forwarded: float = 0.0  # input records forwarded to their owner (misrouted)


def parse_worker_metrics(text: str, at: float) -> WorkerSample:
    c = worker_counters(
        text,
        (
            worker_metrics.RECORDS_IN_TOTAL,
            worker_metrics.RECORDS_OUT_TOTAL,
            worker_metrics.DUPLICATES_TOTAL,
            worker_metrics.DEAD_LETTERS_TOTAL,
            worker_metrics.CONSUMER_LAG,
            worker_metrics.RECORDS_FORWARDED_TOTAL,
        ),
    )
    return WorkerSample(
        at=at,
        records_in=c[worker_metrics.RECORDS_IN_TOTAL],
        records_out=c[worker_metrics.RECORDS_OUT_TOTAL],
        duplicates=c[worker_metrics.DUPLICATES_TOTAL],
        dead_letters=c[worker_metrics.DEAD_LETTERS_TOTAL],
        lag=c[worker_metrics.CONSUMER_LAG],
        forwarded=c[worker_metrics.RECORDS_FORWARDED_TOTAL],
    )


def input_rate(before: WorkerSample | None, after: WorkerSample | None) -> float | None:
    """Records consumed per second between two scrapes of the same worker; None without
    two, or when the counter went back (a new worker: its counters start at 0)."""
    if before is None or after is None or after.at <= before.at:
        return None
    if after.records_in < before.records_in:
        return None
    return (after.records_in - before.records_in) / (after.at - before.at)


# ------------------------------------------------------------------------------ status


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def handover_doc(h: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A handover record of status (in progress or last), with its total: the `ready`
    step (seconds from the decision until the replacement was Ready), else the latest
    step reached."""
    if not h:
        return None
    steps = {str(k): float(v) for k, v in (h.get("steps") or {}).items()}
    total = steps.get(READY, max(steps.values(), default=None) if steps else None)
    return {
        "reason": h.get("reason"),
        "started": h.get("started"),
        "fromPod": h.get("fromPod"),
        "fromNode": h.get("fromNode"),
        "toPod": h.get("toPod"),
        "release": h.get("release"),
        "releaseWhy": h.get("releaseWhy"),
        "steps": steps,
        "totalSeconds": total,
        "complete": READY in steps,
    }


def partition_doc(
    entry: Mapping[str, Any],
    sample: WorkerSample | None,
    rate: float | None,
) -> dict[str, Any]:
    """One row of `status`: the operator's status entry, the worker's own counters."""
    return {
        "partition": _int(entry.get("partition")),
        "node": entry.get("node"),
        "pod": entry.get("pod"),
        "epoch": _int(entry.get("epoch")),
        "phase": entry.get("phase"),
        "ready": bool(entry.get("ready")),
        "inputRate": None if rate is None else round(rate, 1),
        "recordsIn": None if sample is None else int(sample.records_in),
        "recordsOut": None if sample is None else int(sample.records_out),
        "forwarded": None if sample is None else int(sample.forwarded),
        "lag": _int(entry.get("lag")) if sample is None else int(sample.lag),
        "duplicatesDropped": _int(entry.get("duplicates"))
        if sample is None
        else int(sample.duplicates),
        "deadLetters": None if sample is None else int(sample.dead_letters),
        "waitingFor": entry.get("waitingFor"),
        "handover": handover_doc(entry.get("handover")),
        "lastHandover": handover_doc(entry.get("lastHandover")),
        "lastFailover": entry.get("lastFailover"),
    }


def conditions_doc(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        str(c.get("type")): {
            "status": c.get("status"),
            "reason": c.get("reason"),
            "message": c.get("message"),
            "since": c.get("lastTransitionTime"),
        }
        for c in status.get("conditions") or []
    }


def audit_summary_doc(last: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not last:
        return None
    return {
        "time": last.get("time"),
        "passed": last.get("passed"),
        "checked": _int(last.get("checked")),
        "duplicates": _int(last.get("duplicates")),
        "missing": _int(last.get("missing")),
        "unexpected": _int(last.get("unexpected")),
        "orderViolations": _int(last.get("orderViolations")),
        "missingDeadLetters": _int(last.get("missingDeadLetters")),
        "runId": last.get("runId"),
    }


def pipeline_doc(
    body: Mapping[str, Any],
    samples: Mapping[int, WorkerSample] | None = None,
    rates: Mapping[int, float | None] | None = None,
) -> dict[str, Any]:
    """The `status -o json` document of one pipeline."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    samples, rates = samples or {}, rates or {}
    parts = []
    for entry in status.get("partitions") or []:
        p = _int(entry.get("partition"))
        parts.append(
            partition_doc(entry, samples.get(p) if p is not None else None, rates.get(p or 0))
        )
    known_rates = [r for r in (d["inputRate"] for d in parts) if r is not None]
    read = [d["recordsIn"] for d in parts]
    forwarded = [d["forwarded"] for d in parts]
    complete = bool(parts) and None not in read and None not in forwarded
    dead = [d["deadLetters"] for d in parts]
    # every worker answered: the totals are theirs, live; else the status's, which the
    # operator refreshes at most once per --status-counters-interval (60 s)
    live = bool(parts) and None not in read

    def total(key: str, status_key: str) -> int | None:
        return sum(int(d[key] or 0) for d in parts) if live else _int(status.get(status_key))

    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "phase": status.get("phase"),
        "partitions": _int(spec.get("partitions")),
        "readyPartitions": _int(status.get("readyPartitions")),
        "recordsIn": total("recordsIn", "recordsIn"),
        "recordsOut": total("recordsOut", "recordsOut"),
        "duplicatesDropped": total("duplicatesDropped", "duplicatesDropped"),
        "deadLetters": sum(d for d in dead if d is not None) if dead and None not in dead else None,
        "consumerLag": total("lag", "consumerLag"),
        # the share of the input read on a partition its id's owner does not read
        # (forwarded through the internal topic), since the workers started
        "misroutedShare": round(sum(forwarded) / sum(read), 4) if complete and sum(read) else None,
        "inputRate": round(sum(known_rates), 1)
        if parts and len(known_rates) == len(parts)
        else None,
        "failovers": _int(status.get("failovers")),
        "observedGeneration": _int(status.get("observedGeneration")),
        "generation": _int(meta.get("generation")),
        "created": meta.get("creationTimestamp"),
        "conditions": conditions_doc(status),
        "lastReconciliation": audit_summary_doc(status.get("lastReconciliation")),
        "partitionStatus": parts,
    }


def status_doc(pipelines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"schemaVersion": STATUS_SCHEMA_VERSION, "pipelines": list(pipelines)}


# ---------------------------------------------------------------------------- rendering


def show(value: Any) -> str:
    if value is None or value == "":
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns, two spaces apart, like kubectl get."""
    cells = [list(headers), *([show(v) for v in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def age(since: str | None, now: datetime) -> str:
    t = parse_time(since) if since else None
    if t is None:
        return DASH
    s = max(0, int((now - t).total_seconds()))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def steps_text(steps: Mapping[str, float]) -> str:
    order = [s for s in STEPS if s in steps] + [s for s in steps if s not in STEPS]
    return " ".join(f"{s} {steps[s]:.1f}s" for s in order) if steps else DASH


def handover_text(h: Mapping[str, Any] | None, now: datetime) -> str:
    if not h:
        return DASH
    total = h.get("totalSeconds")
    head = f"{h.get('reason')} {age(h.get('started'), now)} ago"
    if h.get("complete"):
        head += f", {total:.1f}s"
    else:
        head += ", in progress"
    return f"{head} ({steps_text(h.get('steps') or {})})"


FORCE_DETACH_S: Final = 360  # kube-controller-manager's maxWaitForUnmountDuration


def force_detach_text(h: Mapping[str, Any] | None, now: datetime) -> str | None:
    """Plain words for a handover in progress that waits on Kubernetes' 6-minute
    force-detach, and why: which pods block the out-of-service taint (a `TaintBlocked`
    release), or the policy; None for any other handover."""
    if not h or h.get("complete") or DETACHED in (h.get("steps") or {}):
        return None
    release, why = h.get("release"), str(h.get("releaseWhy") or "")
    if release not in (Release.TAINT_BLOCKED.value, Release.WAIT_FOR_DETACH.value):
        return None
    if FORCE_DETACH not in why:
        return None  # e.g. the Node object was deleted: no 6-minute wait
    node = h.get("fromNode") or "its node"
    steps = h.get("steps") or {}
    started = parse_time(h.get("started"))
    left = ""
    if RELEASED in steps and started is not None:
        waited = (now - started).total_seconds() - float(steps[RELEASED])
        remaining = int(FORCE_DETACH_S - waited)
        left = (
            f" (about {remaining // 60}m{remaining % 60:02d}s left)"
            if remaining > 0
            else " (due now)"
        )
    head = f"waits for Kubernetes' 6-minute force-detach of its volume{left}"
    if release == Release.WAIT_FOR_DETACH.value:
        return f"{head}: releaseVolume is WaitForDetach (the operator never taints)"
    blockers = taint_blocked_by(why)
    if blockers is None:
        return (
            f"{head}: the operator could not list the pods on {node}, so it does not taint "
            "it out-of-service (it needs list pods in every namespace)"
        )
    return (
        f"{head}: the out-of-service taint on {node} is blocked by {', '.join(blockers)} "
        f"(not dedup workers; the taint would evict {'it' if len(blockers) == 1 else 'them'}). "
        "Faster: a dedicated node pool for the workers, or the cloud's shutdown signal "
        "(node.cloudprovider.kubernetes.io/shutdown) on the node"
    )


def audit_text(a: Mapping[str, Any] | None, now: datetime) -> str:
    if not a:
        return DASH
    verdict = "passed" if a.get("passed") else "FAILED"
    return (
        f"{verdict} {age(a.get('time'), now)} ago: {show(a.get('checked'))} checked, "
        f"{show(a.get('duplicates'))} duplicates, {show(a.get('missing'))} missing"
    )


def render_status(doc: Mapping[str, Any], now: datetime) -> str:
    pipelines = doc.get("pipelines") or []
    if not pipelines:
        return "No pipelines found."
    out = [
        table(
            (
                "NAMESPACE",
                "NAME",
                "PHASE",
                "READY",
                "IN/S",
                "IN",
                "OUT",
                "DUPLICATES",
                "DEAD LETTERS",
                "LAG",
                "MISROUTED",
                "FAILOVERS",
                "LAST AUDIT",
                "AGE",
            ),
            [
                (
                    p["namespace"],
                    p["name"],
                    p["phase"],
                    f"{show(p['readyPartitions'])}/{show(p['partitions'])}",
                    p["inputRate"],
                    p["recordsIn"],
                    p["recordsOut"],
                    p["duplicatesDropped"],
                    p["deadLetters"],
                    p["consumerLag"],
                    None if p["misroutedShare"] is None else f"{p['misroutedShare']:.1%}",
                    p["failovers"],
                    audit_text(p["lastReconciliation"], now).split(":")[0]
                    if p["lastReconciliation"]
                    else None,
                    age(p["created"], now),
                )
                for p in pipelines
            ],
        )
    ]
    for p in pipelines:
        out.append("")
        out.append(f"{p['namespace']}/{p['name']}: partitions")
        out.append(
            table(
                (
                    "P",
                    "NODE",
                    "POD",
                    "EPOCH",
                    "PHASE",
                    "IN/S",
                    "LAG",
                    "DUPLICATES",
                    "DEAD LETTERS",
                    "LAST HANDOVER",
                ),
                [
                    (
                        q["partition"],
                        q["node"],
                        q["pod"],
                        q["epoch"],
                        q["phase"],
                        q["inputRate"],
                        q["lag"],
                        q["duplicatesDropped"],
                        q["deadLetters"],
                        handover_text(q["handover"] or q["lastHandover"], now),
                    )
                    for q in p["partitionStatus"]
                ],
            )
        )
        waiting = [
            f"  p{q['partition']}: {q['waitingFor']}"
            for q in p["partitionStatus"]
            if q["waitingFor"]
        ]
        if waiting:
            out.append("waiting:")
            out.extend(waiting)
        detach = [
            f"  p{q['partition']}: {text}"
            for q in p["partitionStatus"]
            if (text := force_detach_text(q["handover"], now))
        ]
        if detach:
            out.append("force-detach:")
            out.extend(detach)
        out.append(f"last audit: {audit_text(p['lastReconciliation'], now)}")
        bad = [
            f"  {t}: {c['reason']}: {c['message']}"
            for t, c in p["conditions"].items()
            if (t in ("Degraded", "FailingOver") and c["status"] == "True")
            or (t in ("Ready", "ReconciliationHealthy", "TopicReady") and c["status"] == "False")
        ]
        if bad:
            out.append("conditions:")
            out.extend(bad)
    return "\n".join(out)


# --------------------------------------------------------------------------- failovers

_STARTED = re.compile(
    r"partition (?P<p>\d+): (?P<reason>\w+): moving from (?P<pod>\S+) on (?P<node>\S+) "
    r"\(epoch (?P<epoch>\d+)\)"
)
_COMPLETED = re.compile(
    r"partition (?P<p>\d+): (?P<pod>\S+) is Ready after (?P<total>[\d.]+)s \((?P<steps>[^)]*)\)"
)
_CANCELLED = re.compile(r"partition (?P<p>\d+): (?P<why>.*)")
_STEP = re.compile(r"(\w+) ([\d.]+)s")


def _none_if_dash(value: str) -> str | None:
    return None if value == "-" else value


def failover_rows(
    body: Mapping[str, Any], events: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The handover history of a pipeline, oldest first: each started/completed/cancelled
    handover from its Events (`handover.handover_events`: `FailoverStarted`,
    `RollStarted`, `DrainStarted` and their `...Completed`, `FailoverCancelled`; `events`
    as {type, reason, message, time}),
    joined with status (`lastHandover`: the exact step times of each partition's last
    one; `handover`: one in progress). Events expire (the API server keeps them an hour
    by default), so older handovers may be missing; status always has the last one."""
    rows: list[dict[str, Any]] = []
    open_by_partition: dict[int, dict[str, Any]] = {}
    for e in sorted(events, key=lambda e: str(e.get("time") or "")):
        reason, message, at = str(e.get("reason")), str(e.get("message") or ""), e.get("time")
        if reason in STARTED_EVENTS:
            m = _STARTED.match(message)
            if not m:
                continue
            row: dict[str, Any] = {
                "partition": int(m["p"]),
                "reason": m["reason"],
                "started": at,
                "fromPod": _none_if_dash(m["pod"]),
                "fromNode": _none_if_dash(m["node"]),
                "fromEpoch": int(m["epoch"]),
                "toPod": None,
                "finished": None,
                "totalSeconds": None,
                "steps": {},
                "outcome": "in progress",
            }
            rows.append(row)
            open_by_partition[int(m["p"])] = row
        elif reason in COMPLETED_EVENTS:
            m = _COMPLETED.match(message)
            if not m:
                continue
            p = int(m["p"])
            found = open_by_partition.pop(p, None)
            if found is not None:
                row = found
            else:  # its start expired or was never told
                row = {
                    "partition": p,
                    "reason": COMPLETED_EVENTS[reason],  # None: some failover
                    "started": None,
                    "fromPod": None,
                    "fromNode": None,
                    "fromEpoch": None,
                }
                rows.append(row)
            row.update(
                toPod=m["pod"],
                finished=at,
                totalSeconds=float(m["total"]),
                steps={k: float(v) for k, v in _STEP.findall(m["steps"])},
                outcome="completed",
            )
        elif reason == "FailoverCancelled":
            m = _CANCELLED.match(message)
            if m and int(m["p"]) in open_by_partition:
                row = open_by_partition.pop(int(m["p"]))
                row.update(finished=at, outcome=f"cancelled: {m['why']}")
    status = body.get("status") or {}
    for entry in status.get("partitions") or []:
        q = _int(entry.get("partition"))
        if q is None:
            continue
        for key, outcome in (("lastHandover", "completed"), ("handover", "in progress")):
            h = entry.get(key)
            if not h:
                continue
            match = next(
                (
                    r
                    for r in reversed(rows)
                    if r["partition"] == q
                    and r.get("fromPod") == h.get("fromPod")
                    and (r["outcome"] == outcome or key == "lastHandover")
                ),
                None,
            )
            if match is None:
                match = {"partition": q, "started": h.get("started"), "finished": None}
                rows.append(match)
            steps = {str(k): float(v) for k, v in (h.get("steps") or {}).items()}
            match.update(
                reason=h.get("reason"),
                fromPod=h.get("fromPod"),
                fromNode=h.get("fromNode"),
                fromEpoch=_int(h.get("fromEpoch")),
                steps=steps,
                totalSeconds=steps.get(READY),
                outcome=outcome,
            )
            match["started"] = match.get("started") or h.get("started")
            if key == "lastHandover":
                match["toPod"] = h.get("toPod") or match.get("toPod")
                match["finished"] = match.get("finished") or entry.get("lastFailover")
            else:
                match.setdefault("toPod", None)
    keys = (
        "partition", "reason", "started", "finished", "fromPod", "fromNode", "fromEpoch",
        "toPod", "totalSeconds", "steps", "outcome",
    )  # fmt: skip
    out = [{k: r.get(k) for k in keys} for r in rows]
    out.sort(key=lambda r: (str(r["started"] or r["finished"] or ""), r["partition"]))
    return out


def render_failovers(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "No handovers recorded (Events are kept about an hour; status keeps the last one per partition)."
    return table(
        (
            "STARTED",
            "P",
            "REASON",
            "FROM",
            "TO",
            "TOTAL",
            "STEPS (s after the decision)",
            "OUTCOME",
        ),
        [
            (
                r["started"],
                r["partition"],
                r["reason"],
                f"{r['fromPod'] or DASH} on {r['fromNode'] or DASH}",
                r["toPod"],
                f"{r['totalSeconds']:.1f}s" if r["totalSeconds"] is not None else None,
                steps_text(r["steps"] or {}),
                r["outcome"],
            )
            for r in rows
        ],
    )


# ------------------------------------------------------------------------------- audit


def audit_doc(body: Mapping[str, Any], summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The last audit: status.lastReconciliation, the ReconciliationHealthy condition and,
    when the result ConfigMap is readable, its per-partition counts."""
    status = body.get("status") or {}
    last = status.get("lastReconciliation") or None
    cond = conditions_doc(status).get("ReconciliationHealthy")
    per_partition: list[dict[str, Any]] = []
    totals: dict[str, Any] = {}
    if summary:
        totals = dict(summary.get("totals") or {})
        raw = summary.get("partitions") or []
        if isinstance(raw, Mapping):
            raw = [{"partition": k, **v} for k, v in raw.items() if isinstance(v, Mapping)]
        per_partition = [dict(p) for p in raw if isinstance(p, Mapping)]
    meta = body.get("metadata") or {}
    shown = audit_summary_doc(last)
    if shown is not None and last:
        # counts the audit adds when it has them (its summary's content digests, records
        # deleted by retention before they could be checked)
        shown.update({k: _int(last[k]) for k in AUDIT_EXTRA_COUNTS if k in last})
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "scheduled": bool((body.get("spec") or {}).get("reconciliation")),
        "last": shown,
        "report": (last or {}).get("reportRef"),
        "condition": cond,
        "totals": totals,
        "partitions": per_partition,
    }


AUDIT_EXTRA_COUNTS: Final = ("contentMismatches", "unverifiable")
_AUDIT_COUNTS: Final = (
    "input", "valid", "distinct", "published", "deadLettered", "pending", "duplicates",
    "missing", "missingDeadLetters", "unexpected", "orderViolations",
)  # fmt: skip


def render_audit(doc: Mapping[str, Any], now: datetime) -> str:
    last = doc.get("last")
    if not last:
        if not doc.get("scheduled"):
            return f"{doc['name']}: no audit scheduled (spec.reconciliation is not set)."
        return f"{doc['name']}: no audit result yet."
    lines = [f"{doc['namespace']}/{doc['name']}: audit {audit_text(last, now)}"]
    lines.append(
        f"  run {show(last.get('runId'))} finished {show(last.get('time'))}; "
        f"unexpected {show(last.get('unexpected'))}, order violations "
        f"{show(last.get('orderViolations'))}, invalid records without a dead letter "
        f"{show(last.get('missingDeadLetters') or 0)}"
        + "".join(f", {k} {show(last[k])}" for k in AUDIT_EXTRA_COUNTS if k in last)
    )
    totals = doc.get("totals") or {}
    parts = doc.get("partitions") or []
    if parts:
        cols = [k for k in _AUDIT_COUNTS if any(k in p for p in parts)]
        lines.append(
            table(
                ("P", *(c.upper() for c in cols)),
                [(p.get("partition"), *(p.get(c) for c in cols)) for p in parts],
            )
        )
    elif totals:
        lines.append(
            "  " + ", ".join(f"{k} {show(totals[k])}" for k in _AUDIT_COUNTS if k in totals)
        )
    report = doc.get("report") or {}
    if report:
        lines.append("  report: " + ", ".join(f"{k} {v}" for k, v in report.items()))
    return "\n".join(lines)


# ------------------------------------------------------------------ switch-ownership
SWITCH_OFF, SWITCH_IN_PROGRESS, SWITCH_DONE, SWITCH_OWNED = (
    "off", "switching", "switched", "owned"
)  # fmt: skip


def switch_state(body: Mapping[str, Any]) -> str:
    """Where a pipeline stands with ownership (`dedupctl switch-ownership`): `off` (its
    workers started before ownership: OwnershipOff, the switch may be asked), `switching`
    (asked, or the operator is stopping or starting its workers), `switched` (done),
    `owned` (created under ownership: nothing to switch)."""
    status = body.get("status") or {}
    recorded = status.get(ownership_status.STATUS_KEY) or {}
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    asked = annotations.get(names.ANNOTATION_SWITCH_TO_OWNERSHIP) == "true"
    switching = any(
        c.get("type") == ownership_status.OWNERSHIP_SWITCHING and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if recorded.get("switched"):
        return SWITCH_IN_PROGRESS if switching else SWITCH_DONE
    if recorded.get("enabled") is False or (not recorded and ownership_status.ran_before(status)):
        return SWITCH_IN_PROGRESS if asked or recorded.get("switching") else SWITCH_OFF
    return SWITCH_OWNED


def switch_plan_text(body: Mapping[str, Any]) -> str:
    """What switching this OwnershipOff pipeline to ownership does, for a person."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    name, ns = meta.get("name"), meta.get("namespace")
    workers = spec.get("partitions")
    kafka = spec.get("kafka") or {}
    topic = kafka.get("ownedTopic") or names.owned_topic(str(ns), str(name))
    window = (spec.get("window") or {}).get("duration") or "its window"
    return "\n".join(
        [
            f"Switching pipeline {ns}/{name} ({workers} workers, condition OwnershipOff) to "
            "ownership, in one step:",
            "  1. every worker stops: its pod is deleted and its Lease must be free or run "
            "out, so no old worker can commit again. The output pauses from here;",
            f"  2. the internal topic {topic} is "
            + ("checked (kafka.ownedTopic)" if kafka.get("ownedTopic") else "created")
            + f" ({workers} partitions);",
            "  3. every worker starts under ownership at a new epoch. Each first completes "
            "its store: it adds the ids it owns from every other output partition over the "
            f"window ({window}), then publishes again;",
            "  4. from then on each id is published once by its owner (murmur2(id) % "
            f"{workers}) to that output partition, whatever partition producers send it to.",
            "The pause is about a worker restart plus one scan of the output over the window.",
            "The switch is one way: a worker from before ownership refuses a switched store.",
        ]
    )
