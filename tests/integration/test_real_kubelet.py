"""Real kubelets (issue 28, first stage): two nodes of `dedup_local.real_node`, each a
kubelet with its own containerd (runc) and bridge network, join a control plane of their
own and run a pod of the project's image; a node killed, restarted and partitioned.
(What pods reach through the host's kube-proxy is tests/integration/test_real_pod_network.py,
on the session's real-node cluster: one kube-proxy per host.)

Nothing stands in for a real part: kubelet and kube-proxy are built by `make setup-kube`,
containerd/runc/the CNI plugins are Debian's, the pause image is compiled from the
Kubernetes source (`make setup-nodes`), and the project's image is the one `make
setup-image` built with podman, exported with `podman save` and imported with `ctr`.

The nodes get their own control plane rather than the session's (`kube`): the session's
tests bind pods to simulated kubelets and count nodes, which real nodes would disturb, and
a fast NotReady needs the controller-manager's node-monitor timings shortened. The module
still names `kube` so that it runs in the control-plane group's process
(tests/conftest.py: a group's first fixture decides its process).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dedup_local.control_plane import ControlPlane
from dedup_local.image import built_ref
from dedup_local.node_images import NodeImage
from dedup_local.paths import versions
from dedup_local.real_cluster import IMAGE_TAGS
from dedup_local.real_node import RealNode, project_image_archive
from support.kube_fixtures import KubeCluster
from support.pod_bodies import image_pod

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]

# A Node is NotReady once neither its Lease nor its status was renewed for the grace
# period; the kubelet renews its Lease every quarter of its duration.
NODE_MONITOR = ["--node-monitor-grace-period=8s", "--node-monitor-period=1s"]
KUBELET_FAST = {"nodeLeaseDurationSeconds": 4}
POD = "hello-real-kubelet"
PANIC = re.compile(r"^(panic: |fatal error: )|level=(panic|fatal)", re.MULTILINE)


@dataclass
class RealCluster:
    control_plane: ControlPlane
    nodes: list[RealNode]
    image: str
    timings: dict[str, float]

    def node(self, name: str) -> RealNode:
        return next(n for n in self.nodes if n.name == name)


@pytest.fixture(scope="module")
def real_cluster(kube: KubeCluster) -> Iterator[RealCluster]:
    del kube  # only for the group's process (see the module docstring)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    image = built_ref()
    archive = project_image_archive(image)
    timings["image archive"] = time.monotonic() - t0
    control_plane = ControlPlane(
        with_controllers=True, kubelets=True, extra_args={"kube-controller-manager": NODE_MONITOR}
    )
    nodes: list[RealNode] = []
    try:
        control_plane.start()
        timings["control plane"] = control_plane.start_seconds
        for _ in range(2):
            # the project's image as the local cluster's nodes have it (one seed for all)
            node = RealNode(
                control_plane, kubelet_config=KUBELET_FAST, images=[NodeImage(archive, IMAGE_TAGS)]
            )
            nodes.append(node)
            node.start()
            timings[f"{node.name} ready"] = node.ready_seconds
        yield RealCluster(control_plane, nodes, image, timings)
    finally:
        t0 = time.monotonic()
        for node in reversed(nodes):
            node.stop()
        control_plane.stop()
        timings["stop"] = time.monotonic() - t0
        print("timings (s):", {k: round(v, 1) for k, v in timings.items()})


def _pod(name: str, image: str) -> dict[str, Any]:
    return image_pod(name, image, ["sh", "-c", 'echo "hostname=$(hostname)"; exec sleep infinity'])


def _wait_running(
    cluster: RealCluster, name: str, restarts: int = 0, timeout: float = 120
) -> dict[str, Any]:
    """Until the pod runs with its container ready, restarted at least `restarts` times."""
    deadline = time.monotonic() + timeout
    pod: dict[str, Any] = {}
    while time.monotonic() < deadline:
        out = cluster.control_plane.kubectl("get", "pod", name, "-o", "json", check=False)
        if out.returncode == 0:
            pod = json.loads(out.stdout)
            statuses = pod["status"].get("containerStatuses") or [{}]
            if (
                pod["status"].get("phase") == "Running"
                and all(s.get("ready") for s in statuses)
                and all(s.get("restartCount", 0) >= restarts for s in statuses)
            ):
                return pod
        time.sleep(0.2)
    raise AssertionError(
        f"pod {name} not running after {timeout}s: {json.dumps(pod.get('status'))}"
    )


def test_real_kubelets_run_the_project_image(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    cp = cluster.control_plane
    kubelet_version = f"v{versions()['KUBERNETES_VERSION']}"

    # Both nodes Ready, as `kubectl get nodes -o wide` shows them: the kubelet's version
    # and containerd as the runtime, the bridge address as InternalIP.
    for node in cluster.nodes:
        assert node.ready_status() == "True"
    wide = cp.kubectl("get", "nodes", "-o", "wide").stdout
    print(wide)
    rows = {line.split()[0]: line.split() for line in wide.splitlines()[1:]}
    for node in cluster.nodes:
        row = rows[node.name]
        assert row[1] == "Ready" and row[4] == kubelet_version and row[5] == node.node_ip, row
        assert row[-1].startswith("containerd://"), row
        assert cluster.image in node.images()

    # A pod of the project's image runs, with its own host name, logs and exec.
    t0 = time.monotonic()
    cp.kubectl("apply", "-f", "-", input=json.dumps(_pod(POD, cluster.image)))
    pod = _wait_running(cluster, POD)
    cluster.timings["pod running"] = time.monotonic() - t0
    node = cluster.node(pod["spec"]["nodeName"])
    assert pod["status"]["podIP"] in [str(a) for a in node.network.hosts()]
    assert pod["status"]["hostIP"] == node.node_ip
    # The bridge kept the MAC it was given with a pod's veth on it, and the kernel keeps
    # it whatever ports come and go (addr_assign_type 3: set, not taken from a port).
    bridge = Path("/sys/class/net") / node.bridge
    assert (bridge / "address").read_text().strip() == node.bridge_mac
    assert (bridge / "addr_assign_type").read_text().strip() == "3"
    deadline = time.monotonic() + 30
    while f"hostname={POD}" not in (logs := cp.kubectl("logs", POD, check=False).stdout):
        assert time.monotonic() < deadline, f"kubectl logs: {logs!r}"
        time.sleep(0.2)
    assert cp.kubectl("exec", POD, "--", "hostname").stdout.strip() == POD
    assert cp.kubectl("exec", POD, "--", "cat", "/etc/hostname").stdout.strip() == POD
    env = cp.kubectl("exec", POD, "--", "env").stdout
    assert "KUBERNETES_SERVICE_HOST=10.0.0.1" in env
    token = cp.kubectl(
        "exec", POD, "--", "cat", "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ).stdout
    assert token.count(".") == 2  # the projected service-account token, a JWT
    assert node.crictl("ps", "--name", "main", "-q").strip()

    # kill(): the pod's node dies at once (kubelet, containerd, shims, containers) and
    # goes NotReady; the other stays Ready.
    other = next(n for n in cluster.nodes if n is not node)
    node.kill()
    assert not node.running
    cluster.timings["NotReady after kill"] = node.wait_not_ready(timeout=60)
    assert other.ready_status() == "True"
    assert not node.process_ids()

    # restart(): the node comes back, and its kubelet runs the pod again (a new sandbox
    # and container: the restart count goes up).
    t0 = time.monotonic()
    node.restart()
    cluster.timings["Ready after restart"] = time.monotonic() - t0
    _wait_running(cluster, POD, restarts=1)
    cluster.timings["pod running after restart"] = time.monotonic() - t0
    assert cp.kubectl("exec", POD, "--", "hostname").stdout.strip() == POD

    # partition(): the kubelet stops reaching the API server, the container keeps running.
    node.partition()
    try:
        cluster.timings["NotReady after partition"] = node.wait_not_ready(timeout=60)
        assert node.crictl("ps", "--name", "main", "-q").strip()
    finally:
        node.heal()
    node.wait_ready(timeout=60)

    # Health of what runs: no panic in a kubelet's or containerd's log.
    for each in cluster.nodes:
        for component in ("kubelet", "containerd"):
            text = each.log_path(component).read_text(errors="replace")
            assert not PANIC.search(text), f"{each.name} {component}: {PANIC.search(text)}"
    cp.kubectl("delete", "pod", POD, "--wait=true", "--timeout=60s")
