"""What calls for a pass of a pipeline at rest before its resync
(`dedup_operator.wakeups`): the watch events that concern it, and its workers' nodes
falling silent for its nodeLostAfter (timers re-armed by each heartbeat seen)."""

from __future__ import annotations

from typing import Any

from dedup_operator.cache import SYNCED
from dedup_operator.pass_outcome import Rest
from dedup_operator.wakeups import Wakeups, changed_hands, node_judged, pipeline_changed

A = ("ns", "a")
B = ("ns", "b")


def lease(holder: str, transitions: int, renewed: str, pipeline: str = "a") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": f"{pipeline}-p0",
            "labels": {"dedup.io/pipeline": pipeline},
        },
        "spec": {"holderIdentity": holder, "leaseTransitions": transitions, "renewTime": renewed},
    }


def node(name: str, ready: str = "True", beat: str = "t0", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": beat}]},
    }


def pipeline(generation: int, status: str = "", **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "a",
            "generation": generation,
            "annotations": annotations,
        },
        "status": {"phase": status},
    }


def test_a_renewal_is_not_a_change_of_hands_a_new_holder_or_epoch_is() -> None:
    held = lease("w-1", 1, "t1")
    assert not changed_hands(held, lease("w-1", 1, "t2"))
    assert changed_hands(held, lease("w-2", 1, "t2"))
    assert changed_hands(held, lease("w-1", 2, "t2"))
    assert changed_hands(held, None) and changed_hands(None, held)


def test_a_node_changes_for_a_pass_by_ready_taints_or_cordon_not_by_its_status_report() -> None:
    assert node_judged(node("n1", beat="t0")) == node_judged(node("n1", beat="t9"))
    assert node_judged(node("n1")) != node_judged(node("n1", ready="Unknown"))
    tainted = node("n1", taints=[{"key": "k", "effect": "NoExecute"}])
    assert node_judged(node("n1")) != node_judged(tainted)
    assert node_judged(node("n1")) != node_judged(node("n1", unschedulable=True))


def test_a_pipeline_changes_for_a_pass_by_spec_or_metadata_not_by_its_status() -> None:
    assert not pipeline_changed(pipeline(1, "Ready"), pipeline(1, "Degraded"))
    assert pipeline_changed(pipeline(1), pipeline(2))
    assert pipeline_changed(pipeline(1), pipeline(1, **{"dedup.io/switch": "yes"}))


def test_a_node_silent_for_nodelostafter_wakes_the_pipelines_resting_on_it() -> None:
    w = Wakeups()
    w.heartbeat("n1", 0.0)
    w.rested(A, Rest({"n1": 0.0, "n2": None}, 20.0), now=0.0)
    w.heartbeat("n1", 10.0)  # renewed: its timer starts again
    assert w.due(20.0) == set(), "renewed at 10 s: not silent for 20 s yet"
    assert w.due(29.9) == set()
    assert w.due(30.0) == {A}
    assert w.due(31.0) == set(), "told once"
    assert w.next_due() is None


def test_the_silence_a_pass_judged_counts_and_each_pipeline_waits_its_own_lost_after() -> None:
    w = Wakeups()
    w.heartbeat("n1", 0.0)
    w.rested(A, Rest({"n1": 15.0}, 20.0), now=15.0)  # its pass saw n1 silent for 15 s
    w.rested(B, Rest({"n1": 15.0}, 40.0), now=15.0)
    assert w.due(19.9) == set()
    assert w.due(20.0) == {A}, "20 s after the last heartbeat, not 20 s after the pass"
    assert w.due(39.9) == set()
    assert w.due(40.0) == {B}


def test_a_heartbeat_seen_after_the_pass_judged_the_node_counts_from_itself() -> None:
    w = Wakeups()
    w.heartbeat("n1", 0.0)
    w.heartbeat("n1", 10.0)  # renewed while the pass that judged it at 9.9 s was running
    w.rested(A, Rest({"n1": 9.9}, 20.0), now=10.5)
    assert w.due(21.0) == set(), "silent since 10 s, not since 0 s"
    assert w.due(29.9) == set()
    assert w.due(30.0) == {A}, "the next renewal (due at 20 s) never came"


def test_events_wake_the_pipeline_they_concern_and_node_changes_those_resting_there() -> None:
    w = Wakeups()
    w.rested(A, Rest({"n1": 0.0}, 20.0), now=0.0)
    w.busy(B)
    pod = {"metadata": {"namespace": "ns", "name": "a-p0-e1", "labels": {"dedup.io/pipeline": "a"}}}
    assert w.on_event("pods", "MODIFIED", pod, pod) == {A}
    assert w.on_event("volumeclaims", "DELETED", pod, pod) == {A}
    assert w.on_event("leases", "MODIFIED", lease("w", 1, "t1"), lease("w", 1, "t2")) == set()
    assert w.on_event("leases", "MODIFIED", lease("w", 1, "t1"), lease("x", 2, "t2")) == {A}
    assert w.on_event("pipelines", "MODIFIED", pipeline(1), pipeline(1, "Ready")) == set()
    assert w.on_event("pipelines", "MODIFIED", pipeline(1), pipeline(2)) == {A}
    assert w.on_event("nodes", "MODIFIED", node("n1"), node("n1", beat="t9")) == set()
    assert w.on_event("nodes", "MODIFIED", node("n1"), node("n1", ready="Unknown")) == {A}
    assert w.on_event("nodes", "MODIFIED", node("n9"), node("n9", ready="Unknown")) == set()
    va = {"metadata": {"name": "csi-1"}}
    assert w.on_event("volumeattachments", "DELETED", va, va) == {B}, "the busy ones"
    assert w.on_event("volumeattachments", "ADDED", None, va) == set()
    assert w.on_event("pods", SYNCED, None, None) == {A, B}, "listed again: every one"


def test_a_volume_detached_wakes_the_pipeline_claiming_it_or_every_busy_one() -> None:
    claimed = {"pv-a": A}
    w = Wakeups(volume_owner=lambda va: claimed.get(va["spec"]["source"]["persistentVolumeName"]))
    w.busy(A)
    w.busy(B)

    def va(volume: str) -> dict[str, Any]:
        return {"metadata": {"name": "csi-1"}, "spec": {"source": {"persistentVolumeName": volume}}}

    assert w.on_event("volumeattachments", "DELETED", va("pv-a"), va("pv-a")) == {A}
    assert w.on_event("volumeattachments", "DELETED", va("pv-x"), va("pv-x")) == {A, B}, (
        "a volume no claim is known for: every busy pipeline, as one may wait for it"
    )


def test_a_busy_or_forgotten_pipeline_no_longer_rests_on_its_nodes() -> None:
    w = Wakeups()
    w.heartbeat("n1", 0.0)
    w.rested(A, Rest({"n1": 0.0}, 20.0), now=0.0)
    w.busy(A)
    assert w.resting() == 0
    assert w.due(20.0) == set()
    assert w.on_event("nodes", "MODIFIED", node("n1"), node("n1", ready="False")) == set()
    w.forget(A)
    assert w.on_event("volumeattachments", "DELETED", {"metadata": {}}, {"metadata": {}}) == set()
