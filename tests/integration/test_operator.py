"""The operator as a real process against the real control plane (no kubelets here: pods
stay Pending; the local cluster's tests run them). What it creates for a pipeline, what
it reports, what it checks in Kafka, and what deletion leaves behind."""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_contract import names
from dedup_local.kafka import KafkaBroker
from dedup_local.operator_process import OperatorProcess
from dedup_local.pod_health import error_line
from support import pipelines
from support.kafka_fixtures import NewTopic
from support.kube_fixtures import KubeCluster, KubeNamespace
from support.operator_helpers import (
    condition,
    events,
    get_pipeline,
    operator_command,
    running_operator,
    wait_for,
    wait_for_event,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("control-plane")]


def pipeline_body(
    name: str, bootstrap: str, topic: str, partitions: int, **spec: Any
) -> dict[str, Any]:
    """Without dead letters, failover in 5 s (the kubelets here are the test's)."""
    failover = {"nodeLostAfter": "5s", "leaseDuration": "5s"}
    return pipelines.pipeline_body(
        name, bootstrap, topic, partitions, dead_letters=False, failover=failover, **spec
    )


def create(ns: KubeNamespace, body: dict[str, Any]) -> None:
    client.CustomObjectsApi(ns.api_client).create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns.name, names.PLURAL, body
    )


def listed(ns: KubeNamespace, kind: str, pipeline: str) -> list[str]:
    core = client.CoreV1Api(ns.api_client)
    selector = f"{names.LABEL_PIPELINE}={pipeline}"
    if kind == "pvc":
        items = core.list_namespaced_persistent_volume_claim(ns.name, label_selector=selector).items
    elif kind == "pod":
        items = core.list_namespaced_pod(ns.name, label_selector=selector).items
    else:
        items = (
            client.CoordinationV1Api(ns.api_client)
            .list_namespaced_lease(ns.name, label_selector=selector)
            .items
        )
    return sorted(i.metadata.name for i in items)


