"""Pure rules of the local cluster's node agent: env resolution, image mapping, the
`podman run` of a container, pod status."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dedup_local.cluster import runtime
from dedup_local.cluster.runtime import (
    ConfigError,
    ContainerRecord,
    container_argv,
    expand,
    is_project_image,
    pod_conditions,
    pod_phase,
    podman_run_argv,
    resolve_env,
)
from dedup_local.cluster.timings import ClusterTimings

POD: dict[str, Any] = {
    "metadata": {"name": "p-0", "namespace": "ns", "uid": "u1", "labels": {"app": "x"}},
    "spec": {"nodeName": "node-a", "serviceAccountName": "sa"},
    "status": {"podIP": "127.10.0.2"},
}


def lookup(kind: str, name: str, key: str) -> Any:
    data = {("secret", "s"): {"user": "alice"}, ("configmap", "c"): {"mode": "fast", "n": "1"}}
    found = data.get((kind, name))
    return found if key == "" or found is None else found.get(key)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("$(A)-$(B)", "1-two"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("a$b$", "a$b$"),
        ("$(A", "$(A"),
        ("$(cat /x)", "$(cat /x)"),
    ],
)
def test_expand_follows_kubernetes_semantics(value: str, expected: str) -> None:
    assert expand(value, {"A": "1", "B": "two"}) == expected


def test_env_resolves_refs_and_earlier_vars_in_order() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "c"}, "prefix": "C_"}],
        "env": [
            {"name": "LATER_REF", "value": "$(NAME)"},  # NAME not yet defined: kept
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "USER", "valueFrom": {"secretKeyRef": {"name": "s", "key": "user"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "mode"}}},
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}},
            },
            {"name": "CONFIG", "value": "id=$(NAME),user=$(USER),ip=$(IP)"},
        ],
    }
    env = resolve_env(container, POD, lookup, {"PATH": "/bin"})
    assert env["LATER_REF"] == "$(NAME)"
    assert (env["NAME"], env["NS"], env["IP"], env["NODE"], env["APP"]) == (
        "p-0", "ns", "127.10.0.2", "node-a", "x",
    )  # fmt: skip
    assert env["CONFIG"] == "id=p-0,user=alice,ip=127.10.0.2"
    assert env["C_mode"] == "fast" and env["MODE"] == "fast" and "OPT" not in env
    assert env["PATH"] == "/bin"


def test_missing_secret_key_is_a_config_error() -> None:
    container = {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "no"}}}]}
    with pytest.raises(ConfigError, match="no key no"):
        resolve_env(container, POD, lookup, {})


def test_image_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("python", "dedup-entrypoint"):  # a stand-in for the venv's bin dir
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setattr(runtime, "VENV_BIN", tmp_path)
    assert is_project_image("ghcr.io/acme/dedup-operator:0.1.0")
    assert is_project_image("dedup-operator:dev")
    assert is_project_image("dedup-operator@sha256:abc")
    assert not is_project_image("busybox") and not is_project_image("acme/dedup-operator-x:1")
    env = {"PATH": "/usr/bin:/bin", "X": "7"}
    argv = container_argv(
        {"image": "dedup-operator:dev", "command": ["python"], "args": ["$(X)"]}, env
    )
    assert argv == [str(tmp_path / "python"), "7"]
    spark = container_argv({"image": "dedup-operator:dev", "args": ["executor"]}, env)
    assert spark == [str(tmp_path / "dedup-entrypoint"), "executor"]
    assert container_argv({"image": "busybox", "command": ["sh", "-c", "true"]}, env) == [
        shutil.which("sh", path="/usr/bin:/bin"), "-c", "true",
    ]  # fmt: skip
    with pytest.raises(ConfigError):
        container_argv({"image": "busybox", "args": ["x"]}, env)


def rec(
    state: str, code: int | None = None, restarts: int = 0, ready: bool = False
) -> ContainerRecord:
    r = ContainerRecord(name="c", image="i", state=state, exit_code=code, restart_count=restarts)
    r.ready = ready
    return r


@pytest.mark.parametrize(
    ("policy", "records", "phase"),
    [
        ("Always", [rec("waiting")], "Pending"),
        ("Always", [rec("running", ready=True)], "Running"),
        ("Never", [rec("terminated", 0)], "Succeeded"),
        ("Never", [rec("terminated", 3)], "Failed"),
        ("Never", [rec("terminated", 3), rec("running")], "Running"),
        ("OnFailure", [rec("terminated", 0)], "Succeeded"),
        ("OnFailure", [rec("terminated", 1)], "Running"),
        ("Always", [rec("terminated", 0)], "Running"),
        ("Always", [rec("waiting", restarts=2)], "Running"),
    ],
)
def test_pod_phase(policy: str, records: list[ContainerRecord], phase: str) -> None:
    assert pod_phase(policy, records) == phase


def test_pod_conditions() -> None:
    ready = {
        c["type"]: c["status"] for c in pod_conditions("Running", [rec("running", ready=True)], "t")
    }
    assert ready == {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }
    done = pod_conditions("Succeeded", [rec("terminated", 0)], "t")
    assert [c.get("reason") for c in done if c["status"] == "False"] == [
        "PodCompleted",
        "PodCompleted",
    ]


def test_restart_backoff_doubles_up_to_the_cap() -> None:
    production, fast = ClusterTimings(), ClusterTimings.fast()
    assert [production.backoff(n) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]
    assert fast.backoff(0) == 1 and fast.backoff(10) == 10
    args = fast.control_plane_args()
    assert "--node-monitor-grace-period=8s" in args["kube-controller-manager"]
    assert "--default-unreachable-toleration-seconds=10" in args["kube-apiserver"]


def test_a_worker_pod_becomes_a_podman_run_with_its_security_context() -> None:
    from dedup_operator.desired.partition import worker_pod_template
    from dedup_operator.spec import PipelineSpec
    from support.pipelines import WORKER_ON_CLUSTER, pipeline_body

    body = pipeline_body("p", "127.0.0.1:9092", "t", worker=WORKER_ON_CLUSTER)
    spec = PipelineSpec.parse("p", "ns", body["spec"])
    pod = {"metadata": {"name": "p-p0-e1"}, "spec": worker_pod_template(spec, 0)}
    container = pod["spec"]["containers"][0]
    env = {"DEDUP_PARTITION": "0", "A": "b c"}
    mounts = [
        {"source": "/pool/vol-1", "target": "/var/lib/dedup", "readOnly": False},
        {"source": "/pods/u/token", "target": "/var/run/secrets/x", "readOnly": True},
    ]
    argv = podman_run_argv("dl-1-u-worker-1", "dl-1", pod, container, env, mounts)
    joined = " ".join(argv)
    assert argv[:3] == ["run", "--rm", "--name"]
    assert "--network host" in joined and "--pull never" in joined
    assert "--label dedup-local.cluster=dl-1" in joined
    assert "--user 65532:65532" in joined and "--group-add 65532" in joined
    assert "--read-only --read-only-tmpfs=false" in joined
    assert "--cap-drop ALL" in joined and "--security-opt no-new-privileges" in joined
    limits = container["resources"]["limits"]
    assert f"--memory {runtime.memory_limit(limits['memory'])}" in joined
    assert "--mount type=bind,src=/pool/vol-1,dst=/var/lib/dedup " in joined + " "
    assert "--mount type=bind,src=/pods/u/token,dst=/var/run/secrets/x,ro=true" in joined
    assert "--env DEDUP_PARTITION=0 --env A=b c" in joined
    # command replaces the image's entrypoint; the image comes last before args.
    assert argv[argv.index("--entrypoint") + 1] == json.dumps(container["command"])
    assert argv[-1] == container["image"]


def test_args_without_command_keep_the_image_entrypoint() -> None:
    pod = {"metadata": {"name": "x"}, "spec": {"securityContext": {"runAsUser": 5}}}
    container = {"name": "c", "image": "dedup-operator:dev", "args": ["executor", "$(X)"]}
    argv = podman_run_argv("n", "c", pod, container, {"X": "y"}, [])
    assert "--entrypoint" not in argv
    assert argv[-3:] == ["dedup-operator:dev", "executor", "y"]
    assert argv[argv.index("--user") + 1] == "5"
    assert "--read-only" not in argv and "--group-add" not in argv


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("512Mi", 512 * 2**20), ("1Gi", 2**30), ("1G", 10**9), ("1000", 1000), ("1.5Gi", 3 * 2**29)],
)
def test_memory_limits_in_bytes(quantity: str, expected: int) -> None:
    assert runtime.memory_limit(quantity) == expected


@pytest.mark.parametrize(("quantity", "expected"), [("500m", "0.5"), ("2", "2"), ("1500m", "1.5")])
def test_cpu_limits_as_podman_cpus(quantity: str, expected: str) -> None:
    assert runtime.cpu_limit(quantity) == expected
