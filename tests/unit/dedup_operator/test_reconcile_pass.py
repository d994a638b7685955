"""Whole reconcile passes (dedup_operator.reconcile) over STAND-INS for the API server
(`support.fake_kube.FakeKube`) and Kafka's admin calls: the Outcome each returns (its result, the actions
applied, `requeue_after`), that observing writes nothing and the report writes the
status only, the internal topic created before the workers are decided, and a deleted
pipeline finalized. Stand-ins because these assert the order of a pass's calls, which
a real server does not report; the same passes on the real control plane and broker
are tests/integration/test_operator.py, test_operator_ownership.py and
test_operator_api_load.py (which counts a pass's requests in the audit log)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dedup_contract import names
from dedup_contract.lease_clock import LeaseClock
from dedup_contract.timefmt import format_micro_time
from dedup_operator import executor, observe, reconcile
from dedup_operator import memory as memory_mod
from dedup_operator.desired.partition import template_hash
from dedup_operator.memory import LeaseWatch, PipelineMemory
from dedup_operator.observe import PipelineObservation
from dedup_operator.pass_outcome import Outcome
from dedup_operator.settings import ReconcileSettings
from dedup_operator.spec import PipelineSpec
from dedup_operator.topics import HEADER_ROOM, TopicFacts
from support.fake_kube import FakeKube

NS, NAME = "analytics", "events"
SPEC: dict[str, Any] = {
    "kafka": {
        "bootstrapServers": "kafka:9092",
        "inputTopic": "events",
        "outputTopic": "events-deduped",
        "deadLetterTopic": "events-dlq",
    },
    "partitions": 2,
    "messageId": {"source": "jsonField", "field": "messageId"},
    "window": {"duration": "1h"},
    "storage": {"size": "1Gi"},
    "failover": {"leaseDuration": "10s", "nodeLostAfter": "20s"},
}
OUTPUT = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "min.insync.replicas": "1",
}
OWNED = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "message.timestamp.type": "CreateTime",
    "max.message.bytes": str(1048588 + HEADER_ROOM),
    "min.insync.replicas": "1",
    "unclean.leader.election.enable": "false",
}


def topic_facts(owned: bool) -> TopicFacts:
    """The input (2 partitions) and output topics, with or without the internal one."""
    return TopicFacts(
        "events",
        2,
        "events-deduped",
        2,
        OUTPUT,
        output_replication=1,
        input_config={"max.message.bytes": "1048588"},
        owned_topic=names.owned_topic(NS, NAME),
        owned_partitions=2 if owned else None,
        owned_replication=1 if owned else None,
        owned_config=OWNED if owned else {},
    )


def pipeline_body(**meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": NAME,
            "namespace": NS,
            "uid": "uid-1",
            "generation": 1,
            "resourceVersion": "10",
            **meta,
        },
        "spec": copy.deepcopy(SPEC),
    }


def run(
    kube: FakeKube,
    memory: PipelineMemory,
    watch: LeaseWatch | None = None,
    settings: ReconcileSettings | None = None,
) -> Outcome:
    def recorder(body: Mapping[str, Any]) -> executor.Recorder:
        def record(type_: str, reason: str, message: str, error: bool = False) -> None:
            kube.event(body, type_, reason, message)

        return record

    return reconcile.reconcile(
        kube,
        NS,
        NAME,
        recorder,
        settings or ReconcileSettings(),
        memory,
        watch or LeaseWatch(),
    )


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fake Kafka: the input and output topics exist; the internal one once created.
    Returns the topics created."""
    created: list[str] = []
    monkeypatch.setattr(observe, "read_topics", lambda *a, **kw: topic_facts(bool(created)))

    def create(bootstrap: str, settings: Any, topic: Any) -> None:
        created.append(topic.name)

    monkeypatch.setattr(executor, "create_topic", create)
    return created


def write_kinds(kube: FakeKube) -> list[str]:
    return [w[0] for w in kube.writes]


def reasons(kube: FakeKube) -> list[str]:
    return [w[1] for w in kube.writes if w[0] == "event"]


