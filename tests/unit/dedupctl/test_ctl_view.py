"""dedupctl's pure core: status, handover history and audit documents from what the
cluster holds, their tables, and the stable `-o json` schema."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from dedupctl import cli as ctl
from dedupctl import view as ctl_view
from dedupctl.view import WorkerSample

NOW = datetime(2026, 11, 23, 18, 0, 0, tzinfo=UTC)

METRICS = """\
# TYPE dedup_records_in_total counter
dedup_records_in_total{pipeline="events",partition="0"} 1200.0
# TYPE dedup_records_out_total counter
dedup_records_out_total{pipeline="events",partition="0"} 1100.0
# TYPE dedup_duplicates_total counter
dedup_duplicates_total{pipeline="events",partition="0"} 96.0
# TYPE dedup_dead_letters_total counter
dedup_dead_letters_total{pipeline="events",partition="0",reason="invalid_json"} 3.0
dedup_dead_letters_total{pipeline="events",partition="0",reason="missing_id"} 1.0
# TYPE dedup_consumer_lag gauge
dedup_consumer_lag{pipeline="events",partition="0"} 7.0
"""

LAST_HANDOVER = {
    "reason": "NodeLost",
    "started": "2026-11-23T17:58:00Z",
    "fromEpoch": 1,
    "fromPod": "events-p0-e1",
    "fromNode": "node-a",
    "steps": {"fenced": 5.1, "released": 5.2, "detached": 6.0, "started": 6.1, "ready": 14.3},
    "release": "OutOfServiceTaint",
    "releaseWhy": "tainted",
    "toPod": "events-p0-e2",
}


def pipeline(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "analytics",
            "name": "events",
            "generation": 2,
            "creationTimestamp": "2026-11-23T17:00:00Z",
        },
        "spec": {"partitions": 2, "reconciliation": {"schedule": "0 3 * * *"}},
        "status": {
            "phase": "Running",
            "observedGeneration": 2,
            "readyPartitions": 2,
            "duplicatesDropped": 150,
            "recordsIn": 2300,
            "recordsOut": 2100,
            "consumerLag": 9,
            "failovers": 1,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AllPartitionsReady",
                    "message": "2/2 partitions ready",
                    "lastTransitionTime": "2026-11-23T17:58:15Z",
                },
            ],
            "partitions": [
                {
                    "partition": 0,
                    "epoch": 2,
                    "phase": "Running",
                    "ready": True,
                    "pod": "events-p0-e2",
                    "node": "node-b",
                    "lag": 7,
                    "duplicates": 96,
                    "lastHandover": LAST_HANDOVER,
                    "lastFailover": "2026-11-23T17:58:14Z",
                },
                {
                    "partition": 1,
                    "epoch": 1,
                    "phase": "Running",
                    "ready": True,
                    "pod": "events-p1-e1",
                    "node": "node-c",
                    "lag": 2,
                    "duplicates": 54,
                },
            ],
            "lastReconciliation": {
                "time": "2026-11-23T17:30:00Z",
                "passed": True,
                "checked": 2300,
                "duplicates": 0,
                "missing": 0,
                "unexpected": 0,
                "orderViolations": 0,
                "runId": "run-1",
                "reportRef": {"configMap": "events-reconciliation"},
            },
            **status,
        },
    }


def test_worker_metrics_summed_over_labels() -> None:
    s = ctl_view.parse_worker_metrics(METRICS, at=10.0)
    assert (s.records_in, s.records_out, s.duplicates, s.dead_letters, s.lag) == (
        1200,
        1100,
        96,
        4,
        7,
    )


def test_input_rate_from_two_scrapes() -> None:
    a = WorkerSample(10.0, 1000, 900, 0, 0, 0)
    b = WorkerSample(12.0, 1300, 1100, 0, 0, 0)
    assert ctl_view.input_rate(a, b) == 150.0
    assert ctl_view.input_rate(None, b) is None
    assert ctl_view.input_rate(b, a) is None  # time went back: no rate
    restarted = WorkerSample(14.0, 5, 5, 0, 0, 0)
    assert ctl_view.input_rate(b, restarted) is None  # a new worker's counters restart


# The `status -o json` schema: scripts depend on these keys. Change them only with a
# new STATUS_SCHEMA_VERSION.
STATUS_KEYS = {"schemaVersion", "pipelines"}
PIPELINE_KEYS = {
    "namespace", "name", "phase", "partitions", "readyPartitions", "recordsIn", "recordsOut",
    "duplicatesDropped", "deadLetters", "consumerLag", "misroutedShare", "inputRate", "failovers",
    "observedGeneration", "generation", "created", "conditions", "lastReconciliation",
    "partitionStatus",
}  # fmt: skip
PARTITION_KEYS = {
    "partition", "node", "pod", "epoch", "phase", "ready", "inputRate", "recordsIn",
    "recordsOut", "forwarded", "lag", "duplicatesDropped", "deadLetters", "waitingFor", "handover",
    "lastHandover", "lastFailover",
}  # fmt: skip
HANDOVER_KEYS = {
    "reason", "started", "fromPod", "fromNode", "toPod", "release", "releaseWhy", "steps",
    "totalSeconds", "complete",
}  # fmt: skip
AUDIT_KEYS = {
    "time", "passed", "checked", "duplicates", "missing", "unexpected", "orderViolations",
    "missingDeadLetters", "runId",
}  # fmt: skip
CONDITION_KEYS = {"status", "reason", "message", "since"}


def test_status_json_schema_is_stable() -> None:
    sample = ctl_view.parse_worker_metrics(METRICS, at=1.0)
    doc = ctl_view.status_doc([ctl_view.pipeline_doc(pipeline(), {0: sample}, {0: 12.5})])
    doc = json.loads(json.dumps(doc))  # what -o json prints
    assert set(doc) == STATUS_KEYS
    # 2 added the handovers' releaseWhy; 3 the misrouted share and each worker's forwarded
    assert doc["schemaVersion"] == 3
    (p,) = doc["pipelines"]
    assert set(p) == PIPELINE_KEYS
    assert set(p["conditions"]["Ready"]) == CONDITION_KEYS
    assert set(p["lastReconciliation"]) == AUDIT_KEYS
    for q in p["partitionStatus"]:
        assert set(q) == PARTITION_KEYS
    assert set(p["partitionStatus"][0]["lastHandover"]) == HANDOVER_KEYS


def test_status_values_come_from_status_and_the_workers_metrics() -> None:
    sample = ctl_view.parse_worker_metrics(METRICS, at=1.0)
    p = ctl_view.pipeline_doc(pipeline(), {0: sample}, {0: 12.5})
    assert (p["phase"], p["readyPartitions"], p["partitions"]) == ("Running", 2, 2)
    assert (p["recordsIn"], p["duplicatesDropped"], p["consumerLag"]) == (2300, 150, 9)
    q0, q1 = p["partitionStatus"]
    assert (q0["node"], q0["pod"], q0["epoch"], q0["inputRate"]) == (
        "node-b",
        "events-p0-e2",
        2,
        12.5,
    )
    assert (q0["deadLetters"], q0["recordsIn"], q0["lag"]) == (4, 1200, 7)
    assert q0["lastHandover"]["totalSeconds"] == 14.3 and q0["lastHandover"]["complete"]
    # partition 1's worker did not answer: status's own numbers, the rest unknown
    assert (q1["lag"], q1["duplicatesDropped"]) == (2, 54)
    assert (q1["deadLetters"], q1["inputRate"], q1["recordsIn"]) == (None, None, None)
    # a pipeline total is shown only when every partition reported it
    assert p["deadLetters"] is None and p["inputRate"] is None


def test_status_table_shows_dash_for_the_unknown_and_the_handover_steps() -> None:
    sample = ctl_view.parse_worker_metrics(METRICS, at=1.0)
    doc = ctl_view.status_doc([ctl_view.pipeline_doc(pipeline(), {0: sample}, {0: 12.5})])
    text = ctl_view.render_status(doc, NOW)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["NAMESPACE", "NAME", "PHASE", "READY"]
    assert lines[1].split()[:4] == ["analytics", "events", "Running", "2/2"]
    row0 = next(line for line in lines if line.startswith("0  "))
    assert "node-b" in row0 and "12.5" in row0
    assert "NodeLost 2m ago, 14.3s (fenced 5.1s released 5.2s detached 6.0s" in row0
    row1 = next(line for line in lines if line.startswith("1  "))
    assert row1.split()[5] == "—"  # IN/S unknown
    assert "last audit: passed 30m ago: 2300 checked, 0 duplicates, 0 missing" in text


def test_status_table_lists_waiting_partitions_and_bad_conditions() -> None:
    body = pipeline(
        phase="Degraded",
        conditions=[
            {"type": "Ready", "status": "False", "reason": "PartitionsNotReady", "message": "1/2"},
            {
                "type": "FailingOver",
                "status": "True",
                "reason": "HandoverInProgress",
                "message": "p0",
            },
        ],
    )
    body["status"]["partitions"][0] = {
        "partition": 0,
        "epoch": 1,
        "phase": "FailingOver",
        "ready": False,
        "waitingFor": "the old worker's Lease to run out",
        "handover": {k: v for k, v in LAST_HANDOVER.items() if k != "toPod"}
        | {"steps": {"fenced": 5.1}},
    }
    text = ctl_view.render_status(ctl_view.status_doc([ctl_view.pipeline_doc(body)]), NOW)
    assert "NodeLost 2m ago, in progress (fenced 5.1s)" in text
    assert "p0: the old worker's Lease to run out" in text
    assert "FailingOver: HandoverInProgress: p0" in text
    assert "Ready: PartitionsNotReady: 1/2" in text


def _waiting_on_force_detach(release: str, why: str, steps: dict[str, float]) -> str:
    """`dedupctl status` of a pipeline whose partition 0 hands over with this release."""
    from dedup_contract.handover import taint_blocked_why

    body = pipeline(phase="Degraded")
    body["status"]["partitions"][0] = {
        "partition": 0,
        "epoch": 1,
        "phase": "FailingOver",
        "ready": False,
        "waitingFor": "volume to detach (csi-1 on node-a)",
        "handover": {k: v for k, v in LAST_HANDOVER.items() if k != "toPod"}
        | {"steps": steps, "release": release,
           "releaseWhy": why or taint_blocked_why("node-a", "it would evict shop/db-0, ops/x-1")},
    }  # fmt: skip
    return ctl_view.render_status(ctl_view.status_doc([ctl_view.pipeline_doc(body)]), NOW)


def test_status_says_plainly_when_a_handover_waits_on_the_force_detach() -> None:
    """A TaintBlocked handover (started 2 min ago, pod released 5.2 s after): the 6-minute
    wait, about how long is left, and which pods block the taint, from its release fields."""
    text = _waiting_on_force_detach("TaintBlocked", "", {"fenced": 5.1, "released": 5.2})
    lines = text.splitlines()
    at = lines.index("force-detach:")
    line = lines[at + 1]
    assert line.startswith("  p0: waits for Kubernetes' 6-minute force-detach of its volume")
    assert "(about 4m05s left)" in line  # 360 - (120 - 5.2)
    assert "the out-of-service taint on node-a is blocked by shop/db-0, ops/x-1" in line
    assert "dedicated node pool" in line and "node.cloudprovider.kubernetes.io/shutdown" in line
    # unknown pods, the WaitForDetach policy: said too, with their own reason
    from dedup_contract.handover import taint_blocked_why

    unknown = taint_blocked_why("node-a", "its pods could not be listed (node-a)")
    text = _waiting_on_force_detach("TaintBlocked", unknown, {"fenced": 5.1})
    assert "could not list the pods on node-a" in text and "left)" not in text
    text = _waiting_on_force_detach(
        "WaitForDetach",
        "pod force-deleted; waiting for the attach/detach controller's force-detach (6 min)",
        {"fenced": 5.1, "released": 5.2},
    )
    assert "force-detach of its volume (about 4m05s left): releaseVolume is WaitForDetach" in text


def test_status_says_nothing_of_the_force_detach_otherwise() -> None:
    # a taint released the volume (the shutdown signal, or only fenced workers there)
    shut = "node node-a tainted out-of-service: node node-a is shut down (...)"
    assert "force-detach:" not in _waiting_on_force_detach("OutOfServiceTaint", shut, {})
    # the Node object was deleted: the controller detaches without the 6 minutes
    assert "force-detach:" not in _waiting_on_force_detach(
        "WaitForDetach", "node node-a was deleted", {"released": 1.0}
    )
    # detached already, or a completed handover (the fixture's lastHandover)
    blocked_but_detached = {"fenced": 1.0, "released": 1.1, "detached": 370.0}
    assert "force-detach:" not in _waiting_on_force_detach("TaintBlocked", "", blocked_but_detached)
    doc = ctl_view.status_doc([ctl_view.pipeline_doc(pipeline())])
    assert "force-detach:" not in ctl_view.render_status(doc, NOW)


def test_no_pipelines() -> None:
    assert ctl_view.render_status(ctl_view.status_doc([]), NOW) == "No pipelines found."


def ev(reason: str, message: str, at: str) -> dict[str, Any]:
    return {"type": "Normal", "reason": reason, "message": message, "time": at}


def test_failover_history_from_events_joined_with_status() -> None:
    events = [
        ev(
            "FailoverStarted",
            "partition 1: PodGone: moving from events-p1-e1 on - (epoch 1)",
            "2026-11-23T17:40:00Z",
        ),
        ev(
            "FailoverCompleted",
            "partition 1: events-p1-e2 is Ready after 9.9s (detached 1.3s, fenced 1.3s, "
            "released 1.3s, started 1.3s, ready 9.9s)",
            "2026-11-23T17:40:10Z",
        ),
        ev(
            "FailoverStarted",
            "partition 0: NodeLost: moving from events-p0-e1 on node-a (epoch 1)",
            "2026-11-23T17:58:00Z",
        ),
        ev("WorkerFenced", "partition 0: Lease ...", "2026-11-23T17:58:05Z"),
        ev(
            "FailoverCompleted",
            "partition 0: events-p0-e2 is Ready after 14.3s (fenced 5.1s, released 5.2s, "
            "detached 6.0s, started 6.1s, ready 14.3s)",
            "2026-11-23T17:58:14Z",
        ),
    ]
    rows = ctl_view.failover_rows(pipeline(), events)
    assert [(r["partition"], r["reason"], r["outcome"]) for r in rows] == [
        (1, "PodGone", "completed"),
        (0, "NodeLost", "completed"),
    ]
    first, second = rows
    assert (first["fromPod"], first["fromNode"], first["toPod"]) == (
        "events-p1-e1",
        None,
        "events-p1-e2",
    )
    assert first["totalSeconds"] == 9.9 and first["steps"]["detached"] == 1.3
    # the status record (exact step times) and the Events make one row
    assert second["steps"] == LAST_HANDOVER["steps"] and second["toPod"] == "events-p0-e2"
    assert (second["started"], second["finished"]) == (
        "2026-11-23T17:58:00Z",
        "2026-11-23T17:58:14Z",
    )
    text = ctl_view.render_failovers(rows)
    assert "events-p0-e1 on node-a" in text and "14.3s" in text
    assert "fenced 5.1s released 5.2s detached 6.0s started 6.1s ready 14.3s" in text


def test_failover_history_from_status_alone_when_events_expired() -> None:
    rows = ctl_view.failover_rows(pipeline(), [])
    assert len(rows) == 1
    r = rows[0]
    assert (r["partition"], r["reason"], r["totalSeconds"], r["toPod"]) == (
        0,
        "NodeLost",
        14.3,
        "events-p0-e2",
    )
    assert r["finished"] == "2026-11-23T17:58:14Z"


def test_failover_in_progress_and_cancelled() -> None:
    body = pipeline()
    body["status"]["partitions"][1]["handover"] = {
        "reason": "PodFailed",
        "started": "2026-11-23T17:59:50Z",
        "fromEpoch": 1,
        "fromPod": "events-p1-e1",
        "fromNode": "node-c",
        "steps": {"fenced": 0.2},
    }
    events = [
        ev(
            "FailoverStarted",
            "partition 1: PodGone: moving from x on - (epoch 3)",
            "2026-11-23T17:10:00Z",
        ),
        ev("FailoverCancelled", "partition 1: the pod came back", "2026-11-23T17:10:02Z"),
        ev(
            "FailoverStarted",
            "partition 1: PodFailed: moving from events-p1-e1 on node-c (epoch 1)",
            "2026-11-23T17:59:50Z",
        ),
    ]
    rows = ctl_view.failover_rows(body, events)
    outcomes = [(r["partition"], r["outcome"]) for r in rows]
    assert outcomes == [
        (1, "cancelled: the pod came back"),
        (0, "completed"),
        (1, "in progress"),
    ]
    assert rows[-1]["steps"] == {"fenced": 0.2} and rows[-1]["toPod"] is None
    assert "No handovers recorded" in ctl_view.render_failovers([])


def test_audit_document_with_per_partition_counts() -> None:
    summary = {
        "runId": "run-1",
        "totals": {"input": 2300, "published": 2100, "duplicates": 0, "missing": 0},
        "partitions": [
            {"partition": 0, "input": 1200, "published": 1100, "duplicates": 0, "missing": 0},
            {"partition": 1, "input": 1100, "published": 1000, "duplicates": 0, "missing": 0},
        ],
    }
    doc = ctl_view.audit_doc(pipeline(), summary)
    assert doc["last"]["passed"] is True and doc["last"]["checked"] == 2300
    assert [p["partition"] for p in doc["partitions"]] == [0, 1]
    text = ctl_view.render_audit(doc, NOW)
    assert text.startswith("analytics/events: audit passed 30m ago: 2300 checked")
    assert "P  INPUT  PUBLISHED  DUPLICATES  MISSING" in text
    assert "report: configMap events-reconciliation" in text


def test_audit_without_a_result_or_a_schedule() -> None:
    body = pipeline()
    del body["status"]["lastReconciliation"]
    assert "no audit result yet" in ctl_view.render_audit(ctl_view.audit_doc(body, None), NOW)
    del body["spec"]["reconciliation"]
    assert "no audit scheduled" in ctl_view.render_audit(ctl_view.audit_doc(body, None), NOW)


def test_cli_usage_exits_2_and_flags_go_anywhere(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ctl.main(["frobnicate"])
    assert exc.value.code == ctl.USAGE
    args = ctl.parser().parse_args(["-n", "a", "status", "p", "--context", "c", "-o", "json"])
    assert (args.namespace, args.context, args.pipeline, args.output) == ("a", "c", "p", "json")
    args = ctl.parser().parse_args(["audit", "p", "--now", "-n", "b"])
    assert (args.namespace, args.now) == ("b", True)


def test_a_missing_kubeconfig_is_one_line_and_exit_3(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        ctl.main(["status", "--kubeconfig", str(tmp_path / "nope")])
    assert exc.value.code == ctl.UNREACHABLE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dedupctl: kubeconfig ")


def test_audit_shows_the_counts_the_audit_adds_when_present() -> None:
    body = pipeline()
    body["status"]["lastReconciliation"].update(contentMismatches=2, unverifiable=0, passed=False)
    doc = ctl_view.audit_doc(body, None)
    assert (doc["last"]["contentMismatches"], doc["last"]["unverifiable"]) == (2, 0)
    text = ctl_view.render_audit(doc, NOW)
    assert "audit FAILED" in text and "contentMismatches 2, unverifiable 0" in text
    # the status document's schema stays as pinned
    p = ctl_view.pipeline_doc(body)
    assert set(p["lastReconciliation"]) == AUDIT_KEYS


def test_the_misrouted_share_is_the_workers_forwarded_input_over_their_input() -> None:
    body = pipeline()
    a = WorkerSample(1.0, 1000, 600, 0, 0, 0, forwarded=300)
    b = WorkerSample(1.0, 3000, 2000, 0, 0, 0, forwarded=100)
    p = ctl_view.pipeline_doc(body, {0: a, 1: b}, {})
    assert p["misroutedShare"] == 0.1
    assert [q["forwarded"] for q in p["partitionStatus"]] == [300, 100]
    assert ctl_view.pipeline_doc(body, {0: a}, {})["misroutedShare"] is None, "one not scraped"
    text = ctl_view.render_status(ctl_view.status_doc([p]), NOW)
    assert "MISROUTED" in text.splitlines()[0] and "10.0%" in text.splitlines()[1]


def test_pipeline_totals_are_the_workers_own_when_every_worker_answered() -> None:
    # the status's totals are refreshed at most once per --status-counters-interval
    # (60 s): with every worker's sample, the totals are theirs, live
    both = {
        0: ctl_view.parse_worker_metrics(METRICS, at=1.0),
        1: WorkerSample(1.0, 100, 90, 10, 0, 3),
    }
    p = ctl_view.pipeline_doc(pipeline(), both, {0: 12.5, 1: 1.0})
    assert (p["recordsIn"], p["recordsOut"]) == (1200 + 100, 1100 + 90)
    assert (p["duplicatesDropped"], p["consumerLag"]) == (96 + 10, 7 + 3)