@pytest.mark.cluster_group("kafka-spark")
def test_cli_exit_codes(tmp_path: Path) -> None:
    usage = subprocess.run([*operator_command(), "--interval", "0"], capture_output=True, text=True)
    assert usage.returncode == 2 and "--interval" in usage.stderr
    missing = subprocess.run(
        [*operator_command(), "--kubeconfig", str(tmp_path / "nope"), "--log-format", "text"],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 3, missing.stderr
    assert "does not exist" in missing.stdout + missing.stderr


def test_cli_exits_3_when_the_cluster_is_unreachable(kube: KubeCluster, tmp_path: Path) -> None:
    import yaml

    config = yaml.safe_load(kube.kubeconfig_path.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = "https://127.0.0.1:1"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [*operator_command(), "--kubeconfig", str(kubeconfig), "-n", "x", "--log-format", "text"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "cannot reach the API server" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_pipeline_gets_volumes_leases_workers_and_status(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    topic = new_topic(partitions=3)
    kafka.create_topic(f"{topic}-out", 3)  # TopicReady: the output
    with running_operator(ns.kubeconfig_path, ns.name, tmp_path / "operator.log") as op:
        create(ns, pipeline_body("events", kafka.bootstrap, topic, 3))
        want = ["events-p0", "events-p1", "events-p2"]
        wait_for(lambda: listed(ns, "pvc", "events") == want, 60, "3 PVCs")
        wait_for(lambda: listed(ns, "lease", "events") == want, 60, "3 Leases")
        pods = wait_for(
            lambda: (p := listed(ns, "pod", "events")) == [f"{w}-e1" for w in want] and p,
            60,
            "3 worker pods at epoch 1",
        )
        assert pods
        rbac = client.RbacAuthorizationV1Api(ns.api_client)
        rules = rbac.read_namespaced_role("events-worker", ns.name).rules
        assert rules[0].resource_names == want
        core = client.CoreV1Api(ns.api_client)
        assert core.read_namespaced_service("events-workers", ns.name).spec.cluster_ip == "None"
        client.PolicyV1Api(ns.api_client).read_namespaced_pod_disruption_budget(
            "events-workers", ns.name
        )
        lease = client.CoordinationV1Api(ns.api_client).read_namespaced_lease("events-p0", ns.name)
        assert lease.spec.lease_duration_seconds == 5 and not lease.spec.holder_identity

        def pending_with_topic() -> dict[str, Any] | None:
            p = get_pipeline(ns.api_client, ns.name, "events")
            topic_ready = condition(p, "TopicReady")
            if (
                p
                and topic_ready
                and topic_ready["status"] == "True"
                and [e["epoch"] for e in p["status"].get("partitions", [])] == [1, 1, 1]
            ):
                return p
            return None

        found = wait_for(pending_with_topic, 60, "status with TopicReady")
        status = found["status"]
        assert status["phase"] == "Pending"
        assert status["observedGeneration"] == 1
        assert status["readyPartitions"] == 0
        assert {c["type"] for c in status["conditions"]} >= {
            "Ready", "Progressing", "Degraded", "FailingOver", "TopicReady"
        }  # fmt: skip
        assert condition(found, "Ready")["status"] == "False"  # type: ignore[index]
        assert [p["epoch"] for p in status["partitions"]] == [1, 1, 1]
        reasons = {e[1] for e in events(ns.api_client, ns.name, "events")}
        assert {"WorkerCreated", "VolumeCreated"} <= reasons
        assert "dedup_operator_reconciles_total" in op.metrics()
        assert (
            f'dedup_operator_partitions_not_running{{namespace="{ns.name}",pipeline="events"}} 3.0'
            in op.metrics()
        )

        # Level-based: a deleted Lease comes back, and nothing else changes.
        client.CoordinationV1Api(ns.api_client).delete_namespaced_lease("events-p1", ns.name)
        wait_for(lambda: listed(ns, "lease", "events") == want, 30, "the Lease to be recreated")
        assert listed(ns, "pod", "events") == pods


def test_topic_problems_are_conditions_and_events(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    """Under ownership the input may have any partition count: 3 workers on an input of
    2 partitions are all started, TopicReady True with a warning giving the forwarded
    share. A missing input is TopicMissing (no worker). A pipeline that ran before
    ownership (its status says workers ran, no status.ownership) is not switched:
    OwnershipOff, its pods as before, and the input must still have spec.partitions
    partitions (PartitionCountMismatch)."""
    ns = kube_namespace
    topic = new_topic(partitions=2)
    # TopicReady: the outputs, one per worker, one for each pipeline (shared_kafka.py)
    kafka.create_topic(f"{topic}-out", 3)
    kafka.create_topic(f"{topic}-out-uneven", 3)
    create(ns, pipeline_body("legacy", kafka.bootstrap, topic, 3))
    # as the operator before ownership left it: workers ran, no status.ownership
    client.CustomObjectsApi(ns.api_client).patch_namespaced_custom_object_status(
        names.GROUP,
        names.VERSION,
        ns.name,
        names.PLURAL,
        "legacy",
        {"status": {"phase": "Running", "partitions": [
            {"partition": p, "epoch": 1, "pod": f"legacy-p{p}-e1"} for p in range(3)
        ]}},
    )  # fmt: skip
    with running_operator(ns.kubeconfig_path, ns.name, tmp_path / "operator.log") as op:
        own_output = {"outputTopic": f"{topic}-out-uneven"}
        create(ns, pipeline_body("uneven", kafka.bootstrap, topic, 3, kafka_fields=own_output))
        create(ns, pipeline_body("missing", kafka.bootstrap, "no-such-topic-xyz", 2))

        def topic_ready(name: str, status: str) -> dict[str, Any] | None:
            c = condition(get_pipeline(ns.api_client, ns.name, name), "TopicReady")
            return c if c and c["status"] == status else None

        uneven = wait_for(lambda: topic_ready("uneven", "True"), 60, "uneven: TopicReady")
        assert "2 input partitions are not a multiple of 3 workers" in uneven["message"]
        assert "66.7% (2/3)" in uneven["message"], uneven
        wait_for(
            lambda: listed(ns, "pod", "uneven") == [f"uneven-p{p}-e1" for p in range(3)],
            30,
            "3 pods for 2 input partitions",
        )
        missing = wait_for(lambda: topic_ready("missing", "False"), 60, "missing condition")
        assert missing["reason"] == "TopicMissing"
        try:
            legacy = wait_for(lambda: topic_ready("legacy", "False"), 60, "legacy condition")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n{get_pipeline(ns.api_client, ns.name, 'legacy')}\n{op.log()[-6000:]}"
            ) from None
        assert legacy["reason"] == "PartitionCountMismatch", legacy
        assert "has 2 partitions, spec.partitions is 3" in legacy["message"]
        body = get_pipeline(ns.api_client, ns.name, "legacy")
        assert condition(body, "Degraded")["status"] == "True"  # type: ignore[index]
        off = condition(body, "OwnershipOff")
        assert off is not None and off["status"] == "True", body
        assert off["reason"] == "PreOwnershipPipeline"
        assert body["status"]["ownership"] == {"enabled": False}  # type: ignore[index]
        assert ("Warning", "TopicMissing") in {
            e[:2] for e in events(ns.api_client, ns.name, "missing")
        }
        assert ("Warning", "OwnershipOff") in {
            e[:2] for e in events(ns.api_client, ns.name, "legacy")
        }
        # no workers for a topic that does not exist; without ownership only the input's
        # partitions run, with the worker's arguments of before (no internal topic)
        assert listed(ns, "pod", "missing") == []
        pods = wait_for(
            lambda: (
                (found := listed(ns, "pod", "legacy"))
                and [n.rsplit("-e", 1)[0] for n in found] == ["legacy-p0", "legacy-p1"]
                and found
            ),
            30,
            "2 pods",
        )
        env = {
            e.name
            for e in client.CoreV1Api(ns.api_client)
            .read_namespaced_pod(pods[0], ns.name)
            .spec.containers[0]
            .env
        }
        assert not env & {"DEDUP_OWNED_TOPIC", "DEDUP_WORKERS"}
        assert (
            names.owned_topic(ns.name, "legacy") not in kafka.admin().list_topics(timeout=10).topics
        )
        # TopicReady failing is an ERROR line of the operator (no promise can be kept),
        # one per change of reason: a case that must stay ERROR (issue 27)
        errors = [line for line in op.log().splitlines() if error_line(line)]
        for reason in ("PartitionCountMismatch", "TopicMissing"):
            assert sum(reason in line for line in errors) == 1, errors


def test_the_younger_of_two_pipelines_sharing_a_consumer_group_or_an_output_starts_no_worker(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    """Two pipelines named `events` in two namespaces, one input topic, one Kafka cluster:
    the default consumer group `dedup-events` names no namespace, so they would move each
    other's committed position. The operator (watching both namespaces) lets the older
    one run; the younger's TopicReady is False (ConsumerGroupShared, naming the older),
    it is Degraded, no worker of it starts, and the operator says so in one ERROR line.
    Given a consumer group of its own, it still writes the older's output topic
    (OutputTopicShared, likewise); given an output of its own too, it starts its
    workers."""
    ns = kube_namespace
    core = client.CoreV1Api(ns.api_client)
    other = f"{ns.name[:55]}-b"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    younger_ns = KubeNamespace(name=other, cluster=ns.cluster)
    topic = new_topic(partitions=2)
    kafka.create_topic(f"{topic}-out", 2)
    kafka.create_topic(f"{topic}-out-b", 2)
    custom = client.CustomObjectsApi(ns.api_client)
    try:
        extra = ("--namespace", other)
        with running_operator(ns.kubeconfig_path, ns.name, tmp_path / "op.log", extra=extra) as op:
            create(ns, pipeline_body("events", kafka.bootstrap, topic, 2))
            wait_for(lambda: len(listed(ns, "pod", "events")) == 2, 60, "the older's workers")
            create(younger_ns, pipeline_body("events", kafka.bootstrap, topic, 2))

            def refused(reason: str) -> dict[str, Any] | None:
                c = condition(get_pipeline(ns.api_client, other, "events"), "TopicReady")
                return c if c and (c["status"], c["reason"]) == ("False", reason) else None

            found = wait_for(lambda: refused("ConsumerGroupShared"), 60, "the younger refused")
            assert found["reason"] == "ConsumerGroupShared", found
            assert f"pipeline {ns.name}/events" in found["message"], found
            assert "consumer group dedup-events" in found["message"], found
            body = get_pipeline(ns.api_client, other, "events")
            assert body is not None and body["status"]["phase"] == "Degraded", body
            time.sleep(3)  # passes at a 1 s interval: none starts a worker
            assert listed(younger_ns, "pod", "events") == []
            older = condition(get_pipeline(ns.api_client, ns.name, "events"), "TopicReady")
            assert older is not None and older["status"] == "True", older
            assert ("Warning", "ConsumerGroupShared") in {
                e[:2] for e in events(ns.api_client, other, "events")
            }
            errors = [line for line in op.log().splitlines() if error_line(line)]
            assert sum("ConsumerGroupShared" in line for line in errors) == 1, errors

            custom.patch_namespaced_custom_object(
                names.GROUP, names.VERSION, other, names.PLURAL, "events",
                {"spec": {"kafka": {"consumerGroup": f"dedup-{other}-events"}}},
            )  # fmt: skip
            found = wait_for(lambda: refused("OutputTopicShared"), 60, "its output refused")
            assert (
                f"output topic {topic}-out is already used by pipeline {ns.name}/events"
                in (found["message"])
            ), found
            assert "delete this pipeline and create it again" in found["message"], found
            time.sleep(2)
            assert listed(younger_ns, "pod", "events") == []
            errors = [line for line in op.log().splitlines() if error_line(line)]
            assert sum("OutputTopicShared" in line for line in errors) == 1, errors
            # the output cannot change (the CRD's rule): created again with its own
            custom.delete_namespaced_custom_object(
                names.GROUP, names.VERSION, other, names.PLURAL, "events"
            )
            wait_for(lambda: get_pipeline(ns.api_client, other, "events") is None, 60, "gone")
            own = {"outputTopic": f"{topic}-out-b", "consumerGroup": f"dedup-{other}-events"}
            create(younger_ns, pipeline_body("events", kafka.bootstrap, topic, 2, kafka_fields=own))
            wait_for(
                lambda: len(listed(younger_ns, "pod", "events")) == 2,
                60,
                "the younger's workers, with a group and an output of its own",
            )
            ready = condition(get_pipeline(ns.api_client, other, "events"), "TopicReady")
            assert ready is not None and ready["status"] == "True", ready
    finally:
        with contextlib.suppress(ApiException):
            custom.patch_namespaced_custom_object(
                names.GROUP, names.VERSION, other, names.PLURAL, "events",
                {"metadata": {"finalizers": []}},
            )  # fmt: skip
        core.delete_namespace(other)


def describe(kafka: KafkaBroker, topic: str) -> tuple[int, int, dict[str, str]]:
    """(partitions, replication factor, configs) of a topic, as Kafka answers."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin = kafka.admin()
    info = admin.list_topics(topic=topic, timeout=10).topics[topic]
    assert info.error is None, info.error
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=10)
    replication = min(len(p.replicas) for p in info.partitions.values())
    return len(info.partitions), replication, {k: str(v.value) for k, v in entries.items()}


def topic_exists(kafka: KafkaBroker, topic: str) -> bool:
    info = kafka.admin().list_topics(topic=topic, timeout=10).topics.get(topic)
    return info is not None and info.error is None and bool(info.partitions)


def test_the_operator_creates_the_internal_topic_and_deletes_it_with_the_pipeline(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    """Before the workers start: `<namespace>.<pipeline>-owned` with one partition per
    worker, kept for ever, CreateTime, room for the input's largest record plus the
    headers, as durable as the output; status.ownership recorded, the workers told the
    topic and their count. Deleting the pipeline deletes the topic."""
    ns = kube_namespace
    topic = new_topic(partitions=3, config={"max.message.bytes": "2000000"})
    kafka.create_topic(f"{topic}-out", 2, {"min.insync.replicas": "1"})
    internal = names.owned_topic(ns.name, "events")
    assert internal == f"{ns.name}.events-owned"
    custom = client.CustomObjectsApi(ns.api_client)
    with running_operator(ns.kubeconfig_path, ns.name, tmp_path / "operator.log") as op:
        create(ns, pipeline_body("events", kafka.bootstrap, topic, 2))
        ready = wait_for(
            lambda: (
                (c := condition(get_pipeline(ns.api_client, ns.name, "events"), "TopicReady"))
                and c["status"] == "True"
                and c
            ),
            60,
            "TopicReady",
        )
        assert f"internal topic {internal} has 2 partitions" in ready["message"], ready
        assert "50.0% (1/2)" in ready["message"]  # 3 input partitions, 2 workers
        partitions, replication, config = describe(kafka, internal)
        assert (partitions, replication) == (2, 1)
        assert config["cleanup.policy"] == "delete"
        assert config["retention.ms"] == "-1"
        assert config["retention.bytes"] == "-1"
        assert config["message.timestamp.type"] == "CreateTime"
        assert config["max.message.bytes"] == str(2000000 + 65536)
        assert config["min.insync.replicas"] == "1"
        assert config["unclean.leader.election.enable"] == "false"
        body = wait_for(
            lambda: (
                (p := get_pipeline(ns.api_client, ns.name, "events"))
                and (p.get("status") or {}).get("ownership")
                and p
            ),
            60,
            "status.ownership",
        )
        assert body["status"]["ownership"] == {"workers": 2, "reshards": 0}
        assert names.FINALIZER_OWNED_TOPIC in body["metadata"]["finalizers"]
        wait_for(lambda: len(listed(ns, "pod", "events")) == 2, 60, "2 worker pods")
        pod = client.CoreV1Api(ns.api_client).read_namespaced_pod("events-p1-e1", ns.name)
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert (env["DEDUP_OWNED_TOPIC"], env["DEDUP_WORKERS"]) == (internal, "2")
        assert ("Normal", "OwnedTopicCreated") in {
            e[:2] for e in events(ns.api_client, ns.name, "events")
        }

        # a later change of the worker count is refused; the workers stay as they are
        custom.patch_namespaced_custom_object(
            names.GROUP, names.VERSION, ns.name, names.PLURAL, "events", {"spec": {"partitions": 4}}
        )
        pending = wait_for(
            lambda: condition(get_pipeline(ns.api_client, ns.name, "events"), "ReshardPending"),
            60,
            "ReshardPending",
        )
        assert pending["status"] == "True"
        assert "spec.partitions is 4, the pipeline runs 2 workers" in pending["message"]
        assert "input topic can grow freely" in pending["message"]
        assert listed(ns, "pvc", "events") == ["events-p0", "events-p1"]
        assert listed(ns, "pod", "events") == ["events-p0-e1", "events-p1-e1"]
        assert describe(kafka, internal)[0] == 2

        custom.delete_namespaced_custom_object(
            names.GROUP, names.VERSION, ns.name, names.PLURAL, "events"
        )
        try:
            wait_for(lambda: not topic_exists(kafka, internal), 60, "the internal topic to go")
            wait_for(
                lambda: get_pipeline(ns.api_client, ns.name, "events") is None,
                60,
                "the pipeline to go",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{op.log()[-4000:]}") from None
        assert topic_exists(kafka, topic) and topic_exists(kafka, f"{topic}-out")


def test_a_user_named_internal_topic_is_checked_and_never_deleted(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    """kafka.ownedTopic names a topic the user made: with fewer partitions than workers
    it is TopicReady's reason with the numbers, no worker starts, and deleting the
    pipeline leaves the topic alone."""
    ns = kube_namespace
    topic = new_topic(partitions=2)
    kafka.create_topic(f"{topic}-out", 2)
    theirs = new_topic(
        partitions=1,
        config={"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"},
    )
    custom = client.CustomObjectsApi(ns.api_client)
    with running_operator(ns.kubeconfig_path, ns.name, tmp_path / "operator.log"):
        body = pipeline_body("named", kafka.bootstrap, topic, 2)
        body["spec"]["kafka"]["ownedTopic"] = theirs
        create(ns, body)
        failed = wait_for(
            lambda: (
                (c := condition(get_pipeline(ns.api_client, ns.name, "named"), "TopicReady"))
                and c["status"] == "False"
                and c
            ),
            60,
            "TopicReady False",
        )
        assert failed["reason"] == "OwnedPartitionsTooFew", failed
        assert (
            f"internal topic {theirs} has 1 partitions, fewer than the 2 workers"
            in (failed["message"])
        )
        found = get_pipeline(ns.api_client, ns.name, "named")
        assert condition(found, "Degraded")["status"] == "True"  # type: ignore[index]
        assert names.FINALIZER_OWNED_TOPIC not in (found or {})["metadata"].get("finalizers", [])
        assert not topic_exists(kafka, names.owned_topic(ns.name, "named"))
        time.sleep(3)
        assert listed(ns, "pod", "named") == []  # no worker without its internal partitions
        custom.delete_namespaced_custom_object(
            names.GROUP, names.VERSION, ns.name, names.PLURAL, "named"
        )
        wait_for(lambda: get_pipeline(ns.api_client, ns.name, "named") is None, 60, "gone")
    assert topic_exists(kafka, theirs)


def test_output_topics_that_cannot_keep_the_window_degrade_the_pipeline(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    """The output is what a lost store is rebuilt from: one that keeps records for less
    than the window (1h here), or is compacted, is a TopicReady reason with the numbers,
    the pipeline Degraded and an ERROR line; an output that keeps the window is fine."""
    ns = kube_namespace
    outputs = {
        "short": {"retention.ms": "600000"},
        "compacted": {"cleanup.policy": "compact"},
        "kept": {"retention.ms": "-1"},
    }
    for name, config in outputs.items():
        topic = new_topic(partitions=2)
        kafka.create_topic(f"{topic}-out", 2, config)
        create(ns, pipeline_body(name, kafka.bootstrap, topic, 2))
    with running_operator(ns.kubeconfig_path, ns.name, tmp_path / "operator.log") as op:

        def topic_ready(name: str) -> dict[str, Any] | None:
            return condition(get_pipeline(ns.api_client, ns.name, name), "TopicReady")

        for name, reason, says in (
            ("short", "OutputRetentionTooShort", "keeps records 10m (retention.ms=600000), "
             "the window is 1h"),
            ("compacted", "OutputCompacted", "is compacted (cleanup.policy=compact)"),
        ):  # fmt: skip
            found = wait_for(
                lambda n=name: (c := topic_ready(n)) and c["status"] == "False" and c,  # type: ignore[misc]
                60,
                f"{name}: TopicReady False",
            )
            assert found["reason"] == reason and says in found["message"], found
            degraded = condition(get_pipeline(ns.api_client, ns.name, name), "Degraded")
            assert degraded is not None and degraded["status"] == "True"
            # (Events are posted by their own thread, after the status: waited for)
            assert wait_for_event(ns.api_client, ns.name, name, "Warning", reason)
        kept = wait_for(lambda: topic_ready("kept"), 60, "kept: TopicReady")
        assert kept["status"] == "True", kept
        errors = [line for line in op.log().splitlines() if error_line(line)]
        assert {
            r
            for r in ("OutputRetentionTooShort", "OutputCompacted")
            if any(r in line for line in errors)
        } == {"OutputRetentionTooShort", "OutputCompacted"}


def test_delete_keeps_volumes_only_when_asked(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    topic = new_topic(partitions=2)
    kafka.create_topic(f"{topic}-out", 2)  # TopicReady: the outputs, one each
    kafka.create_topic(f"{topic}-out-dropped", 2)
    custom = client.CustomObjectsApi(ns.api_client)
    with running_operator(ns.kubeconfig_path, ns.name, tmp_path / "operator.log"):
        create(ns, pipeline_body("kept", kafka.bootstrap, topic, 2))
        create(
            ns,
            pipeline_body(
                "dropped", kafka.bootstrap, topic, 2,
                kafka_fields={"outputTopic": f"{topic}-out-dropped"},
                storage={"retainOnDelete": False},
            ),
        )  # fmt: skip
        for name in ("kept", "dropped"):
            wait_for(lambda n=name: len(listed(ns, "pod", n)) == 2, 60, f"{name}'s pods")
        kept = get_pipeline(ns.api_client, ns.name, "kept")
        dropped = get_pipeline(ns.api_client, ns.name, "dropped")
        assert kept and names.FINALIZER_RETAIN_VOLUMES in kept["metadata"].get("finalizers", [])
        # the only finalizer of a pipeline that drops its volumes: its internal topic's
        assert dropped and dropped["metadata"].get("finalizers") == [names.FINALIZER_OWNED_TOPIC]
        for name in ("kept", "dropped"):
            custom.delete_namespaced_custom_object(
                names.GROUP, names.VERSION, ns.name, names.PLURAL, name
            )
        wait_for(lambda: get_pipeline(ns.api_client, ns.name, "kept") is None, 60, "kept to go")
        for kind in ("pod", "lease"):
            for name in ("kept", "dropped"):
                wait_for(
                    lambda k=kind, n=name: listed(ns, k, n) == [], 90, f"{name}'s {kind}s to go"
                )
        wait_for(lambda: listed(ns, "pvc", "dropped") == [], 90, "dropped's PVCs to go")
        assert listed(ns, "pvc", "kept") == ["kept-p0", "kept-p1"]
        core = client.CoreV1Api(ns.api_client)
        pvc = core.read_namespaced_persistent_volume_claim("kept-p0", ns.name)
        assert not pvc.metadata.owner_references
        with pytest.raises(ApiException):
            core.read_namespaced_service("kept-workers", ns.name)


def test_worker_rbac_reaches_its_leases_and_nothing_else(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    topic = new_topic(partitions=2)
    kafka.create_topic(f"{topic}-out", 2)  # TopicReady: the outputs, one each
    kafka.create_topic(f"{topic}-out-other", 2)
    with running_operator(ns.kubeconfig_path, ns.name, tmp_path / "operator.log"):
        create(ns, pipeline_body("events", kafka.bootstrap, topic, 2))
        own_output = {"outputTopic": f"{topic}-out-other"}
        create(ns, pipeline_body("other", kafka.bootstrap, topic, 2, kafka_fields=own_output))
        for name in ("events", "other"):
            wait_for(lambda n=name: len(listed(ns, "lease", n)) == 2, 60, f"{name}'s Leases")
            wait_for(lambda n=name: _has_binding(ns, f"{n}-worker"), 60, f"{name}'s RoleBinding")
    core = client.CoreV1Api(ns.api_client)
    token = core.create_namespaced_service_account_token(
        "events-worker", ns.name, {"spec": {"expirationSeconds": 600}}
    ).status.token
    config = client.Configuration()
    admin = ns.api_client.configuration
    config.host, config.ssl_ca_cert, config.verify_ssl = (
        admin.host,
        admin.ssl_ca_cert,
        admin.verify_ssl,
    )
    config.api_key = {"authorization": f"Bearer {token}"}
    worker = client.ApiClient(config)
    leases = client.CoordinationV1Api(worker)
    own = leases.read_namespaced_lease("events-p1", ns.name)
    own.spec.holder_identity = "events-p1-e1"
    leases.replace_namespaced_lease("events-p1", ns.name, own)  # renew: allowed
    leases.patch_namespaced_lease("events-p0", ns.name, {"spec": {"leaseTransitions": 0}})

    def forbidden(call: Any) -> bool:
        try:
            call()
        except ApiException as exc:
            return bool(exc.status == 403)
        return False

    assert forbidden(lambda: leases.read_namespaced_lease("other-p0", ns.name))
    assert forbidden(lambda: leases.list_namespaced_lease(ns.name))
    assert forbidden(lambda: leases.delete_namespaced_lease("events-p0", ns.name))
    assert forbidden(
        lambda: leases.create_namespaced_lease(
            ns.name, {"metadata": {"name": "events-p9"}, "spec": {}}
        )
    )
    assert forbidden(lambda: client.CoreV1Api(worker).list_namespaced_pod(ns.name))
    assert forbidden(lambda: client.CoreV1Api(worker).list_namespaced_secret(ns.name))
    worker.close()  # type: ignore[no-untyped-call]


def _has_binding(ns: KubeNamespace, name: str) -> bool:
    try:
        client.RbacAuthorizationV1Api(ns.api_client).read_namespaced_role_binding(name, ns.name)
    except ApiException:
        return False
    return True


def test_two_replicas_only_the_leader_acts(
    dedup_crd: KubeCluster,
    kube_namespace: KubeNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    topic = new_topic(partitions=2)
    kafka.create_topic(f"{topic}-out", 2)  # TopicReady: the output
    leases = client.CoordinationV1Api(ns.api_client)
    with (
        running_operator(ns.kubeconfig_path, ns.name, tmp_path / "a.log") as a,
        running_operator(ns.kubeconfig_path, ns.name, tmp_path / "b.log") as b,
    ):
        create(ns, pipeline_body("events", kafka.bootstrap, topic, 2))

        def a_pod_per_partition() -> bool:
            # by partition, not a count: without kubelets of its own, a pod of this test
            # may land on a node another test of the shared cluster left, and be replaced
            pods = listed(ns, "pod", "events")
            return all(any(p.startswith(f"events-p{i}-") for p in pods) for i in (0, 1))

        try:
            wait_for(a_pod_per_partition, 90, "a worker pod per partition")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n--- a\n{a.log()[-3000:]}\n--- b\n{b.log()[-3000:]}"
            ) from None
        holder = leases.read_namespaced_lease("dedup-operator-leader", ns.name).spec.holder_identity
        leader, follower = (a, b) if holder == a.identity() else (b, a)
        assert holder == leader.identity() and a.identity() != b.identity()
        assert "WorkerCreated" in leader.log()
        assert "WorkerCreated" not in follower.log()
        leader.kill()
        leases.delete_namespaced_lease("events-p1", ns.name)
        wait_for(lambda: "events-p1" in listed(ns, "lease", "events"), 60, "the follower to act")
        assert "became leader" in follower.log()


def acting_spans(op: OperatorProcess, until: datetime) -> list[tuple[datetime, datetime]]:
    """When `op` held leadership, from its own log: from each "became leader" to the
    next "lost leadership" (or `until`: still leading, or killed then)."""
    spans, began = [], None
    for record in op.log_records():
        if record.get("message") == "became leader":
            began = datetime.fromisoformat(record["timestamp"])
        elif record.get("message") == "lost leadership" and began is not None:
            spans.append((began, datetime.fromisoformat(record["timestamp"])))
            began = None
    if began is not None:
        spans.append((began, until))
    return spans


def test_two_replicas_with_one_host_name_and_pid_never_both_lead(
    dedup_crd: KubeCluster, kube_namespace: KubeNamespace, tmp_path: Path
) -> None:
    """Two operator processes with the same host name and the same PID (each PID 1 of a
    PID namespace of its own, host name set by the test, as containers on the local
    cluster and hostNetwork pods on one node have): they hold different identities, one
    leads, and after the leader is killed the other leads, never both at once (the
    identity `host-pid` made both act, 965 s of a 25-minute run)."""
    ns = kube_namespace
    leases = client.CoordinationV1Api(ns.api_client)
    holders: list[str] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            try:
                spec = leases.read_namespaced_lease("dedup-operator-leader", ns.name).spec
            except Exception:  # not made yet (404), or the API going away with the test
                continue
            if spec is not None and spec.holder_identity and spec.holder_identity not in holders:
                holders.append(spec.holder_identity)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        two_operators_on_one_host(ns, tmp_path, holders, stop)
    finally:
        stop.set()
        sampler.join(timeout=5)


def two_operators_on_one_host(
    ns: KubeNamespace, tmp_path: Path, holders: list[str], stop: threading.Event
) -> None:
    with (
        running_operator(ns.kubeconfig_path, ns.name, tmp_path / "a.log", same_host_as="op") as a,
        running_operator(ns.kubeconfig_path, ns.name, tmp_path / "b.log", same_host_as="op") as b,
    ):
        ids = wait_for(lambda: (a.identity(), b.identity()) if a.identity() and b.identity()
                       else None, 60, "both operators started")  # fmt: skip
        assert ids[0].startswith("op-") and ids[1].startswith("op-") and ids[0] != ids[1], ids
        # the same host name and PID as each other (PID 1 of their own namespaces)
        for op in (a, b):
            status = Path(f"/proc/{op.operator_pid()}/status").read_text().splitlines()
            nspid = next(line for line in status if line.startswith("NSpid"))
            assert nspid.split()[-1] == "1", nspid  # "NSpid: <host pid> 1"
        leader = wait_for(lambda: next((op for op in (a, b) if "became leader" in op.log()), None),
                          60, "a leader")  # fmt: skip
        other = b if leader is a else a
        time.sleep(10)  # > 3 lease durations (3 s) for the other to (wrongly) lead too
        assert "became leader" not in other.log(), other.log()[-3000:]
        leader.kill()
        killed = datetime.now(UTC)
        wait_for(lambda: "became leader" in other.log(), 60, "the other to lead")
        time.sleep(2)
        stop.set()
        now = datetime.now(UTC)
        spans = sorted(acting_spans(leader, killed) + acting_spans(other, now))
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"two replicas led at once: {spans}"
        assert set(holders) <= {leader.identity(), other.identity()}, holders
        assert holders[-1] == other.identity(), holders
