"""Volumes of real nodes through real CSI (issue 28): the kubelet's volume manager, the
attach/detach controller and VolumeAttachments are Kubernetes' own; `scripts/setup-csi.sh`
builds the kubernetes-csi sidecars from their Go modules and the project's driver.

- **the driver**, `dedup-csi-disk` (local/csi-disk): a stand-in for a cloud disk. A disk
  is a directory of the controller's, which every node on this host reaches; it is
  attached to one node at a time (ControllerPublishVolume for another node fails until
  it is detached), a node stages only a disk attached to it, no topology.
  csi-driver-host-path is not served by the Go module proxy here (and attaches only to
  its own node), nor is node-driver-registrar: the driver's node mode serves the
  kubelet's plugin registration socket itself.
- **`CsiController`**: per control plane, host processes: the driver in controller mode,
  csi-provisioner and csi-attacher; each sidecar as its own ServiceAccount with the RBAC
  its module publishes (deploy/kubernetes/rbac.yaml, applied as is), a token from the
  TokenRequest API; the CSIDriver (attachRequired) and the StorageClass `STORAGE_CLASS`.
- **`CsiNodePlugin`**: per node, the driver in node mode, its socket under the kubelet's
  `plugins/`, registered through `plugins_registry/`; part of the node
  (`RealNode.add_plugin`): killed by `kill()`, started again by `restart()`.

    with ControlPlane(kubelets=True) as cp, CsiController(cp) as csi, RealNode(cp) as node:
        csi.add_node(node)
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .control_plane import ControlPlane
from .host import LoggedProcess, log_tail, may_die_with_parent, process_identity, spawn_logged
from .lifecycle import Started
from .paths import MissingArtifact, cache_dir
from .patience import PatientDeadline
from .real_node import UNIX_SOCKET_MAX, RealNode

SETUP_HINT = "run: make setup-csi"
DRIVER = "disk.dedup.local"
STORAGE_CLASS = "dedup-disk"
SIDECARS = ("csi-provisioner", "csi-attacher")
NAMESPACE = "default"  # where the sidecars' published RBAC puts their ServiceAccounts


class CsiError(RuntimeError):
    """A CSI part failed to start or to register; the message has its log tail."""


def csi_dir() -> Path:
    """Where `scripts/setup-csi.sh` caches the binaries and the sidecars' RBAC, and where
    the controllers' directories (their disks) live (`run/`)."""
    return cache_dir() / "csi"


def _binary(name: str) -> Path:
    path = csi_dir() / "bin" / name
    if not os.access(path, os.X_OK):
        raise MissingArtifact(f"{path} is not built; {SETUP_HINT}")
    return path


def reap_stale_controllers() -> list[str]:
    """Remove the directories (disks) of controllers whose owning process died; their
    processes died with it (they are started to die with their parent)."""
    run = csi_dir() / "run"
    stale = []
    for directory in sorted(run.iterdir()) if run.exists() else []:
        with contextlib.suppress(OSError):
            owner = (directory / "owner").read_text().strip()
            if owner and process_identity(int(owner.split()[0])) != owner:
                shutil.rmtree(directory, ignore_errors=True)
                stale.append(directory.name)
    return stale


def _spawn(name: str, argv: list[str], log_path: Path, cwd: Path) -> LoggedProcess:
    return spawn_logged(name, argv, log_path, cwd, may_die_with_parent())


def _wait(proc: LoggedProcess, ready: Callable[[], bool], what: str, timeout: float) -> None:
    patience = PatientDeadline(timeout)  # a busy machine waits longer
    while not ready():
        if not proc.alive():
            raise CsiError(f"{proc.name} exited before {what}:\n{log_tail(proc.log_path)}")
        if patience.expired():
            raise CsiError(f"{proc.name}: not {what} after {patience.describe()}:\n"
                           f"{log_tail(proc.log_path)}")  # fmt: skip
        time.sleep(0.1)


