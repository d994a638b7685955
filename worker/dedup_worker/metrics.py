"""Prometheus metrics of a worker and the one HTTP port that serves them with the
health probes: `/metrics`, `/healthz` (process alive, loop not stuck; also while paused)
and `/readyz` (recovered and consuming; not while paused)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from dedup_contract import worker_metrics

LABELS = ("pipeline", "partition")


class WorkerMetrics:
    """Every series a worker exports. One registry per worker (tests run several)."""

    def __init__(self, pipeline: str, partition: int) -> None:
        self.registry = CollectorRegistry()
        labels = {"pipeline": pipeline, "partition": str(partition)}
        r = self.registry

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=r)

        self.records_in = counter(
            worker_metrics.RECORDS_IN,
            "Input records consumed (forwarded ones: dedup_records_received)",
        ).labels(**labels)
        self.forwarded = counter(
            worker_metrics.RECORDS_FORWARDED,
            "Records read whose id another worker owns, forwarded to it through the "
            "internal topic (over dedup_records_in: the misrouted share)",
        ).labels(**labels)
        self.received = counter(
            worker_metrics.RECORDS_RECEIVED,
            "Records read from the internal topic: forwarded to this worker by others",
        ).labels(**labels)
        self.forwarded_stalled = gauge(
            worker_metrics.FORWARDED_STALLED_SECONDS,
            "Age of the oldest open transaction holding forwarded records back on the "
            "internal partitions this worker reads (0: none). A forwarder killed "
            "mid-transaction holds them until its replacement starts or "
            "transaction.timeout.ms",
        ).labels(**labels)
        self.forwarded_lag = gauge(
            worker_metrics.FORWARDED_LAG,
            "Records forwarded to this worker not read yet (internal topic, read_committed)",
        ).labels(**labels)
        self.records_out = counter(
            worker_metrics.RECORDS_OUT, "Records published to the output topic"
        ).labels(**labels)
        self.duplicates = counter(
            worker_metrics.DUPLICATES, "Records dropped as duplicates of an id in the window"
        ).labels(**labels)
        self._dead_letters = Counter(
            worker_metrics.DEAD_LETTERS,
            "Records sent to the dead-letter topic, by reason",
            (*LABELS, "reason"),
            registry=r,
        )
        self._labels = labels
        self.transactions = counter(worker_metrics.TRANSACTIONS, "Committed transactions").labels(
            **labels
        )
        self.aborts = counter(worker_metrics.TRANSACTION_ABORTS, "Aborted transactions").labels(
            **labels
        )
        self.fencing_events = counter(
            worker_metrics.FENCING_EVENTS, "Times this worker found itself fenced"
        ).labels(**labels)
        self.paused = gauge(
            worker_metrics.PAUSED,
            "1 while paused: the Lease hold lapsed, nothing consumed or committed",
        ).labels(**labels)
        self.pauses = counter(
            worker_metrics.PAUSES, "Times this worker paused because its Lease hold lapsed"
        ).labels(**labels)
        self.paused_seconds = counter(
            worker_metrics.PAUSED_SECONDS, "Time spent paused (counted when it resumes)"
        ).labels(**labels)
        self.batch_seconds = Histogram(
            worker_metrics.BATCH_COMMIT_SECONDS,
            "Time from the start of a batch's transaction to its commit",
            LABELS,
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        ).labels(**labels)
        self.store_keys = gauge(worker_metrics.STORE_KEYS, "Ids held in the window").labels(
            **labels
        )
        self.store_bytes = gauge(worker_metrics.STORE_BYTES, "Bytes of the store on disk").labels(
            **labels
        )
        self.window_age = gauge(
            worker_metrics.WINDOW_AGE_SECONDS,
            "Age of the oldest id in the window (effective window)",
        ).labels(**labels)
        self.consumer_lag = gauge(
            worker_metrics.CONSUMER_LAG, "Input records behind the partition's end"
        ).labels(**labels)
        self.recovery_seconds = gauge(
            worker_metrics.RECOVERY_SECONDS, "Duration of the last start-up recovery"
        ).labels(**labels)
        self.recovered_ids = gauge(
            worker_metrics.RECOVERED_IDS,
            "Ids re-applied from the output topic at the last start-up",
        ).labels(**labels)
        self.expired_ids = counter(worker_metrics.EXPIRED_IDS, "Ids aged out of the window").labels(
            **labels
        )

    def dead_letter(self, reason: str, count: int = 1) -> None:
        self._dead_letters.labels(**self._labels, reason=reason).inc(count)


class Health:
    """Liveness and readiness as the loop reports them."""

    def __init__(self, stuck_after_s: float = 120.0) -> None:
        self.ready = False
        self.paused = False  # not ready because the Lease hold lapsed (see the loop)
        self.stuck_after_s = stuck_after_s
        self._beat = time.monotonic()

    def beat(self) -> None:
        self._beat = time.monotonic()

    def alive(self) -> bool:
        return time.monotonic() - self._beat < self.stuck_after_s


def serve(
    metrics: WorkerMetrics, health: Health, port: int, host: str = "0.0.0.0"
) -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz on `port` from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                self._send(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                ok = health.alive()
                self._send(200 if ok else 503, b"ok\n" if ok else b"loop stuck\n")
            elif self.path == "/readyz":
                ok = health.ready
                why = b"paused: Lease not renewed\n" if health.paused else b"recovering\n"
                self._send(200 if ok else 503, b"ready\n" if ok else why)
            else:
                self._send(404, b"not found: try /metrics, /healthz, /readyz\n")

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the structured log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
