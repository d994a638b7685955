"""LocalCluster: a real control plane (dedup_local.control_plane.ControlPlane) plus N nodes whose
agents run pods (as processes, or with `containers=True` the project's image in real
containers through podman: runtime.py), a per-node API proxy, and a volume pool with its
attacher.

    with LocalCluster(nodes=3, timings=ClusterTimings.fast()) as cluster:
        cluster.kubectl("get", "nodes")
        cluster.kill("node-b"); cluster.restart("node-b")
        cluster.kill("node-b", shutdown=True)  # and play the cloud's node lifecycle controller
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import string
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_operator.failover import SHUTDOWN_TAINT

from ..control_plane import ControlPlane
from ..lifecycle import Started
from ..paths import cache_dir
from .agent import NodeAgent
from .attacher import STORAGE_CLASS, Attacher, as_json
from .proxy import ApiProxy
from .runtime import CONTAINER_LABEL, CONTAINER_PID_LABEL
from .timings import ClusterTimings

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

ZONES = ("zone-a", "zone-b", "zone-c")
log = logging.getLogger(__name__)


IP_BLOCKS = range(11, 100)


def _blocks_dir() -> Path:
    return cache_dir() / "local-cluster" / "ip-blocks"


def claim_ip_block(owner: Path) -> int:
    """A `127.<block>.0.0/16` for this cluster's pods that no other live cluster on the
    machine holds (several run at once: parallel test processes, a demo): a claim file per
    block names its owner (data directory and process); a claim whose process is gone is
    stale (a run killed before it could release it)."""
    directory = _blocks_dir()
    directory.mkdir(parents=True, exist_ok=True)
    for block in random.sample(IP_BLOCKS, len(IP_BLOCKS)):
        claim = directory / str(block)
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            with contextlib.suppress(OSError, ValueError):
                if not _alive(int(claim.read_text().split("\n")[1])):
                    claim.unlink()  # its cluster is gone; another start may take it
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{owner}\n{os.getpid()}")
        return block
    raise RuntimeError(f"every pod address block is claimed (see {directory})")


def release_ip_block(block: int, owner: Path) -> None:
    claim = _blocks_dir() / str(block)
    with contextlib.suppress(OSError):
        if claim.read_text().split("\n")[0] == str(owner):
            claim.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphan_containers() -> None:
    """Containers of local clusters whose process is gone (a test run killed before it
    could stop its cluster): removed, so that they neither run on nor hold pod addresses."""
    from ..image import podman

    listed = podman("ps", "--all", "--format", f'{{{{.ID}}}} {{{{index .Labels "{CONTAINER_PID_LABEL}"}}}}',
                    "--filter", f"label={CONTAINER_LABEL}", check=False)  # fmt: skip
    orphans = [
        cid
        for cid, _, pid in (line.partition(" ") for line in listed.stdout.splitlines())
        if not pid.strip().isdigit() or not _alive(int(pid))
    ]
    if orphans:
        podman("rm", "--force", "--time", "0", *orphans, check=False)


class CloudNodeLifecycle:
    """A **simulation** of the cloud provider's node lifecycle controller (the cloud
    controller manager's `cloud-node-lifecycle`), for nodes this cluster killed with
    `shutdown=True`: there is no cloud here, so `instance_stopped(node)` stands for the
    cloud API reporting the node's instance shut down, and `instance_running(node)` for it
    running again.

    As the real controller does, every node monitor period it looks at a stopped
    instance's node and taints it `node.cloudprovider.kubernetes.io/shutdown:NoSchedule`
    only once the node's Ready condition is not True (set by kube-controller-manager's
    node lifecycle controller after its grace period): never earlier, or a figure
    measured with it would mean nothing. The taint comes off once the instance runs again
    (the real controller lifts it when the node reports Ready again, which a restarted
    agent does at once). Taints are written compare-and-set on the node's resourceVersion,
    so the node lifecycle controller's own taints (unreachable, not-ready) are never lost."""

    def __init__(self, api: ApiClient, period_s: float) -> None:
        self.core = client.CoreV1Api(api)
        self.period_s = period_s
        self._stopped: dict[str, threading.Event] = {}
        self._threads: dict[str, threading.Thread] = {}

    def instance_stopped(self, node: str) -> None:
        self.instance_running(node, untaint=False)  # a watcher of an earlier stop ends
        running = self._stopped[node] = threading.Event()
        thread = threading.Thread(
            target=self._taint_when_not_ready,
            args=(node, running),
            name=f"cloud-node-lifecycle-{node}",
            daemon=True,
        )
        self._threads[node] = thread
        thread.start()

    def instance_running(self, node: str, untaint: bool = True) -> None:
        running, thread = self._stopped.pop(node, None), self._threads.pop(node, None)
        if running is not None:
            running.set()
        if thread is not None:
            thread.join(timeout=30)
        if untaint:
            self._set_taint(node, present=False)

    def stop(self) -> None:
        for node in list(self._stopped):
            self.instance_running(node, untaint=False)

    def _taint_when_not_ready(self, node: str, running: threading.Event) -> None:
        while not running.wait(self.period_s):
            try:
                found = as_json(self.core.read_node(node, _preload_content=False))
                conditions = (found.get("status") or {}).get("conditions") or []
                ready = next((c["status"] for c in conditions if c["type"] == "Ready"), "Unknown")
                if ready != "True":
                    self._set_taint(node, present=True)
                    log.info("cloud (simulated): node %s shut down, tainted", node)
                    return
            except Exception:  # the API server away a moment: look again next period
                log.warning("cloud (simulated): cannot look at node %s", node, exc_info=True)

    def _set_taint(self, node: str, present: bool) -> None:
        for _ in range(20):
            try:
                found = as_json(self.core.read_node(node, _preload_content=False))
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            taints = list((found.get("spec") or {}).get("taints") or [])
            has = any(t.get("key") == SHUTDOWN_TAINT for t in taints)
            if has == present:
                return
            if present:
                taints.append({"key": SHUTDOWN_TAINT, "effect": "NoSchedule"})
            else:
                taints = [t for t in taints if t.get("key") != SHUTDOWN_TAINT]
            body = {
                "metadata": {"resourceVersion": found["metadata"]["resourceVersion"]},
                "spec": {"taints": taints},
            }
            try:
                self.core.patch_node(node, body)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise  # 409: someone else changed the node meanwhile: read it again
        raise RuntimeError(f"cannot {'add' if present else 'remove'} {SHUTDOWN_TAINT} on {node}")


