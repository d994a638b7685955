"""What counts as an unhealthy log line (dedup_local.pod_health), on lines as the worker,
kopf and the Kubernetes client print them."""

from __future__ import annotations

from dedup_local.pod_health import error_line, log_problems

WORKER_INFO = (
    '{"time": "2026-11-25 15:00:29,403", "level": "INFO", "logger": "dedup_worker.recovery", '
    '"message": "catching up", "topic": "t-403-out", "partition": 2, "from_offset": 403}'
)


def test_error_lines_by_level_and_tracebacks() -> None:
    assert error_line('{"level": "ERROR", "message": "fenced: ..."}')
    assert error_line('{"message": "x", "severity": "error"}')  # kopf
    assert error_line('{"levelname": "CRITICAL"}')
    assert error_line("Traceback (most recent call last):")
    assert error_line("2026-11-25 12:00:00 ERROR dedup_operator: boom")
    assert not error_line('{"level": "WARNING", "message": "ERROR in the text"}')
    assert not error_line(WORKER_INFO)
    assert not error_line("[1, 2]")


def test_permission_warnings_not_every_403() -> None:
    refused = (
        '{"message": "watching leases in kube-node-lease: ForbiddenException: (403)", '
        '"severity": "warn"}'
    )
    assert log_problems(refused) == [refused]
    assert log_problems('x cannot watch resource "leases" in API group') != []
    assert log_problems(WORKER_INFO) == []  # 403 in a timestamp, a topic, an offset
    assert log_problems('{"level": "INFO", "message": "ok"}\n' + WORKER_INFO) == []
