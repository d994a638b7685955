"""A real Kubernetes node on this host: kubelet + its own containerd (runc) + a bridge CNI
network, joined to a `ControlPlane(kubelets=True)` (docs/development.md, "Real nodes":
what runs where, and what the kubelet changes on the host).

- **containerd** (Debian's 1.6): its own root, state, socket and config; runc with the
  cgroupfs driver (hybrid cgroup v1: not crun); the pause image compiled by
  `scripts/setup-nodes.sh` pinned as the sandbox image (no registry is reachable).
- **a bridge** `dedupbrN`, `10.200.N.1/24`: the node's InternalIP and its kubelet's
  serving address; `N` chosen under a machine-wide lock among subnets the host does not
  use. Pods get `host-local` addresses of it; no masquerading.
- **kubelet**: its own root directory, a client certificate CN=system:node:NAME
  (O=system:nodes; the Node authorizer and NodeRestriction judge it), a serving
  certificate for its IP, and `KUBELET_CONFIG`.

Faults: `kill()` (kubelet, containerd, every shim and container of the node: SIGKILL at
once), `restart()`, `partition()`/`heal()` (SIGSTOP/SIGCONT of the kubelet: containers
keep running).

    with ControlPlane(kubelets=True) as cp, RealNode(cp) as node:
        node.import_image(project_image_archive())
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from .control_plane import ControlPlane, kube_binaries
from .host import (
    SUBNETS,
    LoggedProcess,
    RealNodeError,
    log_tail,
    machine_lock,
    may_die_with_parent,
    nodes_dir,
    process_identity,
    run_command,
    spawn_logged,
    used_subnets,
)
from .lifecycle import Started
from .node_images import NodeImage, containerd_config, plant, seed
from .paths import MissingArtifact, free_port
from .patience import PatientDeadline

SETUP_HINT = "run: make setup-kube setup-nodes"
UNIX_SOCKET_MAX = 107  # bytes of a unix socket's path (sun_path, less its terminating NUL)
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
)

# The KubeletConfiguration of a node on this machine (issue 28): no systemd (cgroupfs),
# cgroup v1 hybrid (no QoS cgroups, no node allocatable, cgroup v1 allowed), no local
# storage isolation, no image GC or eviction (a test machine's disk is what it is), no
# iptables chains of its own, its own OOM score untouched.
KUBELET_CONFIG: dict[str, Any] = {
    "cgroupDriver": "cgroupfs",
    "cgroupsPerQOS": False,
    "enforceNodeAllocatable": [],
    "failSwapOn": False,
    "failCgroupV1": False,
    "localStorageCapacityIsolation": False,
    "imageGCHighThresholdPercent": 100,
    "imageGCLowThresholdPercent": 99,
    "evictionHard": {
        "memory.available": "0%",
        "nodefs.available": "0%",
        "nodefs.inodesFree": "0%",
        "imagefs.available": "0%",
        "imagefs.inodesFree": "0%",
    },
    "makeIPTablesUtilChains": False,
    "oomScoreAdj": 0,
    "readOnlyPort": 0,
    "healthzBindAddress": "127.0.0.1",
    "clusterDomain": "cluster.local",
    "serializeImagePulls": False,
    "shutdownGracePeriod": "0s",
}


class NodePlugin(Protocol):
    """A host process of a node beside its kubelet, such as a CSI driver's node plugin
    (`dedup_local.real_csi`): see `RealNode.add_plugin`."""

    def start(self) -> None: ...

    def kill(self) -> None: ...

    def stop(self) -> None: ...


def pause_image() -> tuple[str, Path]:
    """The pause image's reference and its docker-archive tarball (scripts/setup-nodes.sh)."""
    record = nodes_dir() / "pause"
    lines = record.read_text().split() if record.exists() else []
    if len(lines) != 2 or not Path(lines[1]).is_file():
        raise MissingArtifact(f"the pause image is not built; {SETUP_HINT}")
    return lines[0], Path(lines[1])


def _require_tools() -> dict[str, Path]:
    kube = kube_binaries()
    kube.require("kubelet")
    tools = {"kubelet": kube.path("kubelet"), "crictl": nodes_dir() / "bin" / "crictl"}
    for name in ("containerd", "ctr", "runc", "containerd-shim-runc-v2", "ip"):
        found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
        if found:
            tools[name] = Path(found)
    missing = [n for n in ("crictl", "containerd", "ctr", "runc", "containerd-shim-runc-v2", "ip")
               if n not in tools or not os.access(tools[n], os.X_OK)]  # fmt: skip
    if not (CNI_BIN_DIR / "bridge").exists():
        missing.append(f"{CNI_BIN_DIR}/bridge")
    if missing:
        raise MissingArtifact(f"missing for real nodes: {', '.join(missing)}; {SETUP_HINT}")
    return tools


