"""Run `dedup-operator` as a real process against a cluster (tests, benches): its
metrics and probes, SIGKILL or a clean stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


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
