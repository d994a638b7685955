"""The worker's metrics as others read them: the series' names, one scrape, the sums.

The worker exports these series (`dedup_worker.metrics` registers them under these
names); the operator scrapes each Ready worker into the pipeline's status and dedupctl
shows them, so every name is written here once. A counter is registered under its name
and its samples in the /metrics text are named `<name>_total` (the `*_TOTAL` names the
readers look up); a gauge's samples carry its name. Every series is labelled by
`pipeline` and `partition` (dead letters also by `reason`); the readers sum over labels.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from typing import Final

from dedup_contract import names

# counters
RECORDS_IN: Final = "dedup_records_in"
RECORDS_FORWARDED: Final = "dedup_records_forwarded"
RECORDS_RECEIVED: Final = "dedup_records_received"
RECORDS_OUT: Final = "dedup_records_out"
DUPLICATES: Final = "dedup_duplicates"
DEAD_LETTERS: Final = "dedup_dead_letters"
TRANSACTIONS: Final = "dedup_transactions"
TRANSACTION_ABORTS: Final = "dedup_transaction_aborts"
FENCING_EVENTS: Final = "dedup_fencing_events"
PAUSES: Final = "dedup_pauses"
PAUSED_SECONDS: Final = "dedup_paused_seconds"
EXPIRED_IDS: Final = "dedup_expired_ids"
# gauges
FORWARDED_STALLED_SECONDS: Final = "dedup_forwarded_stalled_seconds"
FORWARDED_LAG: Final = "dedup_forwarded_lag"
PAUSED: Final = "dedup_paused"
STORE_KEYS: Final = "dedup_store_keys"
STORE_BYTES: Final = "dedup_store_bytes"
WINDOW_AGE_SECONDS: Final = "dedup_window_age_seconds"
CONSUMER_LAG: Final = "dedup_consumer_lag"
RECOVERY_SECONDS: Final = "dedup_recovery_seconds"
RECOVERED_IDS: Final = "dedup_recovered_ids"
# histogram
BATCH_COMMIT_SECONDS: Final = "dedup_batch_commit_seconds"

# the counters' samples the operator and dedupctl read (`<counter>_total`)
RECORDS_IN_TOTAL: Final = "dedup_records_in_total"
RECORDS_FORWARDED_TOTAL: Final = "dedup_records_forwarded_total"
RECORDS_OUT_TOTAL: Final = "dedup_records_out_total"
DUPLICATES_TOTAL: Final = "dedup_duplicates_total"
DEAD_LETTERS_TOTAL: Final = "dedup_dead_letters_total"


def scrape(pod_ip: str, port: int = names.METRICS_PORT, timeout_s: float = 1.0) -> str | None:
    """A worker's /metrics text, or None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{pod_ip}:{port}/metrics", timeout=timeout_s) as r:
            body: bytes = r.read()
            return body.decode()
    except OSError:
        return None


def worker_counters(text: str, wanted: Sequence[str]) -> dict[str, float]:
    """Sum of each wanted sample name (e.g. `DUPLICATES_TOTAL`) in a /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += float(sample.value)
    return totals
