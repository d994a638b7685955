"""The DedupPipelines' storage-version migration: every object moved to the CRD's storage
version (names.STORAGE_VERSION), then the older versions pruned from the CRD's
`status.storedVersions`, so that a later release may stop serving them.

The API server keeps each object at the version it was last written at. A CRD whose
storage version changed (v1alpha1 to v1beta1 in 0.2.0) still lists the old version in
`storedVersions` until someone rewrites every object and prunes the list: the
kube-storage-version-migrator's job, done here by the leader for its own resource. A
rewrite is a real write (the API server skips a patch that changes nothing): the
annotation `dedup.io/stored-version` set to the storage version.

kopf watches one version of a resource, the one its handlers name (names.VERSION,
v1alpha1): with the same schema at both versions and no conversion webhook, the API
server serves every object at either version, whatever it is stored at.

Pure: `next_step` decides from what was read; the shell (`migrate`) reads and writes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dedup_contract import names

log = logging.getLogger("dedup_operator.storage_version")


@dataclass(frozen=True)
class Rewrite:
    """Rewrite these pipelines (namespace, name) at the storage version."""

    pipelines: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Prune:
    """Every pipeline is stored at the storage version: set storedVersions to it alone."""

    stored_versions: tuple[str, ...]


@dataclass(frozen=True)
class Done:
    """Nothing left to do (why, for the log line)."""

    why: str


Step = Rewrite | Prune | Done


def pending(pipelines: Iterable[Mapping[str, Any]], storage: str) -> tuple[tuple[str, str], ...]:
    """The pipelines not yet rewritten at `storage` (those being deleted are left alone:
    they are about to go)."""
    out = []
    for body in pipelines:
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        if (meta.get("annotations") or {}).get(names.ANNOTATION_STORED_VERSION) != storage:
            out.append((str(meta.get("namespace")), str(meta.get("name"))))
    return tuple(sorted(out))


def next_step(
    stored_versions: Sequence[str],
    pipelines: Iterable[Mapping[str, Any]],
    storage: str = names.STORAGE_VERSION,
    *,
    cluster_wide: bool,
) -> Step:
    """What the migration does next, given the CRD's `storedVersions` and the pipelines
    this operator sees (every namespace when `cluster_wide`)."""
    if list(stored_versions) == [storage]:
        return Done(f"every DedupPipeline is stored at {storage}")
    todo = pending(pipelines, storage)
    if todo:
        return Rewrite(todo)
    if not cluster_wide:
        return Done(
            f"the pipelines of the watched namespaces are stored at {storage}; storedVersions "
            "is left to an operator that watches every namespace (or: kubectl patch crd "
            f"{names.CRD_NAME} --subresource status --type merge -p "
            f'\'{{"status":{{"storedVersions":["{storage}"]}}}}\', once every namespace\'s '
            "pipelines carry the annotation " + names.ANNOTATION_STORED_VERSION + ")"
        )
    return Prune((storage,))


class MigrationCalls(Protocol):
    """What the migration reads and writes (dedup_operator.kube.Kube)."""

    def stored_versions(self) -> list[str]: ...

    def pipelines(self, namespaces: Sequence[str]) -> list[dict[str, Any]]: ...

    def mark_stored_version(self, namespace: str, name: str, version: str) -> None: ...

    def set_stored_versions(self, versions: Sequence[str]) -> None: ...


UNFINISHED = "not finished in one go; tried again later"
MAX_STEPS = 4  # a rewrite, a prune, and room for a pipeline created in between


def migrate(
    kube: MigrationCalls, namespaces: Sequence[str], storage: str = names.STORAGE_VERSION
) -> Done:
    """Run the migration to its end (by the leader: the writes check it). Raises what the
    API server answers (the caller retries later)."""
    cluster_wide = not namespaces
    for _ in range(MAX_STEPS):
        pipelines = kube.pipelines(namespaces)
        step = next_step(kube.stored_versions(), pipelines, storage, cluster_wide=cluster_wide)
        if isinstance(step, Done):
            return step
        if isinstance(step, Rewrite):
            for namespace, name in step.pipelines:
                kube.mark_stored_version(namespace, name, storage)
            log.info(
                "rewrote %d DedupPipeline(s) at the storage version %s",
                len(step.pipelines),
                storage,
                extra={"pipelines": ",".join(f"{ns}/{n}" for ns, n in step.pipelines)},
            )
            continue
        kube.set_stored_versions(step.stored_versions)
        log.info(
            "pruned the DedupPipeline CRD's storedVersions to %s",
            ",".join(step.stored_versions),
        )
    return Done(UNFINISHED)
