"""RealCluster: a whole local cluster on real nodes (issue 28, fourth stage), with the
surface of `dedup_local.cluster.LocalCluster`: a `ControlPlane(kubelets=True)` with the
CRDs, N `RealNode`s (`node-a`.., zones `zone-a`..) with the project's image imported and
tagged as the chart and the pipelines name it, the host's kube-proxy (`HostProxy`), the
CSI stand-in for a cloud disk (`CsiController`, a `CsiNodePlugin` per node) whose
StorageClass `dedup-disk` is the cluster's default.

    with RealCluster(nodes=3, timings=ClusterTimings.fast(), crds=CRD_FILES) as cluster:
        broker = KafkaBroker(host=cluster.broker_host)  # pods cannot reach 127.0.0.1
        cluster.kubectl("get", "nodes", "-o", "wide")
        cluster.kill("node-b", shutdown=True); cluster.restart("node-b")

- `timings`: the controller-manager's and API server's flags of `ClusterTimings`, and the
  kubelets' Lease duration and status frequency; back-off stays the kubelet's own.
- `kill(node, shutdown=True)` also plays the cloud's node lifecycle controller, as
  `LocalCluster` does (`cluster.CloudNodeLifecycle`, a simulation).
- `pod_log(ns, pod)` reads the containers' log files (every run of the container, in
  order; also of a killed node's pods, and of a deleted pod's: `PodLogKeeper` keeps them),
  without the CRI's time stamp and stream prefix.
- kube-proxy is one per host under a machine-wide lock (`real_network`): `start()` waits
  while another run holds it; `stop()` releases it first.
"""

from __future__ import annotations

import contextlib
import os
import string
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .cluster.cluster import ZONES, CloudNodeLifecycle
from .cluster.timings import ClusterTimings
from .control_plane import ControlPlane
from .lifecycle import Started
from .node_images import NodeImage
from .real_csi import STORAGE_CLASS, CsiController, CsiNodePlugin
from .real_network import HostProxy, PodsCutOffTheApi
from .real_node import RealNode, project_image_archive

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

# What the chart's local values (`chart.LOCAL_CLUSTER_VALUES`) and the pipelines' worker
# (`pipelines.WORKER_ON_CLUSTER`, "dedup-operator:dev": docker.io/library/ to the CRI)
# name the project's image; each node has it under these tags too.
IMAGE_TAGS = ("localhost/dedup-operator:dev", "docker.io/library/dedup-operator:dev")
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"


