"""From the audit's result ConfigMap to the pipeline's status (pure).

The scheduled `dedup-audit` writes its JSON summary (docs/design.md, "Result to the
pipeline") into the ConfigMap `P-reconciliation`. Each pass the operator reads it and,
when its `finishedAt` is newer than `status.lastReconciliation.time`, takes it over:
`status.lastReconciliation` {time, passed, checked (= totals.input), duplicates, missing,
unexpected, orderViolations, runId, reportRef {configMap}; missingDeadLetters,
contentMismatches, unverifiable and misplaced when the summary has them}, one Event
(ReconciliationPassed / ReconciliationFailed) and the metrics. The condition
`ReconciliationHealthy` is derived from `lastReconciliation` on every pass, so it stays
as long as the pipeline has a reconciliation. Under the Spark operator the state of the
newest run (`status.applicationState.state` of its SparkApplication) is copied too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dedup_contract.timefmt import format_time_exact, parse_time
from dedup_operator.status_records import Condition

CONDITION: Final = "ReconciliationHealthy"
FINDINGS: Final = ("duplicates", "missing", "unexpected", "orderViolations")


class SummaryError(ValueError):
    """The result ConfigMap holds no summary the operator can read."""


@dataclass(frozen=True)
class Outcome:
    """What one pass makes of the result: the new `lastReconciliation` (None: keep the
    previous one), and whether it is a new audit result (its Event: `events.audit_result`)."""

    last: dict[str, Any] | None
    new_result: bool = False

    @property
    def passed(self) -> bool | None:
        return None if self.last is None else bool(self.last.get("passed"))


def parse_summary(text: str | None) -> dict[str, Any]:
    """The summary JSON; SummaryError says what is wrong with it."""
    if not text:
        raise SummaryError("no summary.json")
    try:
        summary = json.loads(text)
    except ValueError as exc:
        raise SummaryError(f"summary.json is not JSON: {exc}") from None
    if not isinstance(summary, dict):
        raise SummaryError("summary.json is not an object")
    try:
        finished = parse_time(summary.get("finishedAt"))
    except ValueError:
        finished = None
    if finished is None:
        raise SummaryError("summary.json has no valid finishedAt")
    if not isinstance(summary.get("passed"), bool):
        raise SummaryError("summary.json has no boolean passed")
    if not isinstance(summary.get("totals"), dict):
        raise SummaryError("summary.json has no totals")
    return summary


def last_reconciliation(summary: Mapping[str, Any], configmap: str) -> dict[str, Any]:
    """`status.lastReconciliation` of one parsed summary."""
    totals = summary["totals"]
    finished = parse_time(summary["finishedAt"])
    assert finished is not None
    last: dict[str, Any] = {
        "time": format_time_exact(finished),
        "passed": bool(summary["passed"]),
        "checked": int(totals.get("input", 0)),
        **{name: int(totals.get(name, 0)) for name in FINDINGS},
        "runId": str(summary.get("runId") or ""),
        "reportRef": {"configMap": configmap},
    }
    # Counts newer audits report (older summaries lack them): invalid input with no dead
    # letter and output whose contents changed (both fail the audit); input retention
    # deleted before it could be checked (fails it unless run with --unverifiable warn).
    # Under ownership: publications not on their id's owner's partition (fail it too).
    for name in ("missingDeadLetters", "contentMismatches", "unverifiable", "misplaced"):
        if name in totals:
            last[name] = int(totals[name])
    if summary.get("report"):
        last["reportRef"]["report"] = str(summary["report"])
    return last


def _findings(last: Mapping[str, Any]) -> str:
    return (
        f"{last.get('duplicates', 0)} duplicates, {last.get('missing', 0)} missing, "
        f"{last.get('unexpected', 0)} unexpected, {last.get('orderViolations', 0)} order "
        f"violations{_dead_letters(last)} in {last.get('checked', 0)} input records checked"
    )


def _dead_letters(last: Mapping[str, Any]) -> str:
    n = int(last.get("missingDeadLetters") or 0)
    changed = int(last.get("contentMismatches") or 0)
    blind = int(last.get("unverifiable") or 0)
    misplaced = int(last.get("misplaced") or 0)
    return (
        (f", {misplaced} published on another owner's partition" if misplaced else "")
        + (f", {n} invalid records without a dead letter" if n else "")
        + (f", {changed} published with changed contents" if changed else "")
        + (f", {blind} unverifiable (deleted by retention)" if blind else "")
    )


def message(last: Mapping[str, Any]) -> str:
    verdict = "passed" if last.get("passed") else "FAILED"
    run = f" (run {last['runId']} at {last.get('time')})" if last.get("runId") else ""
    return f"audit {verdict}: {_findings(last)}{run}"


def condition(last: Mapping[str, Any]) -> Condition:
    """ReconciliationHealthy from the last result (False with the numbers)."""
    passed = bool(last.get("passed"))
    return Condition(CONDITION, passed, "AuditPassed" if passed else "AuditFailed", message(last))


def outcome(
    summary_text: str | None,
    configmap: str,
    previous: Mapping[str, Any] | None,
    spark_application: tuple[str, str] | None = None,
) -> Outcome:
    """The pass's decision: a summary newer than `previous` (status.lastReconciliation)
    replaces it (a new result: the plan tells its Event); `spark_application` (name, state) of the newest
    Spark operator run is recorded either way. Unreadable summaries raise SummaryError."""
    last: dict[str, Any] | None = None
    new_result = False
    if summary_text is not None:
        summary = parse_summary(summary_text)
        finished = parse_time(summary["finishedAt"])
        before = parse_time((previous or {}).get("time"))
        assert finished is not None
        if before is None or finished > before:
            last = last_reconciliation(summary, configmap)
            new_result = True
    if spark_application is not None:
        base = last if last is not None else dict(previous or {})
        name, state = spark_application
        if base.get("sparkApplication") != name or base.get("sparkApplicationState") != state:
            last = {**base, "sparkApplication": name, "sparkApplicationState": state}
    return Outcome(last, new_result)


def newest_spark_application(apps: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(name, status.applicationState.state) of the most recently created run."""
    if not apps:
        return None

    def created(app: Mapping[str, Any]) -> tuple[str, str]:
        meta = app.get("metadata") or {}
        return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")

    newest = max(apps, key=created)
    state = ((newest.get("status") or {}).get("applicationState") or {}).get("state")
    return str((newest.get("metadata") or {}).get("name")), str(state or "")