def test_a_new_pipeline_creates_its_internal_topic_then_decides_its_workers_on_it(
    kafka: list[str],
) -> None:
    kube, memory = FakeKube(pipeline_body()), PipelineMemory()
    outcome = run(kube, memory)
    assert kafka == [names.owned_topic(NS, NAME)]
    assert outcome.result == "ok" and outcome.pipeline == (NS, NAME)
    assert outcome.requeue_after == 0.0, "it acted (the Leases): the next pass at once"
    kinds = list(outcome.actions)
    # the finalizer before the topic, the topic before anything of the workers
    assert kinds.index("SetFinalizer") < kinds.index("CreateOwnedTopic")
    first_lease = next(w for w in kube.writes if w[:2] == ("ensure", "Lease"))
    assert kube.writes.index(first_lease) > write_kinds(kube).index("set_finalizer")
    assert ("set_finalizer", names.FINALIZER_OWNED_TOPIC, True, "10") in kube.writes
    assert reasons(kube).count("VolumeCreated") == 2, "each claim told once, not per cycle"
    assert "OwnedTopicCreated" in reasons(kube)
    assert "OwnedTopicMissing" not in reasons(kube), "the workers are decided on the topic"
    assert outcome.status is not None
    topic_ready = [c for c in outcome.status["conditions"] if c["type"] == "TopicReady"]
    assert topic_ready[0]["status"] == "True"
    # the report: the status is the pass's last write, on the version its writes left
    assert kube.writes[-1] == ("patch_status", dict(outcome.status), "11")


def after_the_first_pass(kube: FakeKube, memory: PipelineMemory) -> None:
    """A new pipeline's first pass, and the cluster as it left it: its status and
    finalizer written, its claims and Leases made; the writes forgotten."""
    first = run(kube, memory)
    assert first.status is not None
    kube.body["status"] = dict(first.status)
    kube.body["metadata"]["finalizers"] = [names.FINALIZER_OWNED_TOPIC]
    kube.claims = {names.volume_claim(NAME, p): {"spec": {}} for p in (0, 1)}
    kube.leases_ = {
        names.lease(NAME, p): {"metadata": {"name": names.lease(NAME, p)}} for p in (0, 1)
    }
    kube.writes.clear()


def test_the_next_pass_ensures_nothing_again_and_starts_the_workers(kafka: list[str]) -> None:
    kube, memory = FakeKube(pipeline_body()), PipelineMemory()
    after_the_first_pass(kube, memory)
    second = run(kube, memory)
    assert "EnsureObject" not in second.actions, "objects ensured every ensure_s only"
    assert [w[1] for w in kube.writes if w[0] == "create_pod"] == [
        names.worker_pod(NAME, p, 1) for p in (0, 1)
    ]
    assert reasons(kube).count("WorkerCreated") == 2
    assert second.requeue_after == 0.0
    assert kafka == [names.owned_topic(NS, NAME)], "the topic is remembered, not made again"


def running(kube: FakeKube) -> None:
    """Both workers Running and Ready under the spec, holding fresh Leases."""
    spec = PipelineSpec.parse(NAME, NS, SPEC)
    now = datetime.now(UTC)
    kube.claims = {names.volume_claim(NAME, p): {"spec": {}} for p in (0, 1)}
    kube.pods_ = [
        {
            "metadata": {
                "name": names.worker_pod(NAME, p, 1),
                "uid": f"pod-{p}",
                "annotations": {names.ANNOTATION_SPEC_HASH: template_hash(spec, p)},
            },
            "spec": {"nodeName": "n1"},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for p in (0, 1)
    ]
    kube.leases_ = {
        names.lease(NAME, p): {
            "metadata": {"name": names.lease(NAME, p), "resourceVersion": f"l{p}"},
            "spec": {
                "holderIdentity": names.worker_pod(NAME, p, 1),
                "leaseDurationSeconds": 10,
                "renewTime": format_micro_time(now),
                "leaseTransitions": 1,
            },
        }
        for p in (0, 1)
    }
    kube.nodes_ = [
        {
            "metadata": {"name": "n1"},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "lastTransitionTime": format_micro_time(now - timedelta(hours=1)),
                    }
                ]
            },
        }
    ]


def test_a_steady_pipeline_is_due_at_the_interval_and_writes_nothing_twice(
    kafka: list[str],
) -> None:
    body = pipeline_body(finalizers=[names.FINALIZER_OWNED_TOPIC])
    body["status"] = {"ownership": {"workers": 2, "reshards": 0}}
    kube, memory = FakeKube(body), PipelineMemory()
    kafka.append(names.owned_topic(NS, NAME))  # the internal topic exists
    running(kube)
    first = run(kube, memory)
    assert first.result == "ok" and first.requeue_after is None, first.actions
    assert first.status is not None and first.status["phase"] == "Running"
    assert "PipelineReady" in reasons(kube)
    kube.body["status"] = dict(first.status)
    kube.writes.clear()
    again = run(kube, memory)
    assert again.requeue_after is None
    assert kube.writes == [], "an unchanged status is not written; nothing else to do"


