"""Ctrl-C in the middle of `make demo` stops everything it started.

The demo runs as `make demo` runs it (`python -m dedup_local.demo`, its own process
group, as a terminal's foreground job); once its pipeline is Ready (Kafka, the control
plane, three nodes, worker and operator pods in containers, their volumes), the test
sends SIGINT to its process group, as a terminal's Ctrl-C does, and then checks that
the demo exited 130 saying so, and that nothing it started is left: no process that
descended from it, no container of its cluster, no mount of its directories or
containers, its directories removed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dedup_local.cluster.runtime import CONTAINER_LABEL
from dedup_local.image import podman
from dedup_local.paths import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(root: int) -> dict[int, tuple[str | None, str]]:
    """Every live process below `root`: pid -> (start time, command line)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found: dict[int, tuple[str | None, str]] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found[pid] = (_start_time(pid), cmd.strip())
        todo.extend(children.get(pid, []))
    return found


def what_failed(log: str) -> str:
    """The demo's own diagnosis when it printed one (its conditions, pods and events),
    else the log's tail."""
    _, found, diagnosis = log.rpartition("[demo] diagnosis:")
    return (found + diagnosis)[:6000] if found else log[-4000:]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def containers(cluster_id: str) -> list[str]:
    listed = podman(
        "ps", "--all", "--quiet", "--no-trunc", "--filter", f"label={CONTAINER_LABEL}={cluster_id}",
        check=False,
    )  # fmt: skip
    return listed.stdout.split()


def test_ctrl_c_mid_run_leaves_nothing_running(tmp_path: Path) -> None:
    log_path = tmp_path / "demo.log"
    demo = subprocess.Popen(
        [sys.executable, "-m", "dedup_local.demo", "--png", str(tmp_path / "demo.png")],
        cwd=REPO_ROOT,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        # a terminal's job takes SIGINT; pytest started in the background may ignore it,
        # and an ignored signal stays ignored across exec
        preexec_fn=_default_sigint,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    seen: dict[int, tuple[str | None, str]] = {}
    running: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # everything it starts, while it runs
        while not stop.is_set():
            seen.update(descendants(demo.pid))
            stop.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        deadline = time.monotonic() + 1500  # an image build after a change comes first
        while "pipeline Ready" not in log_path.read_text(errors="replace"):
            assert demo.poll() is None, what_failed(log_path.read_text(errors="replace"))
            assert time.monotonic() < deadline, what_failed(log_path.read_text(errors="replace"))
            time.sleep(1)
        log = log_path.read_text(errors="replace")
        m = re.search(r"cluster data in ([^\s)]+)", log)
        assert m, log[-3000:]
        data_dir = Path(m.group(1))
        cluster_id = "dl-" + data_dir.name.removeprefix("run-")
        running = containers(cluster_id)
        assert running, "worker and operator pods run in containers"
        assert data_dir.is_dir()

        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C
        rc = demo.wait(timeout=300)
    finally:
        stop.set()
        watcher.join(timeout=10)
        if demo.poll() is None:  # a failed check: still let the demo clean up after itself
            os.killpg(demo.pid, signal.SIGINT)
            try:
                demo.wait(timeout=300)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait(timeout=30)
    log = log_path.read_text(errors="replace")
    assert rc == 130, log[-3000:]
    assert "interrupted: everything it started is stopped" in log
    assert "Traceback" not in log.split("pipeline Ready", 1)[1], log[-3000:]

    def left() -> list[str]:
        return [
            f"{pid} {cmd}"
            for pid, (started, cmd) in seen.items()
            if started is not None and _start_time(pid) == started
        ]

    deadline = time.monotonic() + 30  # a process the demo signalled may take a moment
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(seen) > 5, seen  # it did start things: the control plane, Kafka, agents
    assert left() == [], left()
    assert containers(cluster_id) == []
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(data_dir) not in mounts
    for cid in running:
        assert cid not in mounts, cid
    assert not data_dir.exists()
