"""The audit's summary -> status.lastReconciliation, condition and Event (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dedup_operator import audit_status as r
from dedup_operator import events


def told(out: r.Outcome) -> events.Event | None:
    """The Event a pass posts for this outcome (a new result only)."""
    return events.audit_result(out.last) if out.new_result and out.last is not None else None


def summary(passed: bool = True, finished: str = "2026-11-22T03:10:00Z", **totals: int) -> str:
    counts = {"input": 1000, "duplicates": 0, "missing": 0, "unexpected": 0, "orderViolations": 0}
    counts.update(totals)
    return json.dumps(
        {
            "pipeline": "events",
            "namespace": "analytics",
            "runId": "run-1",
            "startedAt": "2026-11-22T03:00:00Z",
            "finishedAt": finished,
            "passed": passed,
            "totals": counts,
            "report": "/reports",
        }
    )


def test_first_passing_result_lands_in_status_with_a_normal_event() -> None:
    out = r.outcome(summary(), "events-reconciliation", None)
    assert out.last == {
        "time": "2026-11-22T03:10:00Z",
        "passed": True,
        "checked": 1000,
        "duplicates": 0,
        "missing": 0,
        "unexpected": 0,
        "orderViolations": 0,
        "runId": "run-1",
        "reportRef": {"configMap": "events-reconciliation", "report": "/reports"},
    }
    assert told(out) is not None and told(out)[:2] == ("Normal", "ReconciliationPassed")
    c = r.condition(out.last)
    assert (c.type, c.status, c.reason) == ("ReconciliationHealthy", True, "AuditPassed")


def test_failing_result_flips_the_condition_with_the_numbers() -> None:
    out = r.outcome(
        summary(False, duplicates=2, missing=3, unexpected=1, orderViolations=4),
        "events-reconciliation",
        {"time": "2026-11-21T03:10:00Z", "passed": True},
    )
    assert out.last is not None and out.passed is False
    assert told(out) is not None and told(out)[:2] == ("Warning", "ReconciliationFailed")
    c = r.condition(out.last)
    assert c.status is False and c.reason == "AuditFailed"
    for text in ("2 duplicates", "3 missing", "1 unexpected", "4 order violations", "1000"):
        assert text in c.message
        assert text in told(out)[2]


def test_missing_dead_letters_are_reported() -> None:
    out = r.outcome(summary(False, missingDeadLetters=7), "cm", None)
    assert out.last is not None and out.last["missingDeadLetters"] == 7
    assert "7 invalid records without a dead letter" in r.condition(out.last).message


def test_misplaced_publications_are_reported() -> None:
    out = r.outcome(summary(False, misplaced=5), "cm", None)
    assert out.last is not None and out.last["misplaced"] == 5
    assert "5 published on another owner's partition" in r.condition(out.last).message


def test_same_or_older_result_changes_nothing() -> None:
    previous = r.last_reconciliation(json.loads(summary()), "events-reconciliation")
    assert r.outcome(summary(), "events-reconciliation", previous) == r.Outcome(None)
    older = summary(finished="2026-11-22T01:00:00Z")
    assert r.outcome(older, "events-reconciliation", previous) == r.Outcome(None)
    assert r.outcome(None, "events-reconciliation", previous) == r.Outcome(None)


def test_spark_application_state_is_recorded() -> None:
    previous: dict[str, Any] = {"time": "2026-11-22T03:10:00Z", "passed": True}
    out = r.outcome(None, "cm", previous, ("events-reconcile-1", "RUNNING"))
    assert told(out) is None
    assert out.last == {
        **previous,
        "sparkApplication": "events-reconcile-1",
        "sparkApplicationState": "RUNNING",
    }
    assert r.outcome(None, "cm", out.last, ("events-reconcile-1", "RUNNING")).last is None
    fresh = r.outcome(
        summary(finished="2026-11-22T04:00:00Z"),
        "cm",
        out.last,
        ("events-reconcile-2", "COMPLETED"),
    )
    assert fresh.last is not None and fresh.last["sparkApplicationState"] == "COMPLETED"
    assert fresh.last["time"] == "2026-11-22T04:00:00Z" and told(fresh) is not None


def test_newest_spark_application() -> None:
    apps: list[dict[str, Any]] = [
        {"metadata": {"name": "a", "creationTimestamp": "2026-11-22T03:00:00Z"}},
        {
            "metadata": {"name": "b", "creationTimestamp": "2026-11-22T04:00:00Z"},
            "status": {"applicationState": {"state": "COMPLETED"}},
        },
    ]
    assert r.newest_spark_application(apps) == ("b", "COMPLETED")
    assert r.newest_spark_application(apps[:1]) == ("a", "")
    assert r.newest_spark_application([]) is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no summary"),
        ("{", "not JSON"),
        ("[]", "not an object"),
        ('{"passed": true, "totals": {}}', "finishedAt"),
        ('{"finishedAt": "2026-11-22T03:00:00Z", "totals": {}}', "passed"),
        ('{"finishedAt": "2026-11-22T03:00:00Z", "passed": false}', "totals"),
    ],
)
def test_unreadable_summaries_say_why(text: str, why: str) -> None:
    with pytest.raises(r.SummaryError, match=why):
        r.outcome(text, "cm", None)


def test_content_mismatches_and_unverifiable_input_reach_the_status_and_the_message() -> None:
    out = r.outcome(summary(False, contentMismatches=2, unverifiable=40), "cm", None)
    assert out.last is not None
    assert (out.last["contentMismatches"], out.last["unverifiable"]) == (2, 40)
    assert told(out) is not None
    assert "2 published with changed contents" in told(out)[2]
    assert "40 unverifiable (deleted by retention)" in told(out)[2]