def test_observing_writes_nothing(kafka: list[str]) -> None:
    kube, memory = FakeKube(pipeline_body()), PipelineMemory()
    seen = observe.observe_pipeline(
        kube,
        kube.body,
        memory,
        LeaseWatch(),
        ReconcileSettings(),
    )
    assert isinstance(seen, PipelineObservation)
    assert seen.owned_topic is not None, "the missing internal topic is reported..."
    assert kafka == [] and kube.writes == [], "...not created, and nothing written"
    assert (memory.uid, memory.ensured, memory.topic) == (None, None, None)
    kafka.append("made")  # the internal topic exists: the check read is to be remembered
    seen = observe.observe_pipeline(
        kube,
        kube.body,
        memory,
        LeaseWatch(),
        ReconcileSettings(),
    )
    assert isinstance(seen, PipelineObservation) and seen.topic.ok and seen.topic_read
    assert memory.topic is None, "remembered by the act step, not by looking"


def test_a_conflict_abandons_the_pass_and_keeps_when_its_plan_wanted_the_next(
    kafka: list[str],
) -> None:
    kube, memory = FakeKube(pipeline_body()), PipelineMemory()
    kube.conflict_on = "patch_status"  # the final status write
    outcome = run(kube, memory)
    assert outcome.result == "conflict" and outcome.status is None
    assert outcome.requeue_after == 0.0, "the plan acted: its next step at once"
    assert "CreateOwnedTopic" in outcome.actions


def test_an_invalid_spec_is_told_once_per_generation_and_due_at_the_interval() -> None:
    body = pipeline_body()
    body["spec"]["partitions"] = 0
    kube, memory = FakeKube(body), PipelineMemory()
    outcome = run(kube, memory)
    assert outcome.result == "invalid_spec" and outcome.requeue_after is None
    assert reasons(kube) == ["InvalidSpec"]
    assert outcome.status is not None and outcome.status["phase"] == "Failed"
    assert kube.writes[-1] == ("patch_status", dict(outcome.status), "10")
    kube.body["status"] = dict(outcome.status)
    kube.writes.clear()
    run(kube, memory)
    assert reasons(kube) == [] and write_kinds(kube) == ["patch_status"]


def test_a_deleted_pipeline_lifts_its_taints_and_lets_go(monkeypatch: pytest.MonkeyPatch) -> None:
    body = pipeline_body(deletionTimestamp="2026-01-01T00:00:00Z")
    body["metadata"]["finalizers"] = [names.FINALIZER_TAINTS]
    body["status"] = {"taintedNodes": ["n2"]}
    released: list[tuple[str, str]] = []

    class Releasing(FakeKube):
        def release_out_of_service(self, node: str, owner: str) -> bool:
            released.append((node, owner))
            return True

    kube = Releasing(body)
    outcome = run(kube, PipelineMemory())
    assert outcome.finalized and outcome.requeue_after is None
    assert released == [("n2", f"{NS}/{NAME}")]
    assert reasons(kube) == ["NodeBackInService"]
    assert ("set_finalizer", names.FINALIZER_TAINTS, False, None) in kube.writes


def test_a_deleted_pipeline_keeps_its_topic_while_a_lease_is_held() -> None:
    body = pipeline_body(deletionTimestamp="2026-01-01T00:00:00Z")
    body["metadata"]["finalizers"] = [names.FINALIZER_OWNED_TOPIC]
    kube = FakeKube(body)
    running(kube)
    outcome = run(kube, PipelineMemory())
    assert outcome.result == "finalizing" and not outcome.finalized
    deleted = [w for w in kube.writes if w[0] == "delete_pod"]
    assert deleted == [
        ("delete_pod", names.worker_pod(NAME, p, 1), False, f"pod-{p}") for p in (0, 1)
    ]
    assert not any(w[0] == "set_finalizer" for w in kube.writes), "the finalizer stays"


def test_a_new_pipeline_of_the_same_name_is_met_afresh(kafka: list[str]) -> None:
    kube, memory = FakeKube(pipeline_body()), PipelineMemory()
    run(kube, memory)
    assert memory.ensured is not None and memory.topic is not None
    kube.body = replace_uid(kube.body, "uid-2")
    kube.writes.clear()
    outcome = run(kube, memory)
    assert memory.uid == "uid-2"
    assert "EnsureObject" in outcome.actions, "its objects are ensured again"


def replace_uid(body: Mapping[str, Any], uid: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(body))
    out["metadata"]["uid"] = uid
    return out