def project_image_archive(ref: str | None = None) -> Path:
    """The project's image (`dedup_local.image`, built by `make setup-image`) as a
    docker-archive tarball for `RealNode.import_image`: `image_archive` in `images/`."""
    from .image import built_ref

    return image_archive(ref or built_ref(), nodes_dir() / "images")


def image_archive(ref: str, directory: Path) -> Path:
    """`ref` as a docker-archive tarball in `directory`, exported with `podman save` from
    the project's podman store once per image: the file is named by the image's
    content-addressed tag, and older ones in `directory` are removed (so each kind of
    image, this commit's or the previous release's, has a directory of its own)."""
    from .image import podman, podman_env

    directory.mkdir(parents=True, exist_ok=True)
    tarball = directory / (ref.rsplit("/", 1)[-1].replace(":", "_") + ".tar")
    podman_env()
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tarball.exists():
            partial = tarball.with_suffix(".tmp")
            partial.unlink(missing_ok=True)
            podman("save", "--format", "docker-archive", "-o", str(partial), ref, timeout=600)
            partial.rename(tarball)
            for old in directory.glob("*.tar"):
                if old != tarball:
                    old.unlink(missing_ok=True)
    return tarball


# --------------------------------------------------------------------- host helpers
def _processes() -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, argv) of every process on the host."""
    found: dict[int, tuple[int, list[str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        found[int(entry)] = (ppid, [a.decode(errors="replace") for a in argv if a])
    return found


def _descendants(roots: set[int], table: Mapping[int, tuple[int, list[str]]]) -> set[int]:
    out = set(roots)
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _) in table.items():
            if ppid in out and pid not in out:
                out.add(pid)
                grew = True
    return out


def _shim_socket(argv: Sequence[str]) -> Path | None:
    """The socket a containerd 1.6 shim listens on, from its command line (-namespace,
    -id, -address): /run/containerd/s/sha256(address/namespace/id)."""
    args = dict(zip(argv[1::2], argv[2::2], strict=False))
    if not {"-namespace", "-id", "-address"} <= args.keys():
        return None
    key = os.path.join(args["-address"], args["-namespace"], args["-id"])
    return Path("/run/containerd/s") / hashlib.sha256(key.encode()).hexdigest()


def _shim_pids(socket: Path, table: Mapping[int, tuple[int, list[str]]]) -> set[int]:
    """The containerd shims of the containerd at `socket`: their command line names it."""
    return {
        pid
        for pid, (_, argv) in table.items()
        if argv and argv[0].endswith("containerd-shim-runc-v2") and str(socket) in argv
    }


def _live_node_dirs() -> list[Path]:
    """The node directories whose owning process still runs."""
    run = nodes_dir() / "run"
    live = []
    for directory in sorted(run.iterdir()) if run.exists() else []:
        try:
            owner = (directory / "owner").read_text().strip()
        except OSError:
            owner = ""
        if not owner or process_identity(int(owner.split()[0])) == owner:
            live.append(directory)  # no owner yet: being made
    return live


def _clean_up(directory: Path) -> None:
    """What a node leaves on the host once its kubelet and containerd are gone: its shims
    and the containers under them, the kubelet's links in /var/log/containers, mounts
    under its directory (rootfs overlays, shm, network namespaces), its bridge."""
    table = _processes()
    shims = _shim_pids(directory / "containerd" / "containerd.sock", table)
    for pid in _descendants(shims, table):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for pid in shims:
        socket = _shim_socket(table[pid][1])
        if socket is not None:
            socket.unlink(missing_ok=True)
    logs = str(directory / "pod-logs") + "/"
    with contextlib.suppress(OSError):
        for link in Path("/var/log/containers").iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(logs):
                    link.unlink()
    root = str(directory) + "/"
    for _ in range(3):
        mounts = {
            line.split()[4].replace("\\040", " ")
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
        }
        mine = sorted((m for m in mounts if m.startswith(root)), key=len, reverse=True)
        if not mine:
            break
        for point in mine:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    with contextlib.suppress(OSError):
        bridge = (directory / "bridge").read_text().strip()
        if bridge.startswith("dedupbr") and Path(f"/sys/class/net/{bridge}").exists():
            ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin") or "ip"
            run_command([ip, "link", "del", bridge], check=False)


def reap_stale_nodes() -> list[str]:
    """Clean up after nodes whose owning process died without stopping them (a killed
    test run: the kubelet and containerd die with it, their shims, containers, mounts and
    bridge stay); returns their names."""
    run = nodes_dir() / "run"
    live = set(_live_node_dirs())
    stale = [d for d in sorted(run.iterdir()) if d not in live] if run.exists() else []
    for directory in stale:
        _clean_up(directory)
        shutil.rmtree(directory, ignore_errors=True)
    if stale:
        restore_kernel_tunables()  # the dead run's nodes may have been the last ones
    return [d.name for d in stale]


def _kernel_tunables() -> dict[str, str]:
    return {t: Path("/proc/sys", t).read_text().strip() for t in KERNEL_TUNABLES}


def restore_kernel_tunables(stopping: Path | None = None) -> None:
    """Put back the kernel tunables the machine had before the first node's kubelet set
    them, once no node runs on it but the one `stopping` (its directory)."""
    with machine_lock("tunables"):
        saved = nodes_dir() / "kernel-tunables.json"
        if not saved.exists():
            return
        if any(d != stopping for d in _live_node_dirs()):
            return  # another node on the machine still runs
        for tunable, value in json.loads(saved.read_text()).items():
            with contextlib.suppress(OSError):
                Path("/proc/sys", tunable).write_text(value + "\n")
        saved.unlink()


# --------------------------------------------------------------------- the node
class RealNode(Started):
    """One real node: kubelet + containerd + a bridge network (see the module docstring).

    Args:
        control_plane: a started `ControlPlane(kubelets=True)`.
        name: the Node's name (and host name override); unique by default.
        labels: node labels the kubelet registers with (NodeRestriction allows those
            outside the kubernetes.io/k8s.io namespaces, and a few inside).
        kubelet_config: KubeletConfiguration fields over `KUBELET_CONFIG`, e.g.
            {"nodeLeaseDurationSeconds": 4} for a fast NotReady.
        start_timeout: seconds containerd, the kubelet and the Node's Ready may take.
        images: images the node's containerd has when it starts, beside the pause image
            (`dedup_local.node_images`: imported once on the machine, then hard-linked).
        keep_data: keep the node's directory after `stop()` (also DEDUP_KUBE_KEEP_DATA=1).
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        name: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        kubelet_config: Mapping[str, Any] | None = None,
        start_timeout: float = 90.0,
        images: Sequence[NodeImage] = (),
        keep_data: bool | None = None,
    ) -> None:
        self.control_plane = control_plane
        self.name = name or f"dedup-node-{uuid.uuid4().hex[:6]}"
        self.labels = dict(labels or {})
        self.kubelet_config = {**KUBELET_CONFIG, **(kubelet_config or {})}
        self.start_timeout = start_timeout
        self.preloaded = tuple(images)
        if keep_data is None:
            keep_data = os.environ.get("DEDUP_KUBE_KEEP_DATA", "") not in ("", "0")
        self.keep_data = keep_data
        self._tools: dict[str, Path] = {}
        self._dir: Path | None = None
        self._subnet = 0
        self._kubelet_port = 0
        self._healthz_port = 0
        self._containerd: LoggedProcess | None = None
        self._kubelet: LoggedProcess | None = None
        self._plugins: list[NodePlugin] = []
        self._partitioned = False
        self._atexit_registered = False
        self._die_with_parent = False
        self.ready_seconds = 0.0

    # ------------------------------------------------------------------ properties
    @property
    def data_dir(self) -> Path:
        if self._dir is None:
            raise RuntimeError(f"node {self.name} not started")
        return self._dir

    @property
    def network(self) -> ipaddress.IPv4Network:
        if not self._subnet:
            raise RuntimeError(f"node {self.name} not started")
        return ipaddress.IPv4Network(f"10.200.{self._subnet}.0/24")

    @property
    def node_ip(self) -> str:
        """The node's InternalIP: its bridge's (the pods' gateway) address."""
        return str(self.network.network_address + 1)

    @property
    def bridge(self) -> str:
        if not self._subnet:
            raise RuntimeError(f"node {self.name} not started")
        return f"dedupbr{self._subnet}"

    @property
    def bridge_mac(self) -> str:
        """The bridge's fixed MAC address (`_make_bridge`): locally administered and
        unicast (02:...), "dedup" in its bytes, then the subnet's number."""
        if not self._subnet:
            raise RuntimeError(f"node {self.name} not started")
        return f"02:64:65:64:75:{self._subnet:02x}"

    @property
    def kubelet_port(self) -> int:
        return self._kubelet_port

    @property
    def containerd_socket(self) -> Path:
        return self.data_dir / "containerd" / "containerd.sock"

    @property
    def running(self) -> bool:
        return all(p is not None and p.alive() for p in (self._containerd, self._kubelet))

    def log_path(self, component: str) -> Path:
        """The log of "kubelet" or "containerd"."""
        return self.data_dir / "logs" / f"{component}.log"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RealNode:
        """Make the node's directory, bridge, credentials and configuration, start
        containerd (with the pause image and `images`) and the kubelet; returns once the Node
        is Ready."""
        if self._dir is not None:
            return self
        if not self.control_plane.kubelets:
            raise RealNodeError("the control plane must be made with ControlPlane(kubelets=True)")
        self._tools = _require_tools()
        reap_stale_nodes()
        t0 = time.monotonic()
        self._die_with_parent = may_die_with_parent()
        run = nodes_dir() / "run"
        run.mkdir(parents=True, exist_ok=True)
        # Short and unique: clusters of concurrent runs may name their nodes alike (each
        # has its own control plane), as `RealCluster`'s node-a.. do; and the sockets
        # under it (the kubelet's plugin registration) must fit a unix socket's 107
        # bytes, which a directory named after the node overran (the node's name is in
        # its `name` file).
        self._dir = run / uuid.uuid4().hex[:8]
        if self._dir.exists():
            raise RealNodeError(f"{self._dir} exists: is a node named {self.name} running?")
        self._dir.mkdir()
        (self._dir / "owner").write_text(process_identity(os.getpid()) + "\n")
        (self._dir / "name").write_text(self.name + "\n")
        (self._dir / "logs").mkdir()
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._make_bridge()
            self._write_credentials()
            self._write_configs()
            # the pause image and `images`, as the node's disk came with them
            seeded = seed([NodeImage(pause_image()[1]), *self.preloaded], self._tools)
            plant(seeded, self.data_dir / "containerd" / "root")
            self._start_containerd()
            self._save_kernel_tunables()
            self._start_kubelet()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Remove the node's pods through the CRI (so CNI releases their networks; after
        a kill containerd is started again for it), stop containerd, end what is left of
        the node's processes, unmount, delete the bridge and the directory. Leaves the
        Node object in the API (as a real node's shutdown does)."""
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        if self._dir is None:
            return
        for plugin in self._plugins:
            with contextlib.suppress(Exception):
                plugin.stop()
        with contextlib.suppress(Exception):
            if self._kubelet is not None:
                if self._partitioned:
                    self.heal()
                self._kubelet.terminate(grace=10.0)
                self._kubelet = None
            containerd_down = self._containerd is None or not self._containerd.alive()
            if containerd_down and (self._dir / "containerd.toml").exists():
                self._start_containerd()  # after a kill: for the CRI's clean-up
            self._crictl("rmp", "--all", "--force", timeout=120, check=False)
        if self._containerd is not None:
            self._containerd.terminate(grace=10.0)
            self._containerd = None
        _clean_up(self._dir)
        self._subnet = 0
        self._restore_kernel_tunables()
        if not self.keep_data:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None

    # ------------------------------------------------------------------ faults
    def process_ids(self) -> set[int]:
        """The node's live processes: its kubelet, its containerd, its containerd shims
        and every process under them (the containers)."""
        table = _processes()
        roots = {
            proc.popen.pid
            for proc in (self._kubelet, self._containerd)
            if proc is not None and proc.alive()
        }
        return _descendants(roots | self._shim_pids(table), table)

    def kill(self) -> None:
        """The node dies at once: SIGKILL to the kubelet, its containerd, every
        containerd shim of this node and every process under them (the containers)."""
        self._partitioned = False  # a stopped process dies of SIGKILL as well
        table = _processes()
        sockets = [_shim_socket(table[pid][1]) for pid in self._shim_pids(table)]
        for pid in self.process_ids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for proc in (self._kubelet, self._containerd):
            if proc is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=10)
                proc.log_file.close()
        self._kubelet = self._containerd = None
        for plugin in self._plugins:
            plugin.kill()
        for socket in sockets:  # a dead shim's socket stays behind in /run/containerd/s
            if socket is not None:
                socket.unlink(missing_ok=True)

    def restart(self) -> None:
        """The node comes back (after `kill()`, or killed first if it runs): containerd
        and the kubelet start again on the same directory, bridge, name and ports; the
        kubelet runs its pods' containers again. Returns once the Node is Ready."""
        if self._dir is None:
            raise RuntimeError(f"node {self.name} not started")
        if self._kubelet is not None or self._containerd is not None:
            self.kill()
        self._start_containerd()
        for plugin in self._plugins:
            plugin.start()
        self._start_kubelet()
        self.wait_ready()

    def add_plugin(self, plugin: NodePlugin) -> None:
        """Run `plugin` as part of this node from now on: started here, killed with the
        node by `kill()`, started again by `restart()`, stopped by `stop()` first."""
        plugin.start()
        self._plugins.append(plugin)

    def partition(self) -> None:
        """The kubelet no longer reaches the API server, while containerd, the shims and
        the containers keep running: SIGSTOP to the kubelet. Chosen over a packet filter
        because every node's kubelet and the API server share the host's addresses (no
        source address tells one node's traffic from another's without a per-node API
        server address), because it touches no host firewall that other users of this
        machine depend on, and because it holds exactly (nothing is let through, a
        stopped process cannot retry). Unlike a network cut, the kubelet also stops its
        local work (probes, restarts) until `heal()`."""
        if self._kubelet is None or not self._kubelet.alive():
            raise RealNodeError(f"node {self.name}: no kubelet to partition")
        os.killpg(self._kubelet.popen.pid, signal.SIGSTOP)
        self._partitioned = True

    def heal(self) -> None:
        """Ends `partition()`: SIGCONT to the kubelet."""
        if self._kubelet is not None and self._partitioned:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._kubelet.popen.pid, signal.SIGCONT)
        self._partitioned = False

    # ------------------------------------------------------------------ images
    def import_image(self, tarball: Path, *tags: str) -> None:
        """Import a docker-archive or OCI tarball into this node's containerd (namespace
        k8s.io, where the CRI finds it), under the names it carries and any `tags`."""
        self._import(tarball, *tags)

    def images(self) -> list[str]:
        """The image references the node's CRI lists."""
        out = self._crictl("images", "-o", "json")
        return sorted(
            tag
            for image in json.loads(out).get("images", [])
            for tag in image.get("repoTags") or []
        )

    def crictl(self, *args: str, timeout: float = 60) -> str:
        """Run crictl against this node's containerd; returns its output."""
        return self._crictl(*args, timeout=timeout)

    # ------------------------------------------------------------------ readiness
    def wait_ready(self, timeout: float | None = None) -> None:
        """Until the Node's Ready condition is True (a process dying ends it early)."""
        self._wait_condition("True", timeout)

    def wait_not_ready(self, timeout: float = 120.0) -> float:
        """Until the Node's Ready condition is not True (False or Unknown); returns the
        seconds it took."""
        t0 = time.monotonic()
        self._wait_condition("not True", timeout)
        return time.monotonic() - t0

    def ready_status(self) -> str | None:
        """The Node's Ready condition status ("True", "False", "Unknown"), None if the
        Node is not registered."""
        result = self.control_plane.kubectl(
            "get", "node", self.name, "-o", "json", check=False, timeout=30
        )
        if result.returncode != 0:
            return None
        conditions = json.loads(result.stdout).get("status", {}).get("conditions") or []
        return next((str(c["status"]) for c in conditions if c.get("type") == "Ready"), None)

    def _wait_condition(self, want: str, timeout: float | None) -> None:
        # a busy machine waits longer (dedup_local.patience)
        patience = PatientDeadline(self.start_timeout if timeout is None else timeout)
        status: str | None = None
        while True:
            if want == "True":
                for proc in (self._containerd, self._kubelet):
                    if proc is not None and not proc.alive():
                        raise self._failure(proc, "exited before the node became Ready")
            status = self.ready_status()
            if (status == "True") == (want == "True"):
                return
            if patience.expired():
                proc = self._kubelet or self._containerd
                detail = self._failure(proc, "") if proc is not None else ""
                raise RealNodeError(
                    f"node {self.name}: Ready is {status}, wanted {want} after "
                    f"{patience.describe()}\n{detail}"
                )
            time.sleep(0.2)

    # ------------------------------------------------------------------ set-up
    def _make_bridge(self) -> None:
        """The node's bridge with its gateway address, on a subnet nothing else uses (a
        machine-wide lock keeps concurrent nodes apart: the address is the claim).

        Its MAC address is set, not left to the kernel: a bridge whose address was never
        set takes the lowest MAC of its ports, so it changes whenever a pod's veth comes
        or goes, and every other pod of the node keeps sending to the gateway's old MAC
        (its ARP entry) into nothing until that entry expires. Pods lost the broker for a
        minute or more whenever another pod of their node started or stopped (CI,
        2026-11-26: requests timed out in flight, connections not set up in 30 s).
        Docker fixes docker0's address the same way; the CNI bridge plugin does for the
        bridges it makes itself."""
        ip = str(self._tools["ip"])
        with machine_lock("subnets"):
            used = used_subnets(self._tools["ip"])
            free = [
                n
                for n in range(1, 255)
                if n not in used and not Path(f"/sys/class/net/dedupbr{n}").exists()
            ]
            if not free:
                raise RealNodeError(f"no free /24 left in {SUBNETS} for a node bridge")
            self._subnet = free[0]
            run_command([ip, "link", "add", "name", self.bridge, "type", "bridge"])
            run_command([ip, "link", "set", self.bridge, "address", self.bridge_mac])
            run_command([ip, "addr", "add", f"{self.node_ip}/24", "dev", self.bridge])
            run_command([ip, "link", "set", self.bridge, "up"])
        (self.data_dir / "bridge").write_text(self.bridge + "\n")

    def _write_credentials(self) -> None:
        pki = self.data_dir / "pki"
        cp = self.control_plane
        client_key, client_crt = cp.issue_certificate(
            pki / "kubelet-client",
            common_name=f"system:node:{self.name}",
            organizations=["system:nodes"],
        )
        cp.issue_certificate(
            pki / "kubelet-serving",
            common_name=f"system:node:{self.name}",
            organizations=["system:nodes"],
            client=False,
            server_names=[f"IP:{self.node_ip}", f"DNS:{self.name}"],
        )
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "dedup-local",
                    "cluster": {"server": cp.server, "certificate-authority": str(cp.ca_path)},
                }
            ],
            "users": [
                {
                    "name": self.name,
                    "user": {"client-certificate": str(client_crt), "client-key": str(client_key)},
                }
            ],
            "contexts": [
                {"name": "dedup-local", "context": {"cluster": "dedup-local", "user": self.name}}
            ],
            "current-context": "dedup-local",
        }
        path = self.data_dir / "kubelet.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
        path.chmod(0o600)

    def _write_configs(self) -> None:
        d = self.data_dir
        pause_ref = pause_image()[0]
        cni_conf = d / "cni" / "net.d"
        cni_conf.mkdir(parents=True)
        (d / "cni" / "ipam").mkdir()
        conflist = {
            "cniVersion": "1.0.0",
            "name": f"dedup-{self.name}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(self.network), "gateway": self.node_ip}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(d / "cni" / "ipam"),
                    },
                }
            ],
        }
        (cni_conf / "10-bridge.conflist").write_text(json.dumps(conflist, indent=2) + "\n")
        ctd = d / "containerd"
        ctd.mkdir()
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        base = containerd_config(
            f"containerd of node {self.name} (dedup_local.real_node): its own root, state, socket.",
            root=ctd / "root",
            state=ctd / "state",
            socket=self.containerd_socket,
            cri=True,
        )
        (d / "containerd.toml").write_text(
            base
            + f"""\
[plugins."io.containerd.internal.v1.opt"]
  path = "{ctd / "opt"}"
[{cri}]
  sandbox_image = "{pause_ref}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{self._tools["runc"]}"
[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf}"
  max_conf_num = 1
"""
        )
        self._kubelet_port = free_port()
        self._healthz_port = free_port()
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            **self.kubelet_config,
            "address": self.node_ip,
            "port": self._kubelet_port,
            "healthzPort": self._healthz_port,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "tlsCertFile": str(d / "pki" / "kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(d / "pki" / "kubelet-serving.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.control_plane.ca_path)},
            },
            "authorization": {"mode": "Webhook"},
            "volumePluginDir": str(d / "kubelet-plugins" / "volume" / "exec"),
            "podLogsDir": str(d / "pod-logs"),
        }
        (d / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        endpoint = f"unix://{self.containerd_socket}"
        crictl = {"runtime-endpoint": endpoint, "image-endpoint": endpoint, "timeout": 60}
        (d / "crictl.yaml").write_text(yaml.safe_dump(crictl, sort_keys=False))

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, argv: list[str]) -> LoggedProcess:
        path = f"{self._tools['runc'].parent}:/usr/sbin:/usr/bin:/sbin:/bin"
        env = {**os.environ, "PATH": path}
        return spawn_logged(
            name, argv, self.log_path(name), self.data_dir, self._die_with_parent, env
        )

    def _failure(self, proc: LoggedProcess, what: str) -> RealNodeError:
        code = proc.popen.poll()
        state = "running" if code is None else f"exit code {code}"
        return RealNodeError(
            f"node {self.name}: {proc.name} {what} ({state}); last lines of {proc.log_path}:\n"
            f"{log_tail(proc.log_path)}"
        )

    def _start_containerd(self) -> None:
        self._containerd = self._spawn(
            "containerd",
            [str(self._tools["containerd"]), f"--config={self.data_dir / 'containerd.toml'}",
             "--log-level=info"],
        )  # fmt: skip
        proc = self._containerd
        self._wait(proc, lambda: self._ctr_ok(), "serving its socket")

    def _ctr_ok(self) -> bool:
        if not self.containerd_socket.exists():
            return False
        result = subprocess.run(
            [str(self._tools["ctr"]), f"--address={self.containerd_socket}", "version"],
            capture_output=True, timeout=10, check=False,
        )  # fmt: skip
        return result.returncode == 0

    def _start_kubelet(self) -> None:
        argv = [
            str(self._tools["kubelet"]),
            f"--config={self.data_dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.data_dir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.data_dir / 'kubelet'}",
            f"--cert-dir={self.data_dir / 'kubelet' / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}",
            "--v=1",
        ]
        if self.labels:
            argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in self.labels.items()))
        self._kubelet = self._spawn("kubelet", argv)
        url = f"http://127.0.0.1:{self._healthz_port}/healthz"

        def healthy() -> bool:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.read() == b"ok")

        self._wait(self._kubelet, healthy, "healthy (/healthz)")

    def _wait(self, proc: LoggedProcess, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        delay = 0.05
        while True:
            if not proc.alive():
                raise self._failure(proc, "exited while starting")
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise self._failure(proc, f"was not {what} within {self.start_timeout:.0f}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _import(self, tarball: Path, *tags: str) -> None:
        ctr = [str(self._tools["ctr"]), f"--address={self.containerd_socket}", "-n", "k8s.io"]
        result = subprocess.run(
            [*ctr, "images", "import", str(tarball)],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RealNodeError(f"node {self.name}: ctr import {tarball} failed: {result.stderr}")
        names = [
            line.split()[1] for line in result.stdout.splitlines() if line.startswith("unpacking ")
        ]
        for tag in tags:
            if names:
                run_command([*ctr, "images", "tag", "--force", names[0], tag])

    def _crictl(self, *args: str, timeout: float = 60, check: bool = True) -> str:
        argv = [
            str(self._tools["crictl"]),
            f"--config={self.data_dir / 'crictl.yaml'}",
            f"--timeout={int(timeout)}s",
            *args,
        ]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout + 10, check=False
        )
        if check and result.returncode != 0:
            raise RealNodeError(f"node {self.name}: crictl {' '.join(args)}: {result.stderr}")
        return result.stdout

    def _shim_pids(self, table: Mapping[int, tuple[int, list[str]]]) -> set[int]:
        return _shim_pids(self.containerd_socket, table) if self._dir is not None else set()

    # ------------------------------------------------------------------ kernel tunables
    def _save_kernel_tunables(self) -> None:
        """Before the kubelet sets them: the values the machine had, kept once for all
        nodes on it (restored when the last one stops)."""
        with machine_lock("tunables"):
            saved = nodes_dir() / "kernel-tunables.json"
            if not saved.exists():
                saved.write_text(json.dumps(_kernel_tunables()))

    def _restore_kernel_tunables(self) -> None:
        restore_kernel_tunables(self._dir)
