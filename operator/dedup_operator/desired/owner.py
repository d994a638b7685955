"""The owner reference and metadata of every object a pipeline owns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dedup_contract import names


@dataclass(frozen=True)
class Owner:
    """The DedupPipeline that owns an object (its deletion cascades to it)."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def metadata(
    name: str,
    owner: Owner,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels,
        "ownerReferences": [owner.reference()],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta
