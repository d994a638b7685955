"""Start a `dedup-worker` process for a config: the one way the demo, the tests and the
benches run workers as real processes (so a SIGKILL is a real crash)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from dedup_worker.cli import arguments
from dedup_worker.config import WorkerConfig


def start_worker(
    config: WorkerConfig, log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a worker process for `config`, its output appended to `log_path` and `env`
    laid over this process's environment."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "dedup_worker.cli", *arguments(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
