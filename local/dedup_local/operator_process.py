"""Run `dedup-operator` as a real process against a cluster (tests, benches): its
metrics and probes, SIGKILL or a clean stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    namespaced: bool = False  # run under unshare (`running_operator(same_host_as=...)`)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_records(self) -> list[dict[str, Any]]:
        """The operator's JSON log lines (--log-format json), others skipped."""
        records = []
        for line in self.log().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def identity(self) -> str | None:
        """Its holder identity in the leader Lease, as its start line logs it (None:
        not started yet, or no leader election)."""
        for record in self.log_records():
            if record.get("message") == "dedup-operator starting":
                identity = record.get("identity")
                return str(identity) if identity else None
        return None

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

    def operator_pid(self) -> int:
        """The operator's own PID as this host sees it: the process started, or under
        `same_host_as` the one child of `unshare` (which ignores SIGTERM itself)."""
        if not self.namespaced:
            return self.process.pid
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        try:
            children = path.read_text().split()
        except OSError:
            children = []
        return int(children[0]) if children else self.process.pid

    def stop(self) -> int:
        if self.process.poll() is None:
            os.kill(self.operator_pid(), signal.SIGTERM)
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
    same_host_as: str | None = None,
) -> Iterator[OperatorProcess]:
    """`dedup-operator` watching `namespace`, passes every `interval` seconds.

    `same_host_as`: run it with that host name (a UTS namespace of its own) as PID 1 of a
    PID namespace of its own, so that two such operators have the same host name and the
    same PID, as two containers (or two hostNetwork pods on one node) can."""
    port = free_port()
    wrapper: list[str] = []
    if same_host_as is not None:
        wrapper = [
            "unshare", "--uts", "--pid", "--fork", "--kill-child", "--",
            sys.executable, "-c",
            "import os, socket, sys; socket.sethostname(sys.argv[1]); "
            "os.execv(sys.argv[2], sys.argv[2:])",
            same_host_as,
        ]  # fmt: skip
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [
                *wrapper,
                *operator_command(),
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                namespace,
                "--interval",
                str(interval),
                "--topic-check-interval",
                "3",
                # the tests read the workers' counters from the status as they change
                "--status-counters-interval",
                "1",
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
    op = OperatorProcess(proc, log_path, port, namespaced=same_host_as is not None)
    try:
        yield op
    finally:
        op.stop()