class LocalCluster(Started):
    def __init__(
        self,
        nodes: int = 3,
        timings: ClusterTimings | None = None,
        crds: Iterable[Path] = (),
        data_dir: Path | None = None,
        containers: bool = False,
    ) -> None:
        self.containers = containers
        self.timings = timings or ClusterTimings.fast()
        self.node_names = [f"node-{string.ascii_lowercase[i]}" for i in range(nodes)]
        self.storage_class = STORAGE_CLASS
        self._crds = list(crds)
        self._own_dir = data_dir is None
        self._data_dir = data_dir
        self.control_plane: ControlPlane | None = None
        self.agents: dict[str, NodeAgent] = {}
        self.proxies: dict[str, ApiProxy] = {}
        self.attacher: Attacher | None = None
        self.cloud: CloudNodeLifecycle | None = None
        self._ips: dict[str, str] = {}
        self._ip_lock = threading.Lock()
        self._ip_block = 0  # claimed in start(); 127.100.x.y are the nodes' host IPs
        self._next_ip = 0
        self._clients: list[ApiClient] = []

    # ------------------------------------------------------------------ paths
    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise RuntimeError("cluster not started")
        return self._data_dir

    @property
    def pool(self) -> Path:
        return self.data_dir / "pool"

    @property
    def kubeconfig_path(self) -> Path:
        return self._cp.kubeconfig_path

    @property
    def _cp(self) -> ControlPlane:
        if self.control_plane is None:
            raise RuntimeError("cluster not started")
        return self.control_plane

    def log_path(self, namespace: str, pod: str, container: str) -> Path:
        return self.data_dir / "logs" / namespace / pod / f"{container}.log"

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A pod's container log (all runs, appended); the only container by default."""
        pod_dir = self.data_dir / "logs" / namespace / pod
        files = [pod_dir / f"{container}.log"] if container else sorted(pod_dir.glob("*.log"))
        return "".join(f.read_text(errors="replace") for f in files if f.exists())

    # ------------------------------------------------------------------ clients
    def api_client(self) -> ApiClient:
        return self._cp.api_client()

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self._cp.kubectl(*args, input=input, check=check, timeout=timeout)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LocalCluster:
        if self._data_dir is None:
            # Not under /tmp: pods may mount an emptyDir over /tmp.
            root = cache_dir() / "local-cluster"
            root.mkdir(parents=True, exist_ok=True)
            self._data_dir = Path(tempfile.mkdtemp(prefix="run-", dir=root))
        self.pool.mkdir(parents=True, exist_ok=True)
        self._ip_block = claim_ip_block(self.data_dir)
        if self.containers:
            remove_orphan_containers()
        self.control_plane = ControlPlane(
            with_controllers=True, crds=self._crds, extra_args=self.timings.control_plane_args()
        )
        try:
            self.control_plane.start()
            self.attacher = Attacher(self._client(), self.pool, self.timings.poll_s)
            self.attacher.install()
            self.attacher.start()
            self.cloud = CloudNodeLifecycle(self._client(), self.timings.node_monitor_period_s)
            for name in self.node_names:
                self._start_node(name)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def cluster_id(self) -> str:
        """Names and labels this cluster's containers (its data directory's name)."""
        return "dl-" + self.data_dir.name.removeprefix("run-")

    def stop(self) -> None:
        if self.cloud is not None:
            self.cloud.stop()
            self.cloud = None
        for agent in self.agents.values():
            agent.stop(kill_pods=True)
        self.agents.clear()
        if self.containers and self._data_dir is not None:
            # Containers of partitioned or killed nodes' pods that are still around.
            from ..image import podman

            listed = podman("ps", "--all", "--quiet", "--filter",
                            f"label={CONTAINER_LABEL}={self.cluster_id}", check=False)  # fmt: skip
            if listed.stdout.split():
                podman("rm", "--force", "--time", "0", *listed.stdout.split(), check=False)
        for proxy in self.proxies.values():
            proxy.close()
        self.proxies.clear()
        if self.attacher is not None:
            self.attacher.stop()
            self.attacher = None
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()  # type: ignore[no-untyped-call]
        self._clients.clear()
        if self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None
        if self._ip_block:
            release_ip_block(self._ip_block, self.data_dir)
            self._ip_block = 0
        if self._own_dir and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    def _client(self) -> ApiClient:
        c = self._cp.api_client()
        self._clients.append(c)
        return c

    def _start_node(self, name: str) -> None:
        i = self.node_names.index(name)
        proxy = self.proxies.get(name)
        if proxy is None:
            url = urlparse(self._cp.server)
            proxy = self.proxies[name] = ApiProxy(
                (url.hostname or "127.0.0.1", url.port or 443)
            ).start()
        agent = NodeAgent(
            name=name,
            zone=ZONES[i % len(ZONES)],
            host_ip=f"127.100.0.{i + 1}",
            api=self._client(),
            data_dir=self.data_dir / "nodes" / name,
            pool=self.pool,
            timings=self.timings,
            proxy_port=proxy.port,
            ca_path=self._cp.ca_path,
            allocate_ip=self._allocate_ip,
            release_ip=self._release_ip,
            log_path=self.log_path,
            containers=self.containers,
            cluster_id=self.cluster_id,
        )
        self.agents[name] = agent
        agent.start()

    def _allocate_ip(self, uid: str, wanted: str | None) -> str:
        """A pod IP never handed out before in this cluster (a partitioned node's process
        may still listen on an old pod's address), in a 127.x block chosen at random per
        cluster so that two clusters on one machine do not collide."""
        with self._ip_lock:
            if uid in self._ips:
                return self._ips[uid]
            if wanted and wanted.startswith("127.") and wanted not in self._ips.values():
                ip = wanted
            else:
                n = self._next_ip
                self._next_ip += 1
                ip = f"127.{self._ip_block}.{n // 250}.{n % 250 + 2}"
            self._ips[uid] = ip
            return ip

    def _release_ip(self, uid: str) -> None:
        with self._ip_lock:
            self._ips.pop(uid, None)

    # ------------------------------------------------------------------ faults
    def kill(self, node: str, shutdown: bool = False) -> None:
        """The machine dies: heartbeats stop, its pods' processes get SIGKILL; what the API
        says (pods, volume attachments) stays until Kubernetes acts.

        `shutdown=True`: the cloud provider also knows the instance is stopped, and the
        cluster plays its node lifecycle controller (a simulation, `CloudNodeLifecycle`):
        in a background thread it waits until the node's Ready condition is no longer True
        (as kube-controller-manager's node lifecycle controller marks it after its grace
        period), and only then taints the node `node.cloudprovider.kubernetes.io/shutdown:
        NoSchedule`. `restart` (or `heal`) removes the taint: the instance runs again."""
        agent = self.agents.pop(node)
        agent.stop(kill_pods=True)
        self.proxies[node].partition()
        if shutdown:
            self._cloud.instance_stopped(node)

    def partition(self, node: str) -> None:
        """The node loses the API server: its agent stops talking to it and its pods' API
        proxy is cut; its processes keep running (and keep reaching Kafka on loopback)."""
        self.agents[node].partitioned = True
        self.proxies[node].partition()

    def heal(self, node: str) -> None:
        self.proxies[node].heal()
        if node in self.agents:
            self.agents[node].partitioned = False
        else:
            self._start_node(node)
            self._cloud.instance_running(node)

    def restart(self, node: str) -> None:
        """Reboot: processes gone, the agent comes back and runs what is still bound to it."""
        agent = self.agents.pop(node, None)
        if agent is not None:
            agent.stop(kill_pods=True)
        self.proxies[node].heal()
        self._start_node(node)  # Ready again: the agent reports it as it registers
        self._cloud.instance_running(node)

    @property
    def _cloud(self) -> CloudNodeLifecycle:
        if self.cloud is None:
            raise RuntimeError("cluster not started")
        return self.cloud