class CsiController(Started):
    """The controller side of the driver for one `ControlPlane(kubelets=True)` (see the
    module docstring); `add_node` runs the node side on a `RealNode`."""

    def __init__(
        self, control_plane: ControlPlane, *, start_timeout: float = 60.0, keep_data: bool = False
    ) -> None:
        self.control_plane = control_plane
        self.start_timeout = start_timeout
        self.keep_data = keep_data
        self.name = f"csi-{uuid.uuid4().hex[:6]}"
        self._dir: Path | None = None
        self._processes: list[LoggedProcess] = []
        self._atexit_registered = False

    @property
    def data_dir(self) -> Path:
        if self._dir is None:
            raise RuntimeError(f"{self.name} not started")
        return self._dir

    @property
    def disks_dir(self) -> Path:
        """The disks: `<id>/` their contents, `<id>.json` their records (the node one is
        attached to)."""
        return self.data_dir / "disks"

    @property
    def socket(self) -> Path:
        return self.data_dir / "controller.sock"

    def log_path(self, component: str) -> Path:
        """The log of "driver", "csi-provisioner" or "csi-attacher"."""
        return self.data_dir / "logs" / f"{component}.log"

    def disks(self) -> dict[str, dict[str, Any]]:
        """The driver's records of its disks by id: name, capacity, `node` attached to.
        A record the driver removes between the listing and its read (the disk deleted
        meanwhile) is not among them."""
        records: dict[str, dict[str, Any]] = {}
        for path in self.disks_dir.glob("*.json"):
            try:
                records[path.stem] = json.loads(path.read_text())
            except FileNotFoundError:
                continue
        return records

    def start(self) -> CsiController:
        """Apply the sidecars' RBAC, the CSIDriver and the StorageClass; start the driver
        and the sidecars; returns once both sidecars have talked to the driver."""
        if self._dir is not None:
            return self
        if not self.control_plane.kubelets:
            raise CsiError("the control plane must be made with ControlPlane(kubelets=True)")
        binaries = {n: _binary(n) for n in ("dedup-csi-disk", *SIDECARS)}
        rbac = {n: csi_dir() / "rbac" / f"{n}.yaml" for n in SIDECARS}
        if missing := [str(p) for p in rbac.values() if not p.is_file()]:
            raise MissingArtifact(f"missing: {', '.join(missing)}; {SETUP_HINT}")
        reap_stale_controllers()
        self._dir = csi_dir() / "run" / self.name
        self._dir.mkdir(parents=True)
        (self._dir / "owner").write_text(process_identity(os.getpid()) + "\n")
        (self._dir / "logs").mkdir()
        self.disks_dir.mkdir()
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._apply_objects(rbac)
            driver = self._start(
                "driver",
                [str(binaries["dedup-csi-disk"]), "--mode=controller", f"--driver-name={DRIVER}",
                 f"--endpoint={self.socket}", f"--disks={self.disks_dir}"],
            )  # fmt: skip
            _wait(driver, self.socket.exists, "serving its socket", self.start_timeout)
            for sidecar in SIDECARS:
                kubeconfig = self._kubeconfig(sidecar)
                self._start(
                    sidecar,
                    [str(binaries[sidecar]), f"--csi-address={self.socket}",
                     f"--kubeconfig={kubeconfig}", "--leader-election=false", "--timeout=30s",
                     "--v=3"],
                )  # fmt: skip

            def both_connected() -> bool:
                log = self.log_path("driver").read_text(errors="replace")
                return log.count("/csi.v1.Identity/GetPluginInfo") >= len(SIDECARS)

            _wait(driver, both_connected, "asked by both sidecars", self.start_timeout)
            for proc in self._processes:
                if not proc.alive():
                    raise CsiError(f"{proc.name} exited:\n{log_tail(proc.log_path)}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the sidecars and the driver; remove the directory and its disks. The API
        objects stay (the control plane goes with its test)."""
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        for proc in reversed(self._processes):
            proc.terminate(grace=5.0)
        self._processes = []
        if self._dir is not None and not self.keep_data:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None

    def add_node(self, node: RealNode, timeout: float = 60.0) -> CsiNodePlugin:
        """Run the driver's node side on `node` (`RealNode.add_plugin`); returns once the
        kubelet registered it (its CSINode lists the driver)."""
        plugin = CsiNodePlugin(self, node)
        node.add_plugin(plugin)
        plugin.wait_registered(timeout)
        return plugin

    def _start(self, name: str, argv: list[str]) -> LoggedProcess:
        proc = _spawn(name, argv, self.log_path(name), self.data_dir)
        self._processes.append(proc)
        return proc

    def _apply_objects(self, rbac: dict[str, Path]) -> None:
        cp = self.control_plane
        for path in rbac.values():
            cp.kubectl("apply", "-f", str(path))
        objects = [
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSIDriver",
                "metadata": {"name": DRIVER},
                "spec": {
                    "attachRequired": True,  # the attach/detach controller attaches it
                    "podInfoOnMount": False,
                    "volumeLifecycleModes": ["Persistent"],
                    "fsGroupPolicy": "File",
                },
            },
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": STORAGE_CLASS},
                "provisioner": DRIVER,
                "reclaimPolicy": "Delete",
                "volumeBindingMode": "Immediate",  # no topology: any node attaches it
                "allowVolumeExpansion": False,
            },
        ]
        cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                         "items": objects}))  # fmt: skip

    def _kubeconfig(self, sidecar: str) -> Path:
        """A kubeconfig of the sidecar's ServiceAccount (its published RBAC), with a
        token from the TokenRequest API."""
        cp = self.control_plane
        token = cp.kubectl(
            "create", "token", sidecar, "-n", NAMESPACE, "--duration=720h"
        ).stdout.strip()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "dedup-local",
                    "cluster": {"server": cp.server, "certificate-authority": str(cp.ca_path)},
                }
            ],
            "users": [{"name": sidecar, "user": {"token": token}}],
            "contexts": [
                {"name": "dedup-local", "context": {"cluster": "dedup-local", "user": sidecar}}
            ],
            "current-context": "dedup-local",
        }
        path = self.data_dir / f"{sidecar}.kubeconfig"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path


class CsiNodePlugin:
    """The driver in node mode on one `RealNode` (a `real_node.NodePlugin`): its CSI
    socket in the kubelet's `plugins/DRIVER/`, its registration socket in the kubelet's
    `plugins_registry/`, its log the node's "csi-disk"."""

    def __init__(self, controller: CsiController, node: RealNode) -> None:
        self.controller = controller
        self.node = node
        self._proc: LoggedProcess | None = None

    @property
    def socket(self) -> Path:
        return self.node.data_dir / "kubelet" / "plugins" / DRIVER / "csi.sock"

    @property
    def registration_socket(self) -> Path:
        return self.node.data_dir / "kubelet" / "plugins_registry" / f"{DRIVER}-reg.sock"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def start(self) -> None:
        if self.running:
            return
        self.socket.unlink(missing_ok=True)
        if len(str(self.registration_socket)) > UNIX_SOCKET_MAX:
            raise CsiError(
                f"{self.registration_socket} is longer than the {UNIX_SOCKET_MAX} bytes a unix "
                "socket's path may have: set DEDUP_CACHE to a shorter directory"
            )
        self.registration_socket.unlink(missing_ok=True)
        argv = [
            str(_binary("dedup-csi-disk")),
            "--mode=node",
            f"--driver-name={DRIVER}",
            f"--endpoint={self.socket}",
            f"--registration-socket={self.registration_socket}",
            f"--disks={self.controller.disks_dir}",
            f"--node-id={self.node.name}",
        ]
        self._proc = _spawn("csi-disk", argv, self.node.log_path("csi-disk"), self.node.data_dir)
        proc = self._proc
        _wait(
            proc,
            lambda: self.socket.exists() and self.registration_socket.exists(),
            "serving its sockets",
            self.node.start_timeout,
        )

    def kill(self) -> None:
        """SIGKILL, as the node dies (its sockets stay behind, as they would), and the
        node's mounts of the disks go with it: every node shares this host's mount
        table, where the kubelet of the node a disk moves to would find a dead node's
        mounts as references of its own and refuse to unstage the disk (on separate
        machines a dead node's mounts are nobody else's concern)."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.popen.wait(timeout=10)
            self._proc.log_file.close()
            self._proc = None
        for point in self.mounts():
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)

    def mounts(self) -> list[str]:
        """The node's mount points of the driver's disks (stagings and pods' volumes),
        deepest first."""
        disks = {p.name for p in self.controller.disks_dir.iterdir() if p.is_dir()}
        kubelet = str(self.node.data_dir / "kubelet") + "/"
        points = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            root, point = Path(fields[3]), fields[4].replace("\\040", " ")
            if point.startswith(kubelet) and root.name in disks and root.parent.name == "disks":
                points.append(point)
        return sorted(points, key=len, reverse=True)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate(grace=5.0)
            self._proc = None

    def wait_registered(self, timeout: float = 60.0) -> None:
        """Until the node's CSINode lists the driver (the kubelet registered it)."""
        patience = PatientDeadline(timeout)  # a busy machine waits longer
        while True:
            out = self.node.control_plane.kubectl(
                "get", "csinode", self.node.name, "-o", "json", check=False
            )
            if out.returncode == 0:
                drivers = json.loads(out.stdout).get("spec", {}).get("drivers") or []
                if any(d.get("name") == DRIVER for d in drivers):
                    return
            if self._proc is None or not self._proc.alive() or patience.expired():
                log = self.node.log_path("csi-disk")
                raise CsiError(
                    f"node {self.node.name}: the kubelet did not register {DRIVER} within "
                    f"{patience.describe()}; {log}:\n{log_tail(log)}\nkubelet:\n"
                    f"{log_tail(self.node.log_path('kubelet'), 20)}"
                )
            time.sleep(0.2)
