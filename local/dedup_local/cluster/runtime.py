"""A pod's containers, run as real containers from their image (podman, runc) or as local
processes, and the pure rules a kubelet applies to them: environment resolution
(fieldRef, secretKeyRef, configMapKeyRef, `$(VAR)` expansion), the `podman run` of a
container (`podman_run_argv` says what of the pod spec it applies), the image ->
executable mapping of the process runtime, and pod status from container states.

Which runtime: on a cluster started with `containers=True`, a container whose image is
the project's (repository's last path segment `dedup-operator`) runs in a container from
that image in the project's podman store (`dedup_local.image`; never pulled: an image
not in the store stays waiting with ErrImageNeverPull). Everything else runs as a
process, as on a cluster without containers.

Process runtime: the project's image is this checkout: `command[0]` resolves in the
venv's bin dir (the directory of sys.executable); without a `command` it runs
`dedup-entrypoint` with the pod's `args`. Any other image: `command[0]` resolves on the
host PATH. The base environment is the host's (as an image's ENV would be), minus the
test process's kube settings. securityContext, resources and image pulls are accepted and
ignored there.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..spark import cached_kafka_jars_env

PROJECT_IMAGE = "dedup-operator"
VENV_BIN = Path(sys.executable).parent
HOST_ENV_DROPPED = (
    "KUBECONFIG",
    "DEDUP_KUBECONFIG",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
)

Lookup = Callable[[str, str, str], Any]  # (kind, name, key) -> value; key "" -> all data


class ConfigError(Exception):
    """The pod refers to something missing: its container waits with `reason`
    (CreateContainerConfigError, or ErrImageNeverPull for an image not in the store)."""

    def __init__(self, message: str, reason: str = "CreateContainerConfigError") -> None:
        super().__init__(message)
        self.reason = reason


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names are replaced, undefined ones kept
    verbatim, `$$` is an escaped `$`."""
    out: list[str] = []
    i = 0
    while i < len(value):
        c = value[i]
        if c == "$" and i + 1 < len(value):
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = value.find(")", i + 2)
                if end != -1:
                    name = value[i + 2 : end]
                    out.append(env[name] if name in env else value[i : end + 1])
                    i = end + 1
                    continue
        out.append(c)
        i += 1
    return "".join(out)


def field_value(pod: Mapping[str, Any], path: str) -> str:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((meta.get(source) or {}).get(path[len(prefix) + 2 : -2], ""))
    raise ConfigError(f"unsupported fieldRef {path}")


