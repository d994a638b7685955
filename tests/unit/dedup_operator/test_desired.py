"""The objects the operator creates, rendered without a cluster."""

from __future__ import annotations

from typing import Any

from dedup_contract import names
from dedup_operator.desired.owner import Owner
from dedup_operator.desired.partition import (
    lease,
    template_hash,
    volume_claim,
    worker_env,
    worker_pod,
)
from dedup_operator.desired.pipeline import pipeline_objects, role
from dedup_operator.spec import PipelineSpec
from dedup_worker.cli import build_parser

OWNER = Owner(name="events", namespace="analytics", uid="uid-1")


def spec(**overrides: Any) -> PipelineSpec:
    body: dict[str, Any] = {
        "kafka": {
            "bootstrapServers": "kafka:9092",
            "inputTopic": "events",
            "outputTopic": "events-deduped",
            "deadLetterTopic": "events-dlq",
        },
        "partitions": 4,
        "messageId": {"source": "jsonField", "field": "messageId"},
        "window": {"duration": "7d", "maxKeys": 1000000},
        "worker": {"resources": {"limits": {"cpu": "3", "memory": "2Gi"}}},
        "storage": {"size": "5Gi", "storageClassName": "dedup-local"},
        "failover": {"leaseDuration": "5s"},
    }
    body.update(overrides)
    return PipelineSpec.parse("events", "analytics", body)


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


def test_names() -> None:
    assert names.volume_claim("events", 3) == "events-p3"
    assert names.lease("events", 3) == "events-p3"
    assert names.worker_pod("events", 3, 2) == "events-p3-e2"
    assert names.parse_worker_pod("my-events-p3-e12") == ("my-events", 3, 12)
    assert names.parse_worker_pod("events-p3") is None


def test_volume_claim_and_lease() -> None:
    pvc = volume_claim(spec(), 2, OWNER)
    assert pvc["metadata"]["name"] == "events-p2"
    assert pvc["metadata"]["namespace"] == "analytics"
    assert pvc["metadata"]["labels"][names.LABEL_PARTITION] == "2"
    assert pvc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "5Gi"}},
        "storageClassName": "dedup-local",
    }
    held = lease(spec(), 2, OWNER)
    assert held["metadata"]["name"] == "events-p2"
    assert held["spec"] == {"leaseDurationSeconds": 5, "leaseTransitions": 0}


def test_worker_pod_runs_the_worker_with_its_flags_from_env() -> None:
    pod = worker_pod(spec(), 1, 3, OWNER)
    assert pod["metadata"]["name"] == "events-p1-e3"
    labels = pod["metadata"]["labels"]
    assert labels[names.LABEL_EPOCH] == "3" and labels[names.LABEL_PARTITION] == "1"
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["dedup-worker"] and "args" not in container
    env = env_of(pod)
    assert env["DEDUP_PARTITION"] == "1"
    assert env["DEDUP_EPOCH"] == "3"
    assert env["DEDUP_LEASE_NAME"] == "events-p1"
    assert env["DEDUP_LEASE_DURATION"] == "5s"
    assert env["DEDUP_LOOKUP_THREADS"] == "3"  # the CPU limit
    assert env["DEDUP_STORE_PATH"] == "/var/lib/dedup/store"
    assert env["DEDUP_WINDOW_DURATION"] == "7d"
    assert env["DEDUP_CONSUMER_GROUP"] == "dedup-events"
    assert env["DEDUP_HOLDER_IDENTITY"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["DEDUP_METRICS_ADDRESS"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["DEDUP_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert "DEDUP_KAFKA_CONFIG" not in env
    # Every variable is one the worker knows (a typo would be ignored silently).
    flags = {"DEDUP_" + a.dest.upper() for a in build_parser()._actions if a.dest != "help"}
    known_by_fencing = {
        "DEDUP_LEASE_NAME",
        "DEDUP_HOLDER_IDENTITY",
        "DEDUP_EPOCH",
        "DEDUP_LEASE_DURATION",
        "DEDUP_METRICS_ADDRESS",
    }
    assert set(env) - flags <= known_by_fencing


def test_worker_pod_is_restricted_probed_and_spread() -> None:
    pod = worker_pod(spec(), 0, 1, OWNER)
    pod_spec = pod["spec"]
    container = pod_spec["containers"][0]
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["ports"][0]["containerPort"] == 9400
    assert container["resources"]["limits"] == {"cpu": "3", "memory": "2Gi"}
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "512Mi"}
    claim = pod_spec["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim == "events-p0"
    assert {"name": "store", "mountPath": "/var/lib/dedup"} in container["volumeMounts"]
    spread = pod_spec["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert [t["podAffinityTerm"]["topologyKey"] for t in spread] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    assert "nodeAffinity" not in pod_spec["affinity"]
    assert pod_spec["serviceAccountName"] == "events-worker"


def test_replacement_avoids_the_lost_node_and_keeps_user_affinity() -> None:
    user_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["dedup"]}]}
                ]
            }
        }
    }
    s = spec(worker={"affinity": user_affinity})
    pod = worker_pod(s, 0, 2, OWNER, avoid_node="node-a")
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [{"key": "pool", "operator": "In", "values": ["dedup"]}],
            "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-a"]}],
        }
    ]
    assert s.worker.affinity == user_affinity  # not modified in place


