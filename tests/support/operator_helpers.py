"""Run `dedup-operator` as a real process against a test cluster, and small waits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dedup_operator import names

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def operator_command() -> list[str]:
    return [str(Path(sys.executable).parent / "dedup-operator")]


@dataclass
class OperatorProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return str(r.read().decode())

    def probe(self, path: str) -> tuple[int, str]:
        """(HTTP status, body) of GET `path` (/healthz, /readyz) on the operator;
        (0, why) when nothing answers."""
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5
            ) as r:
                return int(r.status), str(r.read().decode())
        except urllib.error.HTTPError as exc:
            return int(exc.code), str(exc.read().decode())
        except OSError as exc:  # not listening (yet)
            return 0, str(exc)

    def kill(self) -> None:
        """SIGKILL: an operator that dies at any point."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        return int(self.process.returncode)


@contextmanager
def running_operator(
    kubeconfig: Path,
    namespace: str,
    log_path: Path,
    interval: float = 1.0,
    extra: tuple[str, ...] = (),
) -> Iterator[OperatorProcess]:
    """`dedup-operator` watching `namespace`, passes every `interval` seconds."""
    port = free_port()
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [
                *operator_command(),
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                namespace,
                "--interval",
                str(interval),
                "--topic-check-interval",
                "3",
                "--metrics-port",
                str(port),
                "--metrics-address",
                "127.0.0.1",
                "--health-port",  # the same server answers /healthz and /readyz
                str(port),
                "--health-address",
                "127.0.0.1",
                "--leader-lease-duration",
                "3",
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    op = OperatorProcess(proc, log_path, port)
    try:
        yield op
    finally:
        op.stop()


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, every: float = 0.5) -> T:
    """Poll until `probe()` returns something truthy; fail with `what` on timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


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
