"""Run `dedup-operator` as a real process against a test cluster (dedup_local.operator_process),
`dedupctl` as a person runs it, and small waits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dedup_contract import names
from dedup_local.operator_process import OperatorProcess as OperatorProcess
from dedup_local.operator_process import free_port as free_port
from dedup_local.operator_process import operator_command as operator_command
from dedup_local.operator_process import running_operator as running_operator
from dedup_local.patience import PatientDeadline, patient_timeout

T = TypeVar("T")

DEDUPCTL = str(Path(sys.executable).parent / "dedupctl")


def dedupctl(
    *args: str, kubeconfig: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The installed `dedupctl` in a subprocess, without the caller's KUBECONFIG."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    cmd = [DEDUPCTL, *args] + ([] if kubeconfig is None else ["--kubeconfig", str(kubeconfig)])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, every: float = 0.5) -> T:
    """Poll until `probe()` returns something truthy; fail with `what` on timeout.

    `timeout` is the wait on an idle machine; a busy one waits longer, up to 4x
    (dedup_local.patience), so that a slow machine is not a failed test."""
    patience = PatientDeadline(timeout)
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if patience.expired():
            break
        time.sleep(every)
    raise AssertionError(
        f"timed out after {patience.describe()} waiting for {what} (last: {last!r})"
    )


class Kubectl(Protocol):
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]: ...


def rollout_status(cluster: Kubectl, namespace: str, what: str, timeout: float) -> None:
    """`kubectl rollout status WHAT` until it is rolled out, `timeout` stretched by the
    machine's load as `wait_for`'s is."""
    wait = patient_timeout(timeout)
    cluster.kubectl(
        "rollout", "status", what, "-n", namespace, f"--timeout={wait:.0f}s", timeout=wait + 30
    )


def drop_finalizers(api: ApiClient, ns: str, name: str) -> None:
    """No operator is left to release the pipeline's finalizers: drop them, so that the
    namespace (and the workers) go with the test. A pipeline already gone is fine."""
    try:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            names.GROUP, names.VERSION, ns, names.PLURAL, name, {"metadata": {"finalizers": None}}
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def delete_every_pipeline(api: ApiClient) -> None:
    """Every DedupPipeline of the cluster gone, finalizers dropped first (no operator may
    be running to release them): an earlier test's pipeline, whose broker closed with that
    test, would make the next operator log KafkaUnreachable about it."""
    custom = client.CustomObjectsApi(api)
    found = custom.list_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL)
    for item in found.get("items") or []:
        ns, name = item["metadata"]["namespace"], item["metadata"]["name"]
        drop_finalizers(api, ns, name)
        try:
            custom.delete_namespaced_custom_object(
                names.GROUP, names.VERSION, ns, names.PLURAL, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(
        lambda: (
            not custom.list_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL)["items"]
        ),
        60,
        "no DedupPipeline left",
    )


def get_pipeline(api: ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found = client.CustomObjectsApi(api).get_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, names.PLURAL, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    assert isinstance(found, dict)
    return found


def condition(pipeline: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((pipeline or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def events(api: ApiClient, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events about pipeline `name`."""
    found = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return [(e.type or "", e.reason or "", e.message or "") for e in found.items]


def reasons_once_posted(
    api: ApiClient, namespace: str, name: str, *wanted: str, timeout: float = 30
) -> list[str]:
    """The reasons of the Events about pipeline `name`, once each of `wanted` is among
    them. The operator posts its Events from a queue, after the status write that records
    what they tell (event_poster.py): a test that saw the status waits for its Events
    rather than reading them at once (a loaded API server takes a while to post them)."""
    return wait_for(
        lambda: (
            reasons
            if set(wanted) <= set(reasons := [r for _, r, _ in events(api, namespace, name)])
            else None
        ),
        timeout,
        f"the Events {', '.join(wanted)} about {name}",
    )


def wait_for_event(
    api: ApiClient, namespace: str, name: str, kind: str, reason: str, timeout: float = 15
) -> list[str]:
    """The messages of the `kind` (Normal/Warning) `reason` Events about pipeline `name`,
    once there is one."""
    return wait_for(
        lambda: [m for t, r, m in events(api, namespace, name) if (t, r) == (kind, reason)],
        timeout,
        f"the {kind} {reason} Event",
    )
