"""The ground of the real-cluster harness: what the control plane (`control_plane`), the
real nodes (`real_node`), their networking (`real_network`) and their volumes
(`real_csi`) share on this host. It imports none of them; they import it.

- **processes**: `spawn_logged` starts a command in its own process group with its output
  appended to a log (`may_die_with_parent`: tied to this process's life where it can
  be), as a `LoggedProcess`; `log_tail` for error messages; `process_identity` tells a
  process apart from a later one with the same pid (the owner records of nodes,
  addresses, kube-proxy and CSI controllers); `run_command` and `system_tool` for the
  host's own tools.
- **the machine lock**: `machine_lock(name)`, a lock file under `nodes_dir()` that
  every run on this machine takes (the subnet pool, the kernel tunables).
- **the subnet pool**: `SUBNETS`, one /24 of 10.200.0.0/16 per node bridge (taken from
  the bottom by `RealNode`) and per host address (from the top), chosen under the
  "subnets" lock among those no address or route of the host uses (`used_subnets`);
  `claim_host_address()`, the private address pods reach the host at: an interface of
  its own, `dedupapiN` with `10.200.N.1/32` (a bridge without ports, as this machine's
  kernel has no `dummy` driver). `ControlPlane(kubelets=True)` binds and advertises its
  API server there, and a `KafkaBroker(host=...)` listens there: pods reach it through
  their bridge gateway, the host's own processes as a local address. 127.0.0.0/8 is no
  candidate: a packet from a pod's network namespace to a loopback address is dropped
  as a martian.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .paths import MissingArtifact, cache_dir

SUBNETS = ipaddress.IPv4Network("10.200.0.0/16")  # one /24 per node: 10.200.N.0/24
ADDRESS_PREFIX = "dedupapi"  # the address interfaces' names: dedupapiN for 10.200.N.1
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class RealNodeError(RuntimeError):
    """A part of the real nodes on this host (a node's process, its bridge, the host
    address, the host's kube-proxy, a host command) failed to start or to become ready;
    the message has its log tail or the command's error."""


def nodes_dir() -> Path:
    """Where `scripts/setup-nodes.sh` caches crictl and the pause image, and where the
    nodes' directories live (`run/`), with the machine locks and the owner records."""
    return cache_dir() / "nodes"


# --------------------------------------------------------------------- processes
def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` of a log, indented, for an error message."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = text.splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in tail) if tail else f"(empty log {path})"


def _child_setup(die_with_parent: bool) -> Callable[[], None]:
    """What runs in the child before exec: its own process group and, on Linux, SIGKILL
    when the parent dies (so a killed test run leaves no control plane behind). Linux
    sends that signal when the *thread* that forked exits, so it is only asked for when
    starting from the main thread."""

    def setup() -> None:
        os.setsid()
        if die_with_parent:
            with contextlib.suppress(Exception):
                pr_set_pdeathsig = 1
                ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)

    return setup


def may_die_with_parent() -> bool:
    """Whether a child started from this thread may be tied to this process's life
    (PR_SET_PDEATHSIG follows the thread that started it: only the main thread's)."""
    return sys.platform.startswith("linux") and (
        threading.current_thread() is threading.main_thread()
    )


def spawn_logged(
    name: str,
    argv: list[str],
    log_path: Path,
    cwd: Path,
    die_with_parent: bool,
    env: Mapping[str, str] | None = None,
) -> LoggedProcess:
    """`argv` started in its own process group (`_child_setup`), its output appended to
    `log_path` after a line naming the command."""
    log_file = log_path.open("ab")
    log_file.write(f"# {' '.join(argv)}\n".encode())
    log_file.flush()
    popen = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=None if env is None else dict(env),
        preexec_fn=_child_setup(die_with_parent),
    )
    return LoggedProcess(name, popen, log_path, log_file)


@dataclass
class LoggedProcess:
    """A process `spawn_logged` started: the leader of its own process group, its output
    in `log_path`."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    def alive(self) -> bool:
        return self.popen.poll() is None

    def failure_message(self, what: str) -> str:
        """What a failure says: the process, `what`, its state and its log's tail."""
        code = self.popen.poll()
        state = "still running" if code is None else f"exit code {code}"
        return (
            f"{self.name} {what} ({state}); last lines of {self.log_path}:\n"
            f"{log_tail(self.log_path)}"
        )

    def terminate(self, grace: float) -> None:
        pid = self.popen.pid
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        # Whatever is left in the group (the leader or anything it started) gets SIGKILL.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace)
        self.log_file.close()


def process_identity(pid: int) -> str:
    """ "PID STARTTIME": a process, told apart from a later one with the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return f"{pid} gone"
    return f"{pid} {stat.rsplit(')', 1)[1].split()[19]}"


def run_command(argv: Sequence[str], timeout: float = 60, check: bool = True) -> str:
    """A host command's output; with `check`, a failure raises RealNodeError."""
    result = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise RealNodeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}")
    return result.stdout


def system_tool(name: str) -> str:
    """The path of a host tool the real nodes' networking needs (also in /usr/sbin, /sbin)."""
    found = shutil.which(name) or shutil.which(name, path=SYSTEM_PATH)
    if not found:
        raise MissingArtifact(f"{name} not found (real nodes' networking); run: make setup-nodes")
    return found


# --------------------------------------------------------------------- the machine lock
@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Held by one process on this machine at a time (every run's nodes share it)."""
    path = nodes_dir() / f".{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# --------------------------------------------------------------------- the subnet pool
def used_subnets(ip: Path) -> set[int]:
    """The third octets N of 10.200.N.0/24 that an address or route of the host touches.
    A route wider than 10.200.0.0/16 (say 10.0.0.0/8 to a gateway) is no conflict: a
    node's /24 on its bridge is more specific."""
    used: set[int] = set()
    text = run_command([str(ip), "-4", "-o", "addr", "show"]) + run_command(
        [str(ip), "-4", "route", "show", "table", "all"]
    )
    for word in text.split():
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(word, strict=False)
            if isinstance(net, ipaddress.IPv4Network) and net.subnet_of(SUBNETS):
                first = int(net.network_address.packed[2])
                last = int(net.broadcast_address.packed[2])
                used.update(range(first, last + 1))
    return used


@dataclass
class HostAddress:
    """A private address of this host on an interface of its own (see the module
    docstring); `release()` deletes the interface."""

    address: str
    interface: str

    def release(self) -> None:
        with machine_lock("subnets"):
            _delete_address(self.interface)


def _address_records() -> Path:
    return nodes_dir() / "addresses"


def _delete_address(interface: str) -> None:
    if Path(f"/sys/class/net/{interface}").exists():
        run_command([system_tool("ip"), "link", "del", interface], check=False)
    (_address_records() / interface).unlink(missing_ok=True)


def reap_stale_addresses() -> list[str]:
    """Delete the address interfaces whose claiming process died without releasing them
    (its API server and broker died with it); returns their names. Call under the
    "subnets" lock."""
    records = _address_records()
    stale = []
    for record in sorted(records.iterdir()) if records.exists() else []:
        with contextlib.suppress(OSError):
            owner = record.read_text().strip()
            if process_identity(int(owner.split()[0])) != owner:
                _delete_address(record.name)
                stale.append(record.name)
    return stale


def claim_host_address() -> HostAddress:
    """An interface `dedupapiN` (a bridge without ports: a `dummy` needs a kernel
    module this machine lacks) with `10.200.N.1/32`, on a /24 slot that no host address
    or route uses, taken from the top of the pool (nodes' bridges take theirs from the
    bottom) under the nodes' subnet lock."""
    ip = system_tool("ip")
    with machine_lock("subnets"):
        reap_stale_addresses()
        used = used_subnets(Path(ip))
        free = [
            n
            for n in range(254, 0, -1)
            if n not in used and not Path(f"/sys/class/net/{ADDRESS_PREFIX}{n}").exists()
        ]
        if not free:
            raise RealNodeError(f"no free /24 left in {SUBNETS} for a host address")
        n = free[0]
        claimed = HostAddress(f"10.200.{n}.1", f"{ADDRESS_PREFIX}{n}")
        _address_records().mkdir(parents=True, exist_ok=True)
        (_address_records() / claimed.interface).write_text(process_identity(os.getpid()) + "\n")
        try:
            run_command([ip, "link", "add", claimed.interface, "type", "bridge"])
            run_command([ip, "addr", "add", f"{claimed.address}/32", "dev", claimed.interface])
            run_command([ip, "link", "set", claimed.interface, "up"])
        except BaseException:
            _delete_address(claimed.interface)
            raise
    return claimed
