"""Pure parts of the local cluster's volumes: mount plans, path resolution inside a
container root, and the attacher's ReadWriteOnce decision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dedup_local.cluster.agent import mount_plan, probe_port
from dedup_local.cluster.attacher import attach_decision, unique_volume_name
from dedup_local.cluster.launch import resolve_in


def test_mount_plan_binds_each_volume_mount(tmp_path: Path) -> None:
    container = {
        "volumeMounts": [
            {"name": "data", "mountPath": "/var/lib/dedup"},
            {
                "name": "token",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            },
            {"name": "data", "mountPath": "/cfg", "subPath": "conf"},
        ]
    }
    plan = mount_plan(container, {"data": tmp_path / "d", "token": tmp_path / "t"})
    assert plan == [
        {"source": str(tmp_path / "d"), "target": "/var/lib/dedup", "readOnly": False},
        {
            "source": str(tmp_path / "t"),
            "target": "/var/run/secrets/kubernetes.io/serviceaccount",
            "readOnly": True,
        },
        {"source": str(tmp_path / "d" / "conf"), "target": "/cfg", "readOnly": False},
    ]
    assert (tmp_path / "d" / "conf").is_dir()


def test_resolve_in_follows_symlinks_relative_to_the_root(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to("/run")
    (tmp_path / "var" / "up").symlink_to("../run")
    assert resolve_in(tmp_path, "/var/run/secrets/x") == tmp_path / "run" / "secrets" / "x"
    assert resolve_in(tmp_path, "/var/up/a") == tmp_path / "run" / "a"
    assert resolve_in(tmp_path, "/../../etc") == tmp_path / "etc"


def test_named_probe_port() -> None:
    container = {"ports": [{"name": "metrics", "containerPort": 9400}]}
    assert probe_port("metrics", container) == 9400 and probe_port(8080, container) == 8080


def va(name: str, pv: str, node: str, attached: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "attacher": "local.dedup.dev",
            "nodeName": node,
            "source": {"persistentVolumeName": pv},
        },
        "status": {"attached": attached},
    }


def test_attach_only_where_the_volume_is_attached_nowhere_else() -> None:
    new = va("b", "pv1", "node-b", False)
    assert attach_decision(new, [new]) is None
    assert attach_decision(new, [va("a", "pv1", "node-a", True), new]) == "node-a"
    assert attach_decision(new, [va("a", "pv1", "node-a", False), new]) is None
    assert attach_decision(new, [va("c", "pv2", "node-c", True), new]) is None
    assert unique_volume_name("pvc-1") == "kubernetes.io/csi/local.dedup.dev^pvc-1"
