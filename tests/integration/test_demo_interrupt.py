"""Ctrl-C in the middle of `make demo` stops everything it started.

The demo runs as `make demo` runs it (`python -m dedup_local.demo`, its own process
group, as a terminal's foreground job); once its pipeline is Ready (Kafka, the control
plane, three real nodes running the worker and operator pods, their volumes), the test
sends SIGINT to its process group, as a terminal's Ctrl-C does, and then checks that
the demo exited 130 saying so, and that nothing it started is left: no process that
descended from it, no process of its nodes (containerd's shims leave the demo's tree),
no mount under its nodes' directories, the directories removed, no KUBE-* chain.

In the local-cluster group, before the session's real-node cluster starts
(tests/conftest.py): the host has one kube-proxy, which the demo's cluster takes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dedup_local.paths import REPO_ROOT
from dedup_local.patience import start_lock
from dedup_local.real_network import iptables_kube_chains

pytestmark = [
    pytest.mark.integration,
    pytest.mark.cluster_group("local-cluster"),
    pytest.mark.usefixtures("own_real_nodes"),
]


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


def node_processes(dirs: list[Path]) -> list[str]:
    """Live processes whose command line names one of the nodes' directories (kubelet,
    containerd, its shims, the CSI plugins)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if any(str(d) in cmd for d in dirs):
                found.append(f"{entry.name} {cmd.strip()}")
    return found


def mounts_under(dirs: list[Path]) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in lines if any(f" {d}/" in line or f" {d} " in line for d in dirs)]


def test_ctrl_c_mid_run_leaves_nothing_running(tmp_path: Path) -> None:
    log_path = tmp_path / "demo.log"
    chains_before = iptables_kube_chains()
    # The demo's start is a session part's in all but name: it holds the machine-wide
    # start lock (dedup_local.patience) from its launch until its cluster is up.
    starting = contextlib.ExitStack()
    starting.enter_context(start_lock("the demo's cluster"))
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
    node_dirs: list[Path] = []
    stop = threading.Event()

    def watch() -> None:  # everything it starts, while it runs
        while not stop.is_set():
            seen.update(descendants(demo.pid))
            stop.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        deadline = time.monotonic() + 1500  # an image build after a change comes first
        while "pipeline Ready" not in (log := log_path.read_text(errors="replace")):
            assert demo.poll() is None, what_failed(log)
            assert time.monotonic() < deadline, what_failed(log)
            if "local cluster up on real nodes" in log:
                starting.close()  # its nodes and broker are up: the next start may begin
            time.sleep(1)
        starting.close()
        log = log_path.read_text(errors="replace")
        m = re.search(r"node directories: ([^)]+)\)", log)
        assert m, log[-3000:]
        node_dirs = [Path(d) for d in m.group(1).split()]
        running = node_processes(node_dirs)
        assert any("containerd-shim" in p for p in running), "pods run in containerd"
        assert all(d.is_dir() for d in node_dirs)

        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C
        rc = demo.wait(timeout=300)
    finally:
        starting.close()
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
    assert node_processes(node_dirs) == []
    assert mounts_under(node_dirs) == []
    assert not any(d.exists() for d in node_dirs), node_dirs
    # kube-proxy's rules gone: nothing new (another run's kube-proxy, waited for by the
    # demo's, may have taken its own chains away meanwhile: CI runs side by side)
    assert set(iptables_kube_chains()) <= set(chains_before)
