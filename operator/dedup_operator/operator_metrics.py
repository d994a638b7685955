"""The operator's own Prometheus metrics (served by `dedup-operator --metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "dedup_operator_reconciles",
    "Reconcile passes over a pipeline, by result (ok, invalid_spec, error, conflict, not-leader)",
    ("namespace", "pipeline", "result"),
)
RECONCILE_SECONDS = Histogram(
    "dedup_operator_reconcile_seconds",
    "Duration of one reconcile pass",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
FAILOVERS_STARTED = Counter(
    "dedup_operator_failovers_started",
    "Partition handovers begun, by reason (NodeLost, PodFailed, PodGone, NodeDrained, SpecChanged)",
    ("namespace", "pipeline", "reason"),
)
FAILOVERS = Counter(
    "dedup_operator_failovers",
    "Partition handovers completed, by reason",
    ("namespace", "pipeline", "reason"),
)
FAILOVER_SECONDS = Histogram(
    "dedup_operator_failover_seconds",
    "Time from the handover decision to the replacement being Ready",
    ("reason",),
    buckets=(1, 2.5, 5, 10, 15, 20, 30, 45, 60, 120, 300, 600),
)
FAILOVER_STEP_SECONDS = Gauge(
    "dedup_operator_failover_step_seconds",
    "Seconds after the decision at which each step of the last handover completed",
    ("namespace", "pipeline", "partition", "step"),
)
PARTITIONS_NOT_RUNNING = Gauge(
    "dedup_operator_partitions_not_running",
    "Partitions whose worker is not Running and Ready",
    ("namespace", "pipeline"),
)
RECONCILIATIONS = Counter(
    "dedup_operator_reconciliations",
    "Scheduled audits (dedup-audit) whose result the operator took over, by result "
    "(passed, failed)",
    ("namespace", "pipeline", "result"),
)
RECONCILIATION_DUPLICATES = Gauge(
    "dedup_operator_reconciliation_duplicates",
    "Ids published more than once within the window, in the last audit",
    ("namespace", "pipeline"),
)
RECONCILIATION_MISSING = Gauge(
    "dedup_operator_reconciliation_missing",
    "Valid input ids neither published nor dead-lettered, in the last audit",
    ("namespace", "pipeline"),
)
API_THROTTLED = Gauge(
    "dedup_operator_api_throttled_requests",
    "Requests the API server refused with 429 (priority and fairness) and the operator's "
    "client sent again after their Retry-After, since it started",
)
WATCH_LISTS = Gauge(
    "dedup_operator_watch_lists",
    "Full lists of a watched kind since the operator started: 1 at start, one more per "
    "relist (after a 410 Gone, or a watch broken off)",
    ("kind",),
)
PASSES_WOKEN = Counter(
    "dedup_operator_passes_woken",
    "Passes called for before their time by what a pipeline reads changing (`kind`: pods, "
    "volumeclaims, leases, pipelines, nodes, volumeattachments; silent-node: a node of "
    "its workers silent for its nodeLostAfter; relist: a watch listed again)",
    ("kind",),
)
PIPELINES_AT_REST = Gauge(
    "dedup_operator_pipelines_at_rest",
    "Pipelines with nothing pending, passed over at the resync or when what they read changes",
)
EVENTS_DROPPED = Gauge(
    "dedup_operator_events_dropped",
    "Events not posted since the operator started because 1,000 were already waiting "
    "(each also logged as a warning)",
)