def resolve_env(
    container: Mapping[str, Any], pod: Mapping[str, Any], lookup: Lookup, base: Mapping[str, str]
) -> dict[str, str]:
    """The container's environment: `base`, then envFrom, then env in order, each value
    expanded against what is defined before it."""
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, ref_key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            ref = source.get(ref_key)
            if ref:
                data: Any = lookup(kind, ref["name"], "")
                if data is None and not ref.get("optional"):
                    raise ConfigError(f"{kind} {ref['name']} not found")
                for k, v in (data or {}).items():
                    env[prefix + k] = v
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        vf = var["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_value(pod, vf["fieldRef"]["fieldPath"])
            continue
        for kind, ref_key in (("secret", "secretKeyRef"), ("configmap", "configMapKeyRef")):
            if ref_key in vf:
                ref = vf[ref_key]
                value = lookup(kind, ref["name"], ref["key"])
                if value is None:
                    if ref.get("optional"):
                        break
                    raise ConfigError(f"{kind} {ref['name']} has no key {ref['key']}")
                env[name] = value
                break
        else:
            if "resourceFieldRef" in vf:
                env[name] = ""
            else:
                raise ConfigError(f"unsupported valueFrom for {name}")
    return env


def is_project_image(image: str) -> bool:
    repository = image.split("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    return last.split(":", 1)[0] == PROJECT_IMAGE


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args, expanded, with command[0] resolved per the image mapping."""
    project = is_project_image(container.get("image", ""))
    command = [expand(a, env) for a in container.get("command") or []]
    args = [expand(a, env) for a in container.get("args") or []]
    if not command:
        if not project:
            raise ConfigError(
                f"image {container.get('image')} has no known entrypoint: set command"
            )
        command = ["dedup-entrypoint"]
    exe = command[0]
    if "/" not in exe:
        search = (
            str(VENV_BIN) + os.pathsep + env.get("PATH", "")
            if project
            else env.get("PATH", os.defpath)
        )
        found = shutil.which(exe, path=search)
        if found is None:
            raise ConfigError(f"executable {exe} not found (image {container.get('image')})")
        exe = found
    return [exe, *command[1:], *args]


def base_env(project_image: bool) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in HOST_ENV_DROPPED and not k.startswith("PYTEST")
    }
    if project_image:
        env["PATH"] = str(VENV_BIN) + os.pathsep + env.get("PATH", os.defpath)
        # what the image's ENV DEDUP_SPARK_JARS names: here the cached jars
        for name, value in cached_kafka_jars_env().items():
            env.setdefault(name, value)
    return env


# ---------------------------------------------------------------------- status (pure)
@dataclass
class ContainerRecord:
    """What the agent knows about one container, as containerStatuses reports it."""

    name: str
    image: str
    restart_count: int = 0
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    ready: bool = False
    last_state: dict[str, Any] = field(default_factory=dict)
    container_id: str = ""  # podman://<name> for a container from its image
    image_id: str = ""

    def to_status(self) -> dict[str, Any]:
        if self.state == "running":
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            state = {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": "Completed" if self.exit_code == 0 else "Error",
                    "startedAt": self.started_at,
                    "finishedAt": self.finished_at,
                }
            }
        else:
            state = {
                "waiting": {
                    "reason": self.reason,
                    **({"message": self.message} if self.message else {}),
                }
            }
        ids = {"containerID": self.container_id} if self.container_id else {}
        return {
            "name": self.name,
            "image": self.image,
            "imageID": self.image_id,
            **ids,
            "ready": self.ready,
            "started": self.state == "running",
            "restartCount": self.restart_count,
            "state": state,
            "lastState": self.last_state,
        }


def will_restart(restart_policy: str, exit_code: int | None) -> bool:
    return restart_policy == "Always" or (restart_policy == "OnFailure" and exit_code != 0)


def pod_phase(restart_policy: str, containers: list[ContainerRecord]) -> str:
    """Pending until every container has started once; Succeeded/Failed when all have
    terminated and none will restart; Running otherwise."""
    if any(c.state == "waiting" and c.restart_count == 0 and not c.last_state for c in containers):
        return "Pending"
    done = [
        c
        for c in containers
        if c.state == "terminated" and not will_restart(restart_policy, c.exit_code)
    ]
    if len(done) == len(containers):
        return "Succeeded" if all(c.exit_code == 0 for c in done) else "Failed"
    return "Running"


def pod_conditions(phase: str, containers: list[ContainerRecord], now: str) -> list[dict[str, Any]]:
    ready = phase == "Running" and all(c.ready for c in containers)
    reason = {"Succeeded": "PodCompleted", "Failed": "PodFailed"}.get(phase, "ContainersNotReady")

    def cond(type_: str, ok: bool) -> dict[str, Any]:
        c: dict[str, Any] = {
            "type": type_,
            "status": "True" if ok else "False",
            "lastTransitionTime": now,
        }
        if not ok:
            c["reason"] = reason
        return c

    return [
        cond("PodScheduled", True),
        cond("Initialized", True),
        cond("ContainersReady", ready),
        cond("Ready", ready),
    ]


# ---------------------------------------------------------------------- processes
def child_setup() -> None:
    """Own process group, SIGKILL when the agent thread that started it goes away."""
    os.setsid()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


class ContainerProcess:
    """One run of a container: `unshare` + the launcher, logging to `log_path`."""

    def __init__(self, plan_path: Path, log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", sys.executable, "-m",
                 "dedup_local.cluster.launch", str(plan_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=child_setup,
            )  # fmt: skip
        self.kill_at: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        code = self.popen.poll()
        if code is not None and code < 0:
            return 128 - code  # killed by signal N -> 128 + N, as a runtime reports it
        return code

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def stop(self, grace: float) -> None:
        """SIGTERM now, SIGKILL once `grace` has passed (see `enforce`)."""
        if self.kill_at is None:
            self.signal(signal.SIGTERM)
            self.kill_at = time.monotonic() + grace
        self.enforce()

    def enforce(self) -> None:
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            self.signal(signal.SIGKILL)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)


class PodmanContainer(ContainerProcess):
    """One run of a container from its image: an attached `podman run` (its exit code is
    the container's; its output goes to the log). Signals go to the container through
    `podman kill`, since signalling the podman client would not reach a container that
    outlives it."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.name, self.env = name, dict(env)
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                ["podman", *argv], env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.kill_at = None

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def signal(self, sig: int) -> None:
        if self.popen.poll() is not None:
            return
        subprocess.run(
            ["podman", "kill", "--signal", str(int(sig)), self.name],
            env=self.env, capture_output=True, check=False, timeout=30,
        )  # fmt: skip

    def kill(self) -> None:
        """The container removed at once (SIGKILL), as when its node dies."""
        subprocess.run(
            ["podman", "rm", "--force", "--time", "0", self.name],
            env=self.env, capture_output=True, check=False, timeout=60,
        )  # fmt: skip
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)


# ---------------------------------------------------------------------- containers (pure)
CONTAINER_LABEL = "dedup-local.cluster"
CONTAINER_PID_LABEL = "dedup-local.pid"  # the process that runs the cluster


def _merged_security(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's securityContext over the pod's (as the kubelet merges them)."""
    merged = dict(pod.get("spec", {}).get("securityContext") or {})
    merged.update(container.get("securityContext") or {})
    return merged


def cpu_limit(quantity: str) -> str:
    """A CPU quantity ("500m", "2") as podman's --cpus value ("0.5", "2")."""
    millis = int(quantity[:-1]) if quantity.endswith("m") else round(float(quantity) * 1000)
    return f"{millis / 1000:g}"


def memory_limit(quantity: str) -> int:
    """A memory quantity ("512Mi", "1G", "1e9", "1000") in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}  # fmt: skip
    for suffix in sorted(units, key=len, reverse=True):
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * units[suffix])
    return int(float(quantity))


def podman_run_argv(
    name: str,
    cluster: str,
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    env: Mapping[str, str],
    mounts: list[dict[str, Any]],
) -> list[str]:
    """`podman run` arguments for one run of a pod's container from its image.

    What is applied: command (as the entrypoint) and args, `$(VAR)`-expanded; env; the
    volumes bind-mounted at their mountPaths (read-only where asked); runAsUser /
    runAsGroup, fsGroup and supplementalGroups as groups; readOnlyRootFilesystem;
    capabilities drop/add; allowPrivilegeEscalation false (no-new-privileges); CPU and
    memory limits; workingDir. The pod shares the host's network (each pod binds its own
    127.x address, as on a real node's pod network) and never pulls (the image must be in
    the local store). Not applied: seccomp profiles (podman's default one is used),
    SELinux and AppArmor options, requests (no scheduler here weighs them), ephemeral
    storage limits, hostname (host UTS namespace).
    """
    security = _merged_security(pod, container)
    argv = ["run", "--rm", "--name", name, "--label", f"{CONTAINER_LABEL}={cluster}",
            "--label", f"{CONTAINER_PID_LABEL}={os.getpid()}",
            "--network", "host", "--pull", "never"]  # fmt: skip
    user = security.get("runAsUser")
    if user is not None:
        group = security.get("runAsGroup")
        argv += ["--user", f"{user}:{group}" if group is not None else str(user)]
    groups = [security["fsGroup"]] if security.get("fsGroup") is not None else []
    groups += list(security.get("supplementalGroups") or [])
    for gid in dict.fromkeys(groups):
        argv += ["--group-add", str(gid)]
    if security.get("readOnlyRootFilesystem"):
        argv += ["--read-only", "--read-only-tmpfs=false"]
    caps = security.get("capabilities") or {}
    for cap in caps.get("drop") or []:
        argv += ["--cap-drop", str(cap).upper()]
    for cap in caps.get("add") or []:
        argv += ["--cap-add", str(cap).upper()]
    if security.get("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    limits = (container.get("resources") or {}).get("limits") or {}
    if limits.get("memory"):
        argv += ["--memory", str(memory_limit(str(limits["memory"])))]
    if limits.get("cpu"):
        argv += ["--cpus", cpu_limit(str(limits["cpu"]))]
    for m in mounts:
        option = f"type=bind,src={m['source']},dst={m['target']}"
        argv += ["--mount", option + (",ro=true" if m["readOnly"] else "")]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    if container.get("workingDir"):
        argv += ["--workdir", str(container["workingDir"])]
    command = [expand(a, env) for a in container.get("command") or []]
    args = [expand(a, env) for a in container.get("args") or []]
    if command:
        argv += ["--entrypoint", json.dumps(command)]
    argv.append(str(container.get("image", "")))
    return argv + args