def test_template_hash_changes_with_the_worker_spec_only() -> None:
    base = template_hash(spec(), 0)
    assert template_hash(spec(), 0) == base
    assert template_hash(spec(worker={"batchSize": 100}), 0) != base
    assert template_hash(spec(), 1) != base
    # epoch and placement are not part of the template
    a = worker_pod(spec(), 0, 1, OWNER)["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH]
    b = worker_pod(spec(), 0, 7, OWNER, "node-a")["metadata"]["annotations"][
        names.ANNOTATION_SPEC_HASH
    ]
    assert a == b == base


def test_kafka_credentials_come_from_the_secret() -> None:
    only_secret = spec(
        kafka={
            "bootstrapServers": "k:9092",
            "inputTopic": "a",
            "outputTopic": "b",
            "securityRef": {"secretName": "kafka-client"},
        }
    )
    env = worker_env(only_secret, 0)
    assert {
        "name": "DEDUP_KAFKA_CONFIG",
        "valueFrom": {"secretKeyRef": {"name": "kafka-client", "key": "kafka-config"}},
    } in env
    both = spec(
        kafka={
            "bootstrapServers": "k:9092",
            "inputTopic": "a",
            "outputTopic": "b",
            "config": {"security.protocol": "SASL_SSL"},
            "securityRef": {"secretName": "kafka-client", "key": "sasl"},
        }
    )
    env = worker_env(both, 0)
    names_ = [e["name"] for e in env]
    assert names_.index("DEDUP_KAFKA_SECRET_CONFIG") < names_.index("DEDUP_KAFKA_CONFIG")
    assert {
        "name": "DEDUP_KAFKA_CONFIG",
        "value": "security.protocol=SASL_SSL,$(DEDUP_KAFKA_SECRET_CONFIG)",
    } in env


def test_pipeline_objects() -> None:
    objects = {o["kind"]: o for o in pipeline_objects(spec(), OWNER)}
    assert set(objects) == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Service",
        "PodDisruptionBudget",
    }
    rules = role(spec(), OWNER)["rules"]
    assert rules == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["events-p0", "events-p1", "events-p2", "events-p3"],
            "verbs": ["get", "update", "patch"],
        }
    ]
    binding = objects["RoleBinding"]
    assert binding["subjects"][0] == {
        "kind": "ServiceAccount",
        "name": "events-worker",
        "namespace": "analytics",
    }
    service = objects["Service"]["spec"]
    assert service["clusterIP"] == "None"
    assert service["selector"] == {names.LABEL_PIPELINE: "events", names.LABEL_COMPONENT: "worker"}
    # one worker evicted at a time, counted without a controller's scale (a
    # DedupPipeline has none: maxUnavailable would allow no eviction at all)
    pdb = objects["PodDisruptionBudget"]["spec"]
    assert pdb["minAvailable"] == 3 and "maxUnavailable" not in pdb  # 4 partitions
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    for obj in objects.values():
        assert obj["metadata"]["ownerReferences"][0]["kind"] == "DedupPipeline"
        assert obj["metadata"]["labels"][names.LABEL_MANAGED_BY] == "dedup-operator"


