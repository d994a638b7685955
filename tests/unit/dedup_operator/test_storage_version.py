"""The storage-version migration's decisions (dedup_operator.storage_version), and its
shell run against a record of calls (the real API server runs it in
tests/integration/test_upgrade.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dedup_contract import names
from dedup_operator import storage_version
from dedup_operator.storage_version import Done, Prune, Rewrite, next_step


def pipeline(name: str, stored: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "analytics", "name": name}
    if stored is not None:
        meta["annotations"] = {names.ANNOTATION_STORED_VERSION: stored}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T12:00:00Z"
    return {"metadata": meta}


def test_nothing_to_do_once_only_the_storage_version_is_stored() -> None:
    step = next_step(["v1beta1"], [pipeline("a")], cluster_wide=True)
    assert isinstance(step, Done)


def test_pipelines_not_rewritten_are_rewritten_first() -> None:
    step = next_step(
        ["v1alpha1", "v1beta1"],
        [pipeline("b"), pipeline("a", stored="v1beta1"), pipeline("c", deleting=True)],
        cluster_wide=True,
    )
    assert step == Rewrite((("analytics", "b"),))


def test_then_the_stored_versions_are_pruned_by_a_cluster_wide_operator_only() -> None:
    done = [pipeline("a", stored="v1beta1")]
    assert next_step(["v1alpha1", "v1beta1"], done, cluster_wide=True) == Prune(("v1beta1",))
    namespaced = next_step(["v1alpha1", "v1beta1"], done, cluster_wide=False)
    assert isinstance(namespaced, Done) and "every namespace" in namespaced.why


class Calls:
    """Records the migration's calls; the API server's answers as a dict."""

    def __init__(self, stored: list[str], pipelines: list[dict[str, Any]]) -> None:
        self.stored = stored
        self.items = pipelines
        self.calls: list[tuple[str, ...]] = []

    def stored_versions(self) -> list[str]:
        return list(self.stored)

    def pipelines(self, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        return self.items

    def mark_stored_version(self, namespace: str, name: str, version: str) -> None:
        self.calls.append(("mark", namespace, name, version))
        for body in self.items:
            if body["metadata"]["name"] == name:
                body["metadata"]["annotations"] = {names.ANNOTATION_STORED_VERSION: version}

    def set_stored_versions(self, versions: Sequence[str]) -> None:
        self.calls.append(("prune", *versions))
        self.stored = list(versions)


def test_the_migration_rewrites_then_prunes_then_is_done() -> None:
    calls = Calls(["v1alpha1", "v1beta1"], [pipeline("a"), pipeline("b", stored="v1beta1")])
    done = storage_version.migrate(calls, [])
    assert calls.calls == [("mark", "analytics", "a", "v1beta1"), ("prune", "v1beta1")]
    assert done.why != storage_version.UNFINISHED
    calls.calls.clear()
    storage_version.migrate(calls, [])
    assert calls.calls == [], "once done, a restart writes nothing"
