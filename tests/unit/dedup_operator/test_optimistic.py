"""Optimistic concurrency in the operator: writes to the pipeline carry the resourceVersion
the pass read (409 -> Conflict, nothing overwritten), every mutating call inside
`Kube.acting` re-checks leadership first (NotLeader), and a pass that meets either is
abandoned, to be re-read and re-decided by the next one. Fake API objects: no server."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_operator import operator_metrics
from dedup_operator import reconcile as reconcile_module
from dedup_operator.kube import Conflict, Kube, NotLeader
from dedup_operator.memory import LeaseWatch, PipelineMemory
from dedup_operator.reconcile import reconcile
from dedup_operator.settings import ReconcileSettings


class FakeCustom:
    def __init__(self, version: str = "7") -> None:
        self.version = version
        self.patches: list[dict[str, Any]] = []
        self.refuse: int | None = None

    def get_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        return {
            "metadata": {
                "name": "events",
                "namespace": "ns",
                "uid": "u1",
                "resourceVersion": self.version,
            },
            "spec": {},
        }

    def _patch(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.refuse is not None:
            raise ApiException(status=self.refuse, reason="Conflict")
        self.patches.append(body)
        self.version = str(int(self.version) + 1)
        return {"metadata": {"resourceVersion": self.version}}

    def patch_namespaced_custom_object_status(self, *args: Any, **kw: Any) -> dict[str, Any]:
        return self._patch(args[5])

    def patch_namespaced_custom_object(self, *args: Any, **kw: Any) -> dict[str, Any]:
        return self._patch(args[5])


def fake_kube() -> tuple[Kube, FakeCustom]:
    kube = Kube(client.ApiClient())
    custom = FakeCustom()
    kube.custom = custom  # type: ignore[assignment]
    return kube, custom


def test_status_write_carries_the_version_and_a_409_is_a_conflict() -> None:
    kube, custom = fake_kube()
    assert kube.patch_status("ns", "events", {"phase": "Running"}, resource_version="7") == "8"
    assert custom.patches[-1] == {
        "status": {"phase": "Running"},
        "metadata": {"resourceVersion": "7"},
    }
    custom.refuse = 409
    with pytest.raises(Conflict, match="changed since this pass read it"):
        kube.patch_status("ns", "events", {"phase": "Failed"}, resource_version="7")
    # without a version (no pass to compare with) a 409 is the API's error, as before
    with pytest.raises(ApiException):
        kube.patch_status("ns", "events", {"phase": "Failed"})


def test_finalizer_write_on_a_changed_pipeline_is_a_conflict_and_writes_nothing() -> None:
    kube, custom = fake_kube()
    with pytest.raises(Conflict):
        kube.set_finalizer("ns", "events", "dedup.io/x", present=True, resource_version="6")
    assert custom.patches == []
    assert kube.set_finalizer("ns", "events", "dedup.io/x", present=True, resource_version="7")
    assert custom.patches == [{"metadata": {"resourceVersion": "7", "finalizers": ["dedup.io/x"]}}]
    custom.refuse = 409  # changed between our read and our write
    with pytest.raises(Conflict):
        kube.set_finalizer("ns", "events", "dedup.io/y", present=True, resource_version="8")


def test_every_mutating_call_rechecks_leadership_in_the_acting_thread_only() -> None:
    kube, custom = fake_kube()
    leading = [True]
    with kube.acting(lambda: leading[0]):
        kube.patch_status("ns", "events", {"phase": "Running"})
        leading[0] = False  # the Lease ran out on our monotonic clock, mid-pass
        with pytest.raises(NotLeader, match="write status"):
            kube.patch_status("ns", "events", {"phase": "Failed"})
        with pytest.raises(NotLeader, match="delete pod events-p0-e1"):
            kube.delete_pod("ns", "events-p0-e1", force=True)
        with pytest.raises(NotLeader, match="post Event FailoverCompleted"):
            kube.event(
                {"metadata": {"name": "events", "namespace": "ns", "uid": "u"}},
                "Normal",
                "FailoverCompleted",
                "done",
            )
        other: list[str] = []
        thread = threading.Thread(
            target=lambda: other.append(kube.patch_status("ns", "events", {"x": 1}))
        )
        thread.start()
        thread.join()
        assert other, "another thread (not in a pass) is not guarded"
    kube.patch_status("ns", "events", {"phase": "Running"})  # outside the block: no check
    assert len(custom.patches) == 3


@pytest.mark.parametrize(
    ("raised", "result"),
    [(Conflict("changed"), "conflict"), (NotLeader("no longer the leader"), "not-leader")],
)
def test_a_pass_meeting_a_conflict_or_lost_leadership_is_abandoned(
    monkeypatch: pytest.MonkeyPatch, raised: Exception, result: str
) -> None:
    kube, _ = fake_kube()

    def stale(*args: Any) -> dict[str, Any]:
        raise raised

    monkeypatch.setattr(reconcile_module, "_pass", stale)
    counter = operator_metrics.RECONCILES.labels("ns", "events", result)
    before = counter._value.get()
    outcome = reconcile(
        kube,
        "ns",
        "events",
        lambda body: lambda *a: None,
        ReconcileSettings(),
        PipelineMemory(),
        LeaseWatch(),
    )
    assert outcome.result == result and outcome.status is None  # abandoned: nothing written
    assert outcome.pipeline == ("ns", "events")
    assert counter._value.get() == before + 1
