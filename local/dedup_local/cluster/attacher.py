"""The storage side: a CSIDriver with `attachRequired: true`, the StorageClass the pool
provisions, the provisioner (PVC -> PV with a CSI source, pre-bound to the claim) and the
external-attacher's role (VolumeAttachment -> attached, only while the volume is attached
nowhere else: ReadWriteOnce). A volume is a directory in the pool: it outlives nodes.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dedup_contract.timefmt import format_time

DRIVER = "local.dedup.dev"
STORAGE_CLASS = "dedup-local"
FINALIZER = f"external-attacher/{DRIVER.replace('/', '-')}"
log = logging.getLogger(__name__)
# Every request of the attacher's one thread is bounded: a connection left half-open by
# an API server restart must not stall provisioning and attaching for the rest of the run.
TIMEOUT = (5.0, 30.0)


def now() -> str:
    return format_time(datetime.now(UTC))


def unique_volume_name(handle: str) -> str:
    """The name the attach/detach controller writes into node.status.volumesAttached."""
    return f"kubernetes.io/csi/{DRIVER}^{handle}"


def attach_decision(va: Mapping[str, Any], all_vas: Sequence[Mapping[str, Any]]) -> str | None:
    """None when `va` may be marked attached, else the node that still holds the volume."""
    pv = va["spec"]["source"].get("persistentVolumeName")
    for other in all_vas:
        if other["metadata"]["name"] == va["metadata"]["name"]:
            continue
        if other["spec"]["source"].get("persistentVolumeName") != pv:
            continue
        if (other.get("status") or {}).get("attached"):
            return str(other["spec"]["nodeName"])
    return None


def as_json(response: Any) -> dict[str, Any]:
    return json.loads(response.data)  # type: ignore[no-any-return]


class Attacher:
    """One thread for the whole cluster (the external provisioner + attacher)."""

    def __init__(self, api: ApiClient, pool: Path, poll_s: float) -> None:
        self.api, self.pool, self.poll_s = api, pool, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="attacher", daemon=True)

    def install_driver(self) -> None:
        """The CSIDriver (attachRequired: the attach/detach controller attaches its
        volumes through VolumeAttachments)."""
        client.StorageV1Api(self.api).create_csi_driver(
            {  # type: ignore[arg-type]
                "metadata": {"name": DRIVER},
                "spec": {"attachRequired": True, "podInfoOnMount": False},
            }
        )

    def install(self) -> None:
        self.install_driver()
        client.StorageV1Api(self.api).create_storage_class(
            {  # type: ignore[arg-type]
                "metadata": {"name": STORAGE_CLASS},
                "provisioner": DRIVER,
                "reclaimPolicy": "Delete",
                "volumeBindingMode": "Immediate",
            }
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.provision()
                self.attach()
            except Exception:  # the API may be restarting; try again next round
                log.exception("attacher pass failed")

    # ------------------------------------------------------------------ provisioner
    def provision(self) -> None:
        core = client.CoreV1Api(self.api)
        claims = as_json(
            core.list_persistent_volume_claim_for_all_namespaces(
                _preload_content=False, _request_timeout=TIMEOUT
            )
        )
        for pvc in claims["items"]:
            spec, meta = pvc["spec"], pvc["metadata"]
            if spec.get("storageClassName") != STORAGE_CLASS or spec.get("volumeName"):
                continue
            try:
                self._provision_one(core, pvc)
            except Exception:  # one claim's failure must not hold up every other claim
                log.exception("provisioning %s/%s failed", meta["namespace"], meta["name"])
        self._reclaim(core)

    def _provision_one(self, core: client.CoreV1Api, pvc: dict[str, Any]) -> None:
        spec, meta = pvc["spec"], pvc["metadata"]
        handle = f"pvc-{meta['uid']}"
        (self.pool / handle).mkdir(parents=True, exist_ok=True)
        pv = {
            "metadata": {
                "name": handle,
                "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER},
            },
            "spec": {
                "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": STORAGE_CLASS,
                "volumeMode": spec.get("volumeMode", "Filesystem"),
                "claimRef": {
                    "kind": "PersistentVolumeClaim",
                    "apiVersion": "v1",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
                "csi": {"driver": DRIVER, "volumeHandle": handle},
            },
        }
        try:
            core.create_persistent_volume(pv, _request_timeout=TIMEOUT)  # type: ignore[arg-type]
            log.info("provisioned %s for %s/%s", handle, meta["namespace"], meta["name"])
        except ApiException as exc:
            if exc.status != 409:
                raise

    def _reclaim(self, core: client.CoreV1Api) -> None:
        """reclaimPolicy Delete: a released volume of ours goes, with its directory."""
        volumes = as_json(
            core.list_persistent_volume(_preload_content=False, _request_timeout=TIMEOUT)
        )
        for pv in volumes["items"]:
            csi = pv["spec"].get("csi") or {}
            released = (pv.get("status") or {}).get("phase") == "Released"
            if (
                csi.get("driver") == DRIVER
                and released
                and pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete"
            ):
                shutil.rmtree(self.pool / csi["volumeHandle"], ignore_errors=True)
                try:
                    core.delete_persistent_volume(pv["metadata"]["name"], _request_timeout=TIMEOUT)
                except ApiException as exc:
                    if exc.status != 404:
                        raise

    # ------------------------------------------------------------------ attacher
    def attach(self, listed: list[dict[str, Any]] | None = None) -> None:
        """One round over the VolumeAttachments: `listed` (as a watch holds them), else
        as listed now."""
        storage = client.StorageV1Api(self.api)
        if listed is None:
            listed = as_json(
                storage.list_volume_attachment(_preload_content=False, _request_timeout=TIMEOUT)
            )["items"]
        vas = [va for va in listed if va["spec"]["attacher"] == DRIVER]
        by_volume: dict[str | None, list[dict[str, Any]]] = {}  # a round is not O(n^2)
        for va in vas:
            by_volume.setdefault(va["spec"]["source"].get("persistentVolumeName"), []).append(va)
        for va in vas:
            meta, status = va["metadata"], va.get("status") or {}
            finalizers = meta.get("finalizers") or []
            if meta.get("deletionTimestamp"):
                if FINALIZER in finalizers:  # detach: nothing to undo for a directory
                    rest = [f for f in finalizers if f != FINALIZER]
                    storage.patch_volume_attachment(
                        meta["name"],
                        [
                            {
                                "op": "test",
                                "path": "/metadata/resourceVersion",
                                "value": meta["resourceVersion"],
                            },
                            {"op": "replace", "path": "/metadata/finalizers", "value": rest},
                        ],
                        _request_timeout=TIMEOUT,
                    )
                    log.info("detached %s from %s", meta["name"], va["spec"]["nodeName"])
                continue
            if status.get("attached"):
                continue
            holder = attach_decision(
                va, by_volume[va["spec"]["source"].get("persistentVolumeName")]
            )
            if holder is not None:
                message = f"volume is attached to node {holder} (ReadWriteOnce)"
                if (status.get("attachError") or {}).get("message") != message:
                    storage.patch_volume_attachment_status(
                        meta["name"],
                        {
                            "status": {
                                "attached": False,
                                "attachError": {"message": message, "time": now()},
                            }
                        },
                        _request_timeout=TIMEOUT,
                    )
                continue
            if FINALIZER not in finalizers:
                storage.patch_volume_attachment(
                    meta["name"],
                    {"metadata": {"finalizers": [*finalizers, FINALIZER]}},
                    _request_timeout=TIMEOUT,
                )
            storage.patch_volume_attachment_status(
                meta["name"],
                {"status": {"attached": True, "attachError": None}},
                _request_timeout=TIMEOUT,
            )
            log.info("attached %s to %s", meta["name"], va["spec"]["nodeName"])