def test_the_pod_env_is_a_valid_worker_configuration(monkeypatch: Any) -> None:
    """What the worker makes of the pod's environment (downward API values filled in
    as the kubelet would) is the configuration the spec asks for."""
    from dedup_worker.cli import config_from_args

    pod = worker_pod(spec(), 2, 3, OWNER)
    downward = {
        "metadata.name": "events-p2-e3",
        "metadata.namespace": "analytics",
        "status.podIP": "10.0.0.7",
    }
    for e in pod["spec"]["containers"][0]["env"]:
        if "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
        else:
            monkeypatch.setenv(e["name"], downward[e["valueFrom"]["fieldRef"]["fieldPath"]])
    config = config_from_args(build_parser().parse_args([]))
    assert config.partition == 2 and config.pipeline == "events"
    assert config.namespace == "analytics"
    assert config.group == "dedup-events"
    assert str(config.store_path) == "/var/lib/dedup/store"
    assert config.store.lookup_threads == 3
    assert config.window.max_keys == 1000000
    assert config.lease is not None
    assert (config.lease.name, config.lease.holder_identity, config.lease.epoch) == (
        "events-p2",
        "events-p2-e3",
        3,
    )
    assert config.lease.duration_s == 5
    assert config.metrics_port == 9400


def test_workers_get_the_internal_topic_and_the_worker_count() -> None:
    env = env_of(worker_pod(spec(), 1, 1, OWNER))
    assert env["DEDUP_OWNED_TOPIC"] == "analytics.events-owned"
    assert env["DEDUP_OWNED_TOPIC"] == names.owned_topic("analytics", "events")
    assert env["DEDUP_WORKERS"] == "4"
    named = spec(
        kafka={
            "bootstrapServers": "kafka:9092",
            "inputTopic": "events",
            "outputTopic": "events-deduped",
            "ownedTopic": "shop.events-forwarded",
        }
    )
    assert env_of(worker_pod(named, 0, 1, OWNER))["DEDUP_OWNED_TOPIC"] == "shop.events-forwarded"
    assert named.owned_topic == "shop.events-forwarded" and not named.creates_owned_topic
    assert spec().creates_owned_topic


def test_workers_run_the_recorded_worker_count_not_spec_partitions() -> None:
    from dedup_operator.ownership_generation import decide

    grown = spec(partitions=6)  # spec.partitions changed after the workers started
    state = decide(grown, {"ownership": {"workers": 4, "reshards": 0}})
    running = state.spec
    assert running.partitions == running.workers == 4
    env = env_of(worker_pod(running, 3, 1, OWNER))
    assert env["DEDUP_WORKERS"] == "4"
    assert template_hash(running, 3) == template_hash(spec(), 3)  # nothing rolls
    objects = {o["kind"]: o for o in pipeline_objects(running, OWNER)}
    assert objects["PodDisruptionBudget"]["spec"]["minAvailable"] == 3
    assert len(objects["Role"]["rules"][0]["resourceNames"]) == 4


def test_a_pipeline_that_ran_before_ownership_keeps_its_pods_as_they_were() -> None:
    from dataclasses import replace

    from dedup_operator.ownership_generation import decide

    ran = {"partitions": [{"partition": 0, "epoch": 2, "pod": "events-p0-e2"}]}
    legacy = decide(spec(), ran).spec
    assert not legacy.ownership and not legacy.creates_owned_topic
    env = env_of(worker_pod(legacy, 0, 2, OWNER))
    assert "DEDUP_OWNED_TOPIC" not in env and "DEDUP_WORKERS" not in env
    # the very template the operator rendered before ownership existed: no roll
    before = replace(spec(), ownership=False)
    assert template_hash(legacy, 0) == template_hash(before, 0) != template_hash(spec(), 0)
