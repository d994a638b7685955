"""The pipeline's volumes: its volume claims (read from their watch, resized,
released on delete with retainOnDelete), the claim bound to a PersistentVolume, and the
VolumeAttachments of its volumes."""

from __future__ import annotations

from collections.abc import Iterable

from dedup_contract import names
from dedup_operator.kube_calls import KubeCalls, Obj, attached_volume
from dedup_operator.wakeups import pipeline_of


class KubeVolumes(KubeCalls):
    """Volume claims and their attachments."""

    def volume_claims(self, namespace: str, pipeline: str) -> dict[str, Obj]:
        cached = self._pipeline_objects("volumeclaims", namespace, pipeline)
        if cached is not None:
            return cached
        found = self.core.list_namespaced_persistent_volume_claim(
            namespace, label_selector=f"{names.LABEL_PIPELINE}={pipeline}"
        )
        return {o["metadata"]["name"]: o for o in (self._json(pvc) for pvc in found.items)}

    def pipeline_of_volume(self, volume: str | None) -> tuple[str, str] | None:
        """(namespace, pipeline) whose volume claim is bound to PersistentVolume `volume`,
        from the claims' watches; None: no such claim held (not ours, or not in sync)."""
        if not volume:
            return None
        for key, watched in self._watched.items():
            if key.split("@")[0] != "volumeclaims":
                continue
            for claim in (watched.items() or {}).values():
                if (claim.get("spec") or {}).get("volumeName") == volume:
                    return pipeline_of(claim)
        return None

    def volume_attachments(self, volumes: Iterable[str | None]) -> list[Obj]:
        """The VolumeAttachments of these PersistentVolumes, from the watch (held by
        volume: a pass reads its own volumes', not the cluster's thousand)."""
        wanted = {v for v in volumes if v}
        watched = self._watched.get("volumeattachments")
        if watched is not None:
            found: list[Obj] = []
            for volume in wanted:
                held = watched.select(volume)
                if held is None:  # not in sync: listed below
                    break
                found.extend(held.values())
            else:
                return found
        listed = (self._json(va) for va in self.storage.list_volume_attachment().items)
        return [va for va in listed if attached_volume(va) in wanted]

    def release_volume_claims(self, namespace: str, pipeline: str) -> list[str]:
        """Remove the pipeline's owner reference from its PVCs, so deleting the pipeline
        keeps them (retainOnDelete)."""
        kept = []
        for name, pvc in self.volume_claims(namespace, pipeline).items():
            refs = pvc["metadata"].get("ownerReferences") or []
            others = [r for r in refs if r.get("kind") != names.KIND]
            if len(others) != len(refs):
                self.core.patch_namespaced_persistent_volume_claim(
                    name,
                    namespace,
                    [{"op": "replace", "path": "/metadata/ownerReferences", "value": others}],
                )
            kept.append(name)
        return kept

    def resize_volume_claim(self, namespace: str, name: str, size: str) -> None:
        self._may_act(f"resize {name}")
        self.core.patch_namespaced_persistent_volume_claim(
            name, namespace, {"spec": {"resources": {"requests": {"storage": size}}}}
        )
