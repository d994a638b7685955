"""Pod bodies of the project's image for the tests on real nodes: each node has the
image imported under its tags (`dedup_local.real_cluster.IMAGE_TAGS`), never pulled."""

from __future__ import annotations

from typing import Any


def image_pod(
    name: str, image: str, command: list[str] | None = None, namespace: str = "default"
) -> dict[str, Any]:
    """A pod of one container `main` running `image` (`command`, or the image's own),
    stopped within a second of its deletion."""
    container: dict[str, Any] = {"name": "main", "image": image, "imagePullPolicy": "Never"}
    if command is not None:
        container["command"] = command
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [container]},
    }