class RealCluster(Started):
    """See the module docstring. `image`: the project's image reference (default: the
    last built, `image.built_ref()`); `startup` holds how long each part took (s)."""

    def __init__(
        self,
        nodes: int = 3,
        timings: ClusterTimings | None = None,
        crds: Iterable[Path] = (),
        image: str | None = None,
        more_images: Sequence[NodeImage] = (),
    ) -> None:
        self.timings = timings or ClusterTimings.fast()
        self.node_names = [f"node-{string.ascii_lowercase[i]}" for i in range(nodes)]
        self.storage_class = STORAGE_CLASS
        self.image = image
        self.more_images = list(more_images)  # beside the project's: each node holds them too
        self._crds = list(crds)
        self.control_plane: ControlPlane | None = None
        self.nodes: dict[str, RealNode] = {}
        self.csi: CsiController | None = None
        self.plugins: dict[str, CsiNodePlugin] = {}
        self.proxy: HostProxy | None = None
        self.cloud: CloudNodeLifecycle | None = None
        self.cut_off: dict[str, PodsCutOffTheApi] = {}
        self.logs: PodLogKeeper | None = None
        self.startup: dict[str, float] = {}
        self._clients: list[ApiClient] = []

    # ------------------------------------------------------------------ access
    @property
    def _cp(self) -> ControlPlane:
        if self.control_plane is None:
            raise RuntimeError("cluster not started")
        return self.control_plane

    @property
    def kubeconfig_path(self) -> Path:
        return self._cp.kubeconfig_path

    @property
    def broker_host(self) -> str:
        """Where a Kafka broker must listen for pods to reach it: `KafkaBroker(host=...)`."""
        return self._cp.host

    def api_client(self) -> ApiClient:
        return self._cp.api_client()

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self._cp.kubectl(*args, input=input, check=check, timeout=timeout)

    def node(self, name: str) -> RealNode:
        return self.nodes[name]

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A pod's container log (every run, in order); all containers by default."""
        if self.logs is None:
            raise RuntimeError("cluster not started")
        self.logs.scan()
        out = []
        pods = sorted(self.logs.into.glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime)
        for pod_dir in pods:
            for c_dir in sorted(pod_dir.iterdir()):
                if container is None or c_dir.name == container:
                    runs = sorted(c_dir.glob("*.log"), key=lambda p: int(p.stem))
                    out += [_cri_log(run.read_text(errors="replace")) for run in runs]
        return "".join(out)

    def namespace_pod_logs(self, namespace: str) -> dict[str, str]:
        """Every kept pod log of a namespace, deleted pods' included, by pod name."""
        if self.logs is None:
            return {}
        self.logs.scan()
        pods = {d.name.split("_")[1] for d in self.logs.into.glob(f"{namespace}_*_*")}
        return {pod: self.pod_log(namespace, pod) for pod in sorted(pods)}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RealCluster:
        from .image import built_ref

        t0 = time.monotonic()
        self.image = self.image or built_ref()
        archive = project_image_archive(self.image)
        self._mark("image archive", t0)
        fast = {
            "nodeLeaseDurationSeconds": self.timings.node_lease_duration_s,
            "nodeStatusUpdateFrequency": f"{self.timings.node_status_update_s:g}s",
        }
        self.control_plane = ControlPlane(
            with_controllers=True,
            kubelets=True,
            crds=self._crds,
            extra_args=self.timings.control_plane_args(),
        )
        try:
            self.control_plane.start()
            self.startup["control plane"] = self.control_plane.start_seconds
            t0 = time.monotonic()
            self.csi = CsiController(self.control_plane).start()
            self.kubectl("annotate", "storageclass", STORAGE_CLASS, f"{DEFAULT_CLASS}=true",
                         "--overwrite")  # fmt: skip
            self._mark("CSI controller", t0)
            for i, name in enumerate(self.node_names):
                t0 = time.monotonic()
                node = RealNode(
                    self.control_plane,
                    name,
                    labels={"topology.kubernetes.io/zone": ZONES[i % len(ZONES)]},
                    kubelet_config=fast,
                    images=[NodeImage(archive, IMAGE_TAGS), *self.more_images],
                )
                self.nodes[name] = node
                node.start()
                self.plugins[name] = self.csi.add_node(node)
                self._mark(f"{name} Ready with its CSI plugin", t0)
            first = self.nodes[self.node_names[0]]
            self.logs = PodLogKeeper(
                first.data_dir / "kept-pod-logs",
                lambda: [n.data_dir / "pod-logs" for n in self.nodes.values()],
            ).start()
            t0 = time.monotonic()
            self.proxy = HostProxy(self.control_plane, self.nodes[self.node_names[0]]).start()
            self._mark("kube-proxy (lock + rules)", t0)
            self.cloud = CloudNodeLifecycle(self._client(), self.timings.node_monitor_period_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """kube-proxy first (the host's lock goes at once), then the nodes, the CSI
        controller and the control plane."""
        if self.cloud is not None:
            self.cloud.stop()
            self.cloud = None
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        if self.logs is not None:
            self.logs.stop()  # its directory goes with the first node's
            self.logs = None
        for node in reversed(list(self.nodes.values())):
            with contextlib.suppress(Exception):
                node.stop()
        self.nodes.clear()
        self.plugins.clear()
        if self.csi is not None:
            self.csi.stop()
            self.csi = None
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()  # type: ignore[no-untyped-call]
        self._clients.clear()
        if self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None

    # ------------------------------------------------------------------ faults
    def kill(self, node: str, shutdown: bool = False) -> None:
        """The machine dies: its kubelet, containerd, shims, containers and CSI plugin at
        once. `shutdown=True`: the cloud's node lifecycle controller (simulated) taints
        it shut down once it is NotReady, as `LocalCluster.kill` does."""
        self.nodes[node].kill()
        self.cut_off.pop(node, None)  # its sandboxes died, their rules with them
        if shutdown:
            self._cloud.instance_stopped(node)

    def partition(self, node: str, pods: bool = True) -> list[str]:
        """The node loses the API server: its kubelet stops (SIGSTOP), and with `pods`
        (the default, as `LocalCluster.partition` and a real network partition) its
        running pods are cut off the API server too (`PodsCutOffTheApi`), while they
        keep running and reaching Kafka. Returns the pods cut off ("namespace/name")."""
        self.nodes[node].partition()
        if not pods:
            return []
        cut = self.cut_off.get(node)
        if cut is None:
            cp = self._cp
            cut = self.cut_off[node] = PodsCutOffTheApi(
                self.nodes[node], cp.host, cp.apiserver_port
            )
        return cut.cut()

    def heal(self, node: str) -> None:
        """Ends a partition (the pods' rules removed, the kubelet continued), or starts a
        killed node again."""
        cut = self.cut_off.pop(node, None)
        if cut is not None:
            cut.restore()
        real = self.nodes[node]
        if real.running:
            real.heal()
        else:
            real.restart()
            self._cloud.instance_running(node)

    def restart(self, node: str) -> None:
        """Reboot: every process of the node gone, then back; Ready when this returns."""
        self.cut_off.pop(node, None)  # its sandboxes die with it, their rules too
        self.nodes[node].restart()
        self._cloud.instance_running(node)

    # ------------------------------------------------------------------ internals
    @property
    def _cloud(self) -> CloudNodeLifecycle:
        if self.cloud is None:
            raise RuntimeError("cluster not started")
        return self.cloud

    def _client(self) -> ApiClient:
        c = self._cp.api_client()
        self._clients.append(c)
        return c

    def _mark(self, what: str, since: float) -> None:
        self.startup[what] = time.monotonic() - since


class PodLogKeeper(Started):
    """Keeps every container log file the nodes' kubelets write (`<namespace>_<pod>_<uid>/
    <container>/<run>.log` under each node's pod-logs) as a hard link under `into`: a
    kubelet deletes a deleted pod's log files once its containers stopped, and what a
    worker said while it was being replaced is what a failover test reads (as a cluster's
    log collector would have kept it). A link is the same file, so what the container
    writes after the link is kept too. Scanned every 0.2 s, and before each read; `into`
    must be on the nodes' file system (it is the first node's directory)."""

    def __init__(self, into: Path, sources: Callable[[], list[Path]]) -> None:
        self.into = into
        self._sources = sources
        self._seen: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-log-keeper", daemon=True)

    def start(self) -> PodLogKeeper:
        self.into.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def scan(self) -> None:
        with self._lock:
            for root in self._sources():
                for log in root.glob("*/*/*.log"):
                    with contextlib.suppress(OSError):  # a file gone while scanning
                        st = log.stat()
                        if (st.st_dev, st.st_ino) in self._seen:
                            continue
                        kept = self.into / log.relative_to(root)
                        kept.parent.mkdir(parents=True, exist_ok=True)
                        if not kept.exists():  # a name a kubelet used twice: the first
                            os.link(log, kept)
                        self._seen.add((st.st_dev, st.st_ino))

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            with contextlib.suppress(OSError):
                self.scan()


def _cri_log(text: str) -> str:
    """A CRI log file's lines ("<time> <stream> <P|F> <text>") as the container wrote
    them: partial lines joined."""
    out: list[str] = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        out.append(parts[3] if len(parts) == 4 else "")
        if parts[2] != "P":
            out.append("\n")
    return "".join(out)