def test_a_pipeline_whose_group_an_older_one_holds_starts_no_worker_and_says_why(
    kafka: list[str],
) -> None:
    """Of two pipelines of the same name (so of the same default consumer group) on one
    input topic and Kafka cluster, in two namespaces, the younger starts no worker: its
    TopicReady is False with ConsumerGroupShared, told once as an ERROR line."""
    kube, memory = (
        FakeKube(pipeline_body(creationTimestamp="2026-11-26T10:00:00Z")),
        PipelineMemory(),
    )
    older = pipeline_body(
        namespace="billing", uid="uid-0", creationTimestamp="2026-11-25T09:00:00Z"
    )
    older["spec"]["kafka"]["outputTopic"] = "billing-out"
    kube.other_pipelines = [older]
    after_the_first_pass(kube, memory)
    second = run(kube, memory)
    assert second.status is not None
    (ready,) = [c for c in second.status["conditions"] if c["type"] == "TopicReady"]
    assert (ready["status"], ready["reason"]) == ("False", "ConsumerGroupShared"), ready
    assert "billing/events" in ready["message"] and "kafka.consumerGroup" in ready["message"]
    assert "create_pod" not in write_kinds(kube), "no worker starts"
    assert second.status["phase"] == "Degraded"

    # given a group of its own, it starts its workers
    kube.body["spec"]["kafka"]["consumerGroup"] = "analytics-events"
    kube.body["metadata"]["generation"] = 2
    kube.writes.clear()
    third = run(kube, memory)
    assert third.status is not None
    (ready,) = [c for c in third.status["conditions"] if c["type"] == "TopicReady"]
    assert ready["status"] == "True", ready
    assert "create_pod" in write_kinds(kube)


class LostNodeKube(FakeKube):
    """The STAND-IN, also as a server holds what the pass writes for its next read: the
    status merged, a fenced Lease's holder cleared, a node's taint and mark; the pods
    on a node."""

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods_ if p["spec"].get("nodeName") == node]

    def patch_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> str:
        version = super().patch_status(namespace, name, status, resource_version)
        self.body.setdefault("status", {}).update(copy.deepcopy(dict(status)))
        return version

    def fence_lease(self, namespace: str, name: str, resource_version: str | None) -> bool:
        self._write("fence_lease", name)
        lease = self.leases_[name]
        lease["spec"]["holderIdentity"] = None
        lease["metadata"]["resourceVersion"] += "f"
        return True

    def taint_out_of_service(self, node: str, owner: str) -> bool:
        self._write("taint_out_of_service", node)
        for n in self.nodes_:
            if n["metadata"]["name"] == node:
                n.setdefault("spec", {})["taints"] = [
                    {"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}
                ]
                n["metadata"]["annotations"] = {names.ANNOTATION_TAINT_BY: owner}
        self.node_writes += 1
        return True


def test_a_lost_nodes_handover_is_begun_fenced_tainted_and_released_in_one_pass(
    kafka: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of these steps decides on what the one before wrote, which the watches hold
    at once: no pass of its own each (behind every other pipeline's, in the queue)."""
    body = pipeline_body(finalizers=[names.FINALIZER_OWNED_TOPIC])
    body["status"] = {"ownership": {"workers": 2, "reshards": 0}}
    kube, memory = LostNodeKube(body), PipelineMemory()
    kafka.append(names.owned_topic(NS, NAME))
    running(kube)
    healthy = copy.deepcopy(kube.nodes_[0])
    healthy["metadata"]["name"] = "n2"  # one node lost, not every one (a full disruption)
    kube.nodes_.append(healthy)
    monkeypatch.setattr(memory_mod, "NODE_VIEWS_S", 0.0)  # the nodes judged on each look
    for p, pod in enumerate(kube.pods_):  # dedup workers, by their labels
        pod["metadata"].update(namespace=NS, labels=names.worker_labels(NAME, p, 1))
    clock = [1000.0]
    watch = LeaseWatch()
    watch.lease_clock = LeaseClock(monotonic=lambda: clock[0])
    first = run(kube, memory, watch)
    assert first.status is not None
    kube.body["status"] = dict(first.status)
    ready = kube.nodes_[0]["status"]["conditions"][0]
    ready.update(status="Unknown", lastTransitionTime=format_micro_time(datetime.now(UTC)))
    run(kube, memory, watch)  # the node's silence seen from now, on the operator's clock
    kube.writes.clear()
    clock[0] += 30.0  # past nodeLostAfter (20s) and the Leases' duration (10s)
    lost = run(kube, memory, watch)
    done = [w[0] for w in kube.writes if w[0] != "event"]
    steps = [w for i, w in enumerate(done) if w != "patch_status" and w not in done[:i]]
    assert steps == ["fence_lease", "set_finalizer", "taint_out_of_service", "delete_pod"], done
    assert done.count("fence_lease") == done.count("delete_pod") == 2, done
    assert done[0] == "patch_status", "the handovers recorded before any of it"
    assert lost.requeue_after == 0.0 and "DeleteWorkers" in lost.actions
    entries = kube.body["status"]["partitions"]
    assert all(set(e["handover"]["steps"]) >= {"fenced"} for e in entries), entries
