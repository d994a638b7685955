"""The node agent: what a kubelet does for one node, in one thread.

Every `poll_s` it renews its Lease in kube-node-lease, patches (never replaces) its node
status (Ready heartbeat, volumesInUse), lists the pods bound to it and reconciles them:
starts containers (runtime.py: from their image with podman on a cluster with
containers, else as processes) once their volumes are ready, gives the volumes of a pod
with `fsGroup` that group (as the kubelet does, when the root's group differs) and
emptyDirs mode 1777, restarts them
per restartPolicy with back-off, runs probes, reports pod status, and on deletion sends
SIGTERM, waits the grace period, SIGKILLs and deletes the pod object with grace 0.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dedup_contract.timefmt import format_micro_time, format_time

from ..image import image_exists, image_id, podman_env
from ..paths import REPO_ROOT
from .attacher import DRIVER, as_json, unique_volume_name
from .runtime import (
    ConfigError,
    ContainerProcess,
    ContainerRecord,
    PodmanContainer,
    base_env,
    container_argv,
    is_project_image,
    pod_conditions,
    pod_phase,
    podman_run_argv,
    resolve_env,
    will_restart,
)
from .timings import ClusterTimings

log = logging.getLogger(__name__)
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
KUBELET_VERSION = "v1.34.4"


def now() -> str:
    return format_time(datetime.now(UTC))


def micro_now() -> str:
    return format_micro_time(datetime.now(UTC))


def mount_plan(container: Mapping[str, Any], sources: Mapping[str, Path]) -> list[dict[str, Any]]:
    """Bind mounts for a container's volumeMounts, given each volume's host directory."""
    plan = []
    for vm in container.get("volumeMounts") or []:
        source = sources[vm["name"]]
        if vm.get("subPath"):
            source = source / vm["subPath"]
            source.mkdir(parents=True, exist_ok=True)
        plan.append(
            {"source": str(source), "target": vm["mountPath"], "readOnly": bool(vm.get("readOnly"))}
        )
    return plan


def probe_port(port: int | str, container: Mapping[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ConfigError(f"no port named {port}")


@dataclass
class Probe:
    spec: dict[str, Any]
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0

    def due(self, started: float) -> bool:
        return time.monotonic() >= max(
            self.next_at, started + float(self.spec.get("initialDelaySeconds", 0))
        )


@dataclass
class Container:
    spec: dict[str, Any]
    record: ContainerRecord
    process: ContainerProcess | None = None
    started_mono: float = 0.0
    start_after: float = 0.0
    readiness: Probe | None = None
    liveness: Probe | None = None
    probe_ready: bool = False
    runs: int = 0


@dataclass
class PodRunner:
    pod: dict[str, Any]
    dir: Path
    ip: str
    containers: list[Container] = field(default_factory=list)
    volume_sources: dict[str, Path] | None = None
    pvc_volumes: list[str] = field(default_factory=list)  # unique volume names
    last_status: dict[str, Any] | None = None
    start_time: str = field(default_factory=now)

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    def alive(self) -> bool:
        return any(c.process is not None and c.process.exit_code() is None for c in self.containers)

    def kill(self) -> None:
        for c in self.containers:
            if c.process is not None:
                c.process.kill()


class NodeAgent:
    def __init__(
        self,
        name: str,
        zone: str,
        host_ip: str,
        api: ApiClient,
        data_dir: Path,
        pool: Path,
        timings: ClusterTimings,
        proxy_port: int,
        ca_path: Path,
        allocate_ip: Callable[[str, str | None], str],
        release_ip: Callable[[str], None],
        log_path: Callable[[str, str, str], Path],
        containers: bool = False,
        cluster_id: str = "",
    ) -> None:
        self.name, self.zone, self.host_ip = name, zone, host_ip
        self.api, self.data_dir, self.pool, self.timings = api, data_dir, pool, timings
        self.proxy_port, self.ca_path = proxy_port, ca_path
        self.allocate_ip, self.release_ip, self.log_path = allocate_ip, release_ip, log_path
        self.core = client.CoreV1Api(api)
        self.containers, self.cluster_id = containers, cluster_id
        self.partitioned = False
        self.pods: dict[str, PodRunner] = {}  # by uid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"agent-{name}", daemon=True)
        self._last_lease = 0.0
        self._last_status = 0.0
        self._ready_since = now()
        self._reported_in_use: list[str] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.register()
        self._thread.start()

    def stop(self, kill_pods: bool = True) -> None:
        """Stop the agent (heartbeats end); with kill_pods its processes get SIGKILL."""
        self._stop.set()
        self._thread.join(timeout=30)
        if kill_pods:
            for runner in self.pods.values():
                runner.kill()
                self.release_ip(runner.pod["metadata"]["uid"])

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.partitioned:
                try:
                    self.sync()
                except Exception:
                    log.exception("node %s: sync failed", self.name)
            else:
                for runner in self.pods.values():
                    for c in runner.containers:
                        if c.process is not None:
                            c.process.enforce()
            self._stop.wait(self.timings.poll_s)

    # ------------------------------------------------------------------ node
    def register(self) -> None:
        node = {
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "topology.kubernetes.io/zone": self.zone,
                },
                "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            },
        }
        try:
            self.core.create_node(node)  # type: ignore[arg-type]
        except ApiException as exc:
            if exc.status != 409:
                raise
        self._ready_since = now()
        self.heartbeat(force=True)

    def heartbeat(self, force: bool = False) -> None:
        t = time.monotonic()
        if force or t - self._last_lease >= self.timings.node_lease_renew_s:
            self._renew_lease()
            self._last_lease = t
        in_use = sorted({v for r in self.pods.values() for v in r.pvc_volumes})
        if (
            force
            or in_use != self._reported_in_use
            or t - self._last_status >= self.timings.node_status_update_s
        ):
            self._patch_status(in_use)
            self._reported_in_use = in_use
            self._last_status = t

    def _renew_lease(self) -> None:
        coord = client.CoordinationV1Api(self.api)
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": self.timings.node_lease_duration_s,
                "renewTime": micro_now()}  # fmt: skip
        try:
            coord.patch_namespaced_lease(self.name, "kube-node-lease", {"spec": spec})
        except ApiException as exc:
            if exc.status != 404:
                raise
            coord.create_namespaced_lease(
                "kube-node-lease",
                {"metadata": {"name": self.name}, "spec": spec},  # type: ignore[arg-type]
            )

    def _patch_status(self, in_use: list[str]) -> None:
        t = now()
        resources = {"cpu": "4", "memory": "8Gi", "pods": "110", "ephemeral-storage": "50Gi"}

        def cond(type_: str, status: str, reason: str) -> dict[str, Any]:
            return {"type": type_, "status": status, "reason": reason, "message": reason,
                    "lastHeartbeatTime": t, "lastTransitionTime": self._ready_since}  # fmt: skip

        status = {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID"),
                cond("Ready", "True", "KubeletReady"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.host_ip},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": self.name,
                "systemUUID": self.name,
                "bootID": self._ready_since,
                "kernelVersion": os.uname().release,
                "osImage": "dedup-local",
                "containerRuntimeVersion": "podman://4"
                if self.containers
                else "dedup-local://processes",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "volumesInUse": in_use,
        }
        self.core.patch_node_status(self.name, {"status": status})

    # ------------------------------------------------------------------ pods
    def sync(self) -> None:
        self.heartbeat()
        node = as_json(self.core.read_node(self.name, _preload_content=False))
        attached = {v["name"] for v in (node.get("status") or {}).get("volumesAttached") or []}
        pods = as_json(
            self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.name}", _preload_content=False
            )
        )["items"]
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            runner = self.pods.get(uid)
            if runner is None:
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") and not pod[
                    "metadata"
                ].get("deletionTimestamp"):
                    continue  # finished before this agent (re)started: nothing to run
                runner = self._admit(pod)
            runner.pod = pod
            try:
                if pod["metadata"].get("deletionTimestamp"):
                    self._terminate(runner)
                else:
                    self._step(runner, attached)
            except ConfigError as exc:
                for c in runner.containers:
                    if c.process is None:
                        c.record.reason, c.record.message = exc.reason, str(exc)
                self._report(runner)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        for uid in [u for u in self.pods if u not in seen]:  # gone from the API (force-deleted)
            runner = self.pods.pop(uid)
            runner.kill()
            self._forget(runner)
        self.heartbeat()

    def _admit(self, pod: dict[str, Any]) -> PodRunner:
        uid = pod["metadata"]["uid"]
        ip = self.allocate_ip(uid, (pod.get("status") or {}).get("podIP"))
        previous = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}
        runner = PodRunner(pod=pod, dir=self.data_dir / "pods" / uid, ip=ip)
        for spec in pod["spec"]["containers"]:
            record = ContainerRecord(name=spec["name"], image=spec.get("image", ""))
            prev = previous.get(spec["name"])
            if prev:  # a restarted agent: the container ran before
                record.restart_count = int(prev.get("restartCount", 0)) + 1
                record.last_state = {"terminated": {"exitCode": 137, "reason": "Error"}}
            c = Container(spec=spec, record=record)
            if spec.get("readinessProbe"):
                c.readiness = Probe(spec["readinessProbe"])
            if spec.get("livenessProbe"):
                c.liveness = Probe(spec["livenessProbe"])
            runner.containers.append(c)
        self.pods[uid] = runner
        log.info("node %s: admitted pod %s as %s", self.name, runner.key, ip)
        return runner

    def _forget(self, runner: PodRunner) -> None:
        shutil.rmtree(runner.dir, ignore_errors=True)
        self.release_ip(runner.pod["metadata"]["uid"])

    def _terminate(self, runner: PodRunner) -> None:
        meta = runner.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = runner.pod["spec"].get("terminationGracePeriodSeconds", 30)
        for c in runner.containers:
            if c.process is not None and c.process.exit_code() is None:
                c.process.stop(float(grace))
        if runner.alive():
            return
        self._observe_exits(runner)
        self._report(runner)
        self.core.delete_namespaced_pod(
            meta["name"], meta["namespace"], grace_period_seconds=0,
            body=client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])),
        )  # fmt: skip
        log.info("node %s: pod %s terminated and deleted", self.name, runner.key)
        self.pods.pop(meta["uid"], None)
        self._forget(runner)

    def _observe_exits(self, runner: PodRunner) -> None:
        policy = runner.pod["spec"].get("restartPolicy", "Always")
        for c in runner.containers:
            if c.process is None:
                continue
            code = c.process.exit_code()
            if code is None:
                continue
            r = c.record
            r.state, r.exit_code, r.finished_at, r.ready = "terminated", code, now(), False
            c.process = None
            c.probe_ready = False
            if will_restart(policy, code) and not runner.pod["metadata"].get("deletionTimestamp"):
                r.last_state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                               "startedAt": r.started_at, "finishedAt": r.finished_at}}  # fmt: skip
                r.state, r.reason = "waiting", "CrashLoopBackOff"
                c.start_after = time.monotonic() + self.timings.backoff(r.restart_count)

    def _step(self, runner: PodRunner, attached: set[str]) -> None:
        self._observe_exits(runner)
        if runner.volume_sources is None:
            runner.volume_sources = self._prepare_volumes(runner, attached)
        if runner.volume_sources is not None:
            for c in runner.containers:
                if (
                    c.process is None
                    and c.record.state == "waiting"
                    and time.monotonic() >= c.start_after
                ):
                    self._start(runner, c)
        for c in runner.containers:
            self._probe(runner, c)
        self._report(runner)

    # ------------------------------------------------------------------ volumes
    def _lookup(self, namespace: str) -> Callable[[str, str, str], Any]:
        def lookup(kind: str, name: str, key: str) -> Any:
            try:
                if kind == "secret":
                    data = {k: base64.b64decode(v).decode() for k, v in
                            (self.core.read_namespaced_secret(name, namespace).data or {}).items()}  # fmt: skip
                else:
                    data = dict(self.core.read_namespaced_config_map(name, namespace).data or {})
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return data if key == "" else data.get(key)

        return lookup

    def _prepare_volumes(self, runner: PodRunner, attached: set[str]) -> dict[str, Path] | None:
        """Each volume's host directory, or None while a PVC is not attached here yet."""
        pod = runner.pod
        ns = pod["metadata"]["namespace"]
        lookup = self._lookup(ns)
        sources: dict[str, Path] = {}
        pvc_volumes = []
        for vol in pod["spec"].get("volumes") or []:
            name = vol["name"]
            target = runner.dir / "volumes" / name
            if "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]["claimName"]
                pvc = as_json(
                    self.core.read_namespaced_persistent_volume_claim(
                        claim, ns, _preload_content=False
                    )
                )
                pv_name = pvc["spec"].get("volumeName")
                if not pv_name:
                    self._waiting(runner, f"claim {claim} not bound")
                    return None
                pv = as_json(self.core.read_persistent_volume(pv_name, _preload_content=False))
                csi = pv["spec"].get("csi") or {}
                if csi.get("driver") != DRIVER:
                    raise ConfigError(f"volume {pv_name} is not from {DRIVER}")
                unique = unique_volume_name(csi["volumeHandle"])
                pvc_volumes.append(unique)
                runner.pvc_volumes = pvc_volumes
                if unique not in attached:
                    self._waiting(runner, f"volume {pv_name} not attached to {self.name}")
                    return None
                sources[name] = self.pool / csi["volumeHandle"]
                continue
            if "hostPath" in vol:
                sources[name] = Path(vol["hostPath"]["path"])
                continue
            target.mkdir(parents=True, exist_ok=True)
            sources[name] = target
            if "emptyDir" in vol:
                continue
            files: dict[str, str] = {}
            if "configMap" in vol or "secret" in vol:
                kind, ref = (
                    ("configmap", vol["configMap"])
                    if "configMap" in vol
                    else ("secret", vol["secret"])
                )
                files.update(
                    self._items(lookup, kind, ref.get("name") or ref.get("secretName"), ref)
                )
            elif "projected" in vol:
                for src in vol["projected"].get("sources") or []:
                    if "serviceAccountToken" in src:
                        files[src["serviceAccountToken"]["path"]] = self._token(
                            pod, src["serviceAccountToken"]
                        )
                    elif "configMap" in src:
                        files.update(
                            self._items(
                                lookup, "configmap", src["configMap"]["name"], src["configMap"]
                            )
                        )
                    elif "secret" in src:
                        files.update(
                            self._items(lookup, "secret", src["secret"]["name"], src["secret"])
                        )
                    elif "downwardAPI" in src:
                        files.update(self._downward(pod, src["downwardAPI"]))
            elif "downwardAPI" in vol:
                files.update(self._downward(pod, vol["downwardAPI"]))
            for rel, content in files.items():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                (target / rel).write_text(content)
        runner.pvc_volumes = pvc_volumes
        if self.containers:
            self._own_volumes(pod, sources)
        return sources

    def _own_volumes(self, pod: Mapping[str, Any], sources: Mapping[str, Path]) -> None:
        """What the kubelet does to a pod's volumes before its containers start: emptyDirs
        are mode 1777; with `fsGroup` every writable volume is given that group,
        group-writable with setgid directories (fsGroupChangePolicy OnRootMismatch: only
        when the volume's root does not have that group yet). Host paths are left alone."""
        fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
        for vol in pod["spec"].get("volumes") or []:
            if "hostPath" in vol:
                continue
            root = sources[vol["name"]]
            if "emptyDir" in vol:
                root.chmod(0o1777)
            if fs_group is None or root.stat().st_gid == int(fs_group):
                continue
            for path in [root, *root.rglob("*")]:
                if path.is_symlink():
                    continue
                os.chown(path, -1, int(fs_group))
                mode = path.stat().st_mode
                extra = 0o2070 if path.is_dir() else (0o060 | (0o010 if mode & 0o100 else 0))
                path.chmod((mode & 0o7777) | extra)

    def _waiting(self, runner: PodRunner, why: str) -> None:
        for c in runner.containers:
            c.record.reason, c.record.message = "ContainerCreating", why

    def _items(
        self, lookup: Callable[[str, str, str], Any], kind: str, name: str, ref: Mapping[str, Any]
    ) -> dict[str, str]:
        data = lookup(kind, name, "")
        if data is None:
            if ref.get("optional"):
                return {}
            raise ConfigError(f"{kind} {name} not found")
        items = ref.get("items")
        if not items:
            return dict(data)
        return {i["path"]: data[i["key"]] for i in items if i["key"] in data}

    def _downward(self, pod: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, str]:
        from .runtime import field_value

        return {
            i["path"]: field_value(pod, i["fieldRef"]["fieldPath"])
            for i in spec.get("items") or []
            if "fieldRef" in i
        }

    def _token(self, pod: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
        meta = pod["metadata"]
        body: dict[str, Any] = {
            "spec": {
                "expirationSeconds": spec.get("expirationSeconds", 3607),
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
                **({"audiences": [spec["audience"]]} if spec.get("audience") else {}),
            }
        }
        sa = pod["spec"].get("serviceAccountName", "default")
        result = as_json(
            self.core.create_namespaced_service_account_token(
                sa,
                meta["namespace"],
                body,  # type: ignore[arg-type]
                _preload_content=False,
            )
        )
        return str(result["status"]["token"])

    # ------------------------------------------------------------------ containers
    def _start(self, runner: PodRunner, c: Container) -> None:
        pod = json.loads(json.dumps(runner.pod))
        pod.setdefault("status", {})["podIP"], pod["status"]["hostIP"] = runner.ip, self.host_ip
        spec = c.spec
        if self.containers and is_project_image(spec.get("image", "")):
            self._start_container(runner, c, pod)
            return
        base = base_env(is_project_image(spec.get("image", "")))
        base.update({"HOSTNAME": pod["metadata"]["name"], "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                     "KUBERNETES_SERVICE_PORT": str(self.proxy_port),
                     "KUBERNETES_SERVICE_PORT_HTTPS": str(self.proxy_port)})  # fmt: skip
        env = resolve_env(spec, pod, self._lookup(pod["metadata"]["namespace"]), base)
        argv = container_argv(spec, env)
        assert runner.volume_sources is not None
        runner.dir.mkdir(parents=True, exist_ok=True)
        plan = {
            "mounts": mount_plan(spec, runner.volume_sources),
            "stage": str(runner.dir / "stage" / spec["name"]),
            "cwd": spec.get("workingDir") or str(runner.dir),
            # The "image's" own files stay visible whatever the pod mounts over them
            # (an emptyDir at /tmp must not hide a checkout that lives under /tmp).
            "keep": sorted({str(REPO_ROOT), sys.prefix}),
            "argv": argv,
            "env": env,
        }
        plan_path = runner.dir / f"{spec['name']}.plan.json"
        plan_path.write_text(json.dumps(plan))
        log_path = self.log_path(
            pod["metadata"]["namespace"], pod["metadata"]["name"], spec["name"]
        )
        if c.runs:
            c.record.restart_count += 1
        c.runs += 1
        c.process = ContainerProcess(plan_path, log_path)
        self._running(c)
        log.info(
            "node %s: started %s/%s pid %d", self.name, runner.key, spec["name"], c.process.pid
        )

    def _start_container(self, runner: PodRunner, c: Container, pod: dict[str, Any]) -> None:
        """Start the container from its image with podman (runtime.podman_run_argv)."""
        spec = c.spec
        image = str(spec.get("image", ""))
        if not image_exists(image):
            raise ConfigError(
                f"image {image} is not in the local store (never pulled; run make setup-image)",
                reason="ErrImageNeverPull",
            )
        base = {"HOSTNAME": pod["metadata"]["name"], "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.proxy_port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(self.proxy_port)}  # fmt: skip
        env = resolve_env(spec, pod, self._lookup(pod["metadata"]["namespace"]), base)
        assert runner.volume_sources is not None
        if c.runs:
            c.record.restart_count += 1
        c.runs += 1
        name = f"{self.cluster_id}-{pod['metadata']['uid'][:8]}-{spec['name']}-{c.runs}"
        mounts = mount_plan(spec, runner.volume_sources)
        argv = podman_run_argv(name, self.cluster_id, pod, spec, env, mounts)
        log_path = self.log_path(
            pod["metadata"]["namespace"], pod["metadata"]["name"], spec["name"]
        )
        c.process = PodmanContainer(name, argv, podman_env(), log_path)
        self._running(c)
        c.record.container_id, c.record.image_id = f"podman://{name}", image_id(image)
        log.info(
            "node %s: started %s/%s in container %s", self.name, runner.key, spec["name"], name
        )

    def _running(self, c: Container) -> None:
        c.started_mono = time.monotonic()
        r = c.record
        r.state, r.started_at, r.exit_code, r.reason, r.message = "running", now(), None, "", ""
        r.ready = c.readiness is None
        for p in (c.readiness, c.liveness):
            if p is not None:
                p.next_at, p.successes, p.failures = 0.0, 0, 0

    def _probe(self, runner: PodRunner, c: Container) -> None:
        if c.process is None or c.process.exit_code() is not None:
            return
        for probe, kind in ((c.readiness, "readiness"), (c.liveness, "liveness")):
            if probe is None or not probe.due(c.started_mono):
                continue
            ok = self._check(runner, c, probe.spec)
            probe.next_at = time.monotonic() + probe.spec.get("periodSeconds", 10)
            if ok:
                probe.successes, probe.failures = probe.successes + 1, 0
            else:
                probe.successes, probe.failures = 0, probe.failures + 1
            if kind == "readiness":
                if ok and probe.successes >= probe.spec.get("successThreshold", 1):
                    c.record.ready = True
                elif not ok and probe.failures >= probe.spec.get("failureThreshold", 3):
                    c.record.ready = False
            elif not ok and probe.failures >= probe.spec.get("failureThreshold", 3):
                log.info(
                    "node %s: %s/%s failed its liveness probe",
                    self.name,
                    runner.key,
                    c.spec["name"],
                )
                c.process.stop(float(runner.pod["spec"].get("terminationGracePeriodSeconds", 30)))

    def _check(self, runner: PodRunner, c: Container, spec: Mapping[str, Any]) -> bool:
        timeout = float(spec.get("timeoutSeconds", 1))
        try:
            if "httpGet" in spec:
                h = spec["httpGet"]
                url = (f"{h.get('scheme', 'HTTP').lower()}://{h.get('host') or runner.ip}:"
                       f"{probe_port(h['port'], c.spec)}{h.get('path', '/')}")  # fmt: skip
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    return 200 <= int(resp.status) < 400
            if "tcpSocket" in spec:
                t = spec["tcpSocket"]
                with socket.create_connection(
                    (t.get("host") or runner.ip, probe_port(t["port"], c.spec)), timeout=timeout
                ):
                    return True
            if "exec" in spec and c.process is not None:
                import subprocess

                command = list(spec["exec"]["command"])
                if isinstance(c.process, PodmanContainer):
                    argv, env = ["podman", "exec", c.process.name, *command], c.process.env
                else:
                    argv, env = (
                        ["nsenter", f"--target={c.process.pid}", "--mount", "--", *command],
                        None,
                    )
                done = subprocess.run(
                    argv, env=env, capture_output=True, timeout=timeout, check=False
                )
                return done.returncode == 0
        except (OSError, urllib.error.URLError, ValueError, TimeoutError, ConfigError):
            return False
        except Exception:
            return False
        return False

    def _report(self, runner: PodRunner) -> None:
        pod = runner.pod
        records = [c.record for c in runner.containers]
        phase = pod_phase(pod["spec"].get("restartPolicy", "Always"), records)
        status: dict[str, Any] = {
            "phase": phase,
            "podIP": runner.ip,
            "podIPs": [{"ip": runner.ip}],
            "hostIP": self.host_ip,
            "hostIPs": [{"ip": self.host_ip}],
            "startTime": runner.start_time,
            "containerStatuses": [r.to_status() for r in records],
        }
        comparable = json.dumps(status, sort_keys=True)
        old = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
        conditions = pod_conditions(phase, records, now())
        # As the kubelet's status manager: report again when the API's pod differs from
        # what this node knows, not only when this node's view changed -- the node
        # lifecycle controller marks the pods of a node it saw NotReady `Ready=False`,
        # and only the node sets them back once it heartbeats again.
        drifted = any(
            (old.get(cond["type"]) or {}).get("status") != cond["status"] for cond in conditions
        )
        if (
            not drifted
            and runner.last_status is not None
            and runner.last_status.get("_key") == comparable
        ):
            return
        for cond in conditions:  # keep transition times of unchanged conditions
            prev = old.get(cond["type"])
            if prev and prev.get("status") == cond["status"] and prev.get("lastTransitionTime"):
                cond["lastTransitionTime"] = prev["lastTransitionTime"]
        status["conditions"] = conditions
        meta = pod["metadata"]
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})
        runner.last_status = {"_key": comparable}
