"""Is what we installed healthy, not only its result? For the pods of one selector on the
local cluster: no container restarted, and no log line at ERROR (or a traceback) and no
permission warning in their logs. Used after the chart end-to-end test, the demo and
the tests that cause no fault (each names what it checks).

A line is ERROR when it is a JSON object whose level says so (the worker's
`"level": "ERROR"`, kopf's `"severity": "error"`, CRITICAL alike), or a plain line
with ` ERROR ` or a Python traceback. A permission warning is a line with the API
server's refusal as clients print it (Forbidden, (403), code 403, cannot <verb> resource).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Protocol

from kubernetes import client

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


class Cluster(Protocol):
    """What is read of a cluster: `LocalCluster` and `RealCluster` both are one."""

    def api_client(self) -> ApiClient: ...

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str: ...


ERROR_LEVELS = {"ERROR", "CRITICAL"}
# the API server's refusals as the clients print them: "Forbidden", "(403)", "code":403,
# "cannot watch resource ..." (not any 403 in a line: topic names hold random digits)
PERMISSION = re.compile(
    r"[Ff]orbidden|\(403\)|\"code\\?\"?: ?403|cannot (watch|list|get|create|update|patch|delete) resource"
)


def error_line(line: str) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return " ERROR " in line or line.startswith("Traceback")
    if not isinstance(record, dict):
        return False
    level = record.get("level") or record.get("severity") or record.get("levelname") or ""
    return str(level).upper() in ERROR_LEVELS


def log_problems(text: str) -> list[str]:
    """The ERROR lines and permission warnings of one log."""
    return [line for line in text.splitlines() if error_line(line) or PERMISSION.search(line)]


def unhealthy(cluster: Cluster, namespace: str, selector: str) -> list[str]:
    """What is wrong with the pods of `selector` in `namespace`: each restarted
    container, each ERROR line and permission warning of their logs (prefixed with the
    pod's name). Empty: healthy. Pods being deleted count too (their logs stay)."""
    api = cluster.api_client()
    try:
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector)
    finally:
        api.close()  # type: ignore[no-untyped-call]
    problems = []
    for pod in pods.items:
        assert pod.metadata is not None and pod.metadata.name is not None
        name = pod.metadata.name
        statuses = (pod.status.container_statuses if pod.status else None) or []
        for status in statuses:
            if status.restart_count:
                problems.append(
                    f"{name}: container {status.name} restarted {status.restart_count}x"
                )
        problems += [
            f"{name}: {line[:400]}" for line in log_problems(cluster.pod_log(namespace, name))
        ]
    return problems
