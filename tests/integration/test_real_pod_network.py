"""Networking pods can use, on the session's real nodes (issue 28, second stage): with the
host's kube-proxy (`dedup_local.real_network.HostProxy`, started by `RealCluster`), a pod
reaches the API server at its service IP with its service account's token (from its own
address: not masqueraded), and the session's Kafka broker on the control plane's host
address. The proxy's log has no error; that it leaves no KUBE-* chain behind is checked
when the session's cluster stops (tests/support/cluster_fixtures.py)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from dedup_local.kafka import KafkaBroker
from dedup_local.real_cluster import RealCluster
from support.pod_bodies import image_pod

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("local-cluster")]


# What runs in the pod: the official client's in-cluster configuration (the service IP
# from the environment, the projected token and CA), then a producer and a consumer of
# the project's image's confluent_kafka against the broker.
IN_POD = """\
import json, os, time
from kubernetes import client, config
from confluent_kafka import Consumer, Producer

config.load_incluster_config()
print("apiserver=" + client.Configuration.get_default_copy().host, flush=True)
pods = client.CoreV1Api().list_namespaced_pod(os.environ["NAMESPACE"])
print("pods=" + json.dumps(sorted(p.metadata.name for p in pods.items)), flush=True)

boot, topic = os.environ["BOOTSTRAP"], os.environ["TOPIC"]
producer = Producer({"bootstrap.servers": boot, "enable.idempotence": True})
for i in range(10):
    producer.produce(topic, key=f"pod-{i}", value=f"from the pod {i}")
assert producer.flush(60) == 0, "undelivered records"
consumer = Consumer(
    {"bootstrap.servers": boot, "group.id": "in-pod", "auto.offset.reset": "earliest"}
)
consumer.subscribe([topic])
seen = []
deadline = time.monotonic() + 60
while len(seen) < 15 and time.monotonic() < deadline:
    msg = consumer.poll(1)
    if msg is not None and msg.error() is None:
        seen.append(msg.key().decode())
consumer.close()
print("consumed=" + json.dumps(sorted(seen)), flush=True)
"""
CLIENT_POD = "in-cluster-client"
LISTER = "pod-lister"


def _rbac(namespace: str) -> list[dict[str, Any]]:
    """A service account allowed to list pods in its namespace, and nothing else."""
    meta = {"name": LISTER, "namespace": namespace}
    subject = {"kind": "ServiceAccount", "name": LISTER, "namespace": namespace}
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LISTER}
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [rule]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "subjects": [subject], "roleRef": role_ref},
    ]  # fmt: skip


def test_pods_reach_the_api_server_and_kafka(
    local_cluster: RealCluster, kafka: KafkaBroker
) -> None:
    cluster = local_cluster
    cp = cluster.control_plane
    assert cp is not None and cluster.proxy is not None and cluster.image is not None
    # The API server is bound to and advertised on the control plane's host address: the
    # `kubernetes` service's endpoint is there, not on loopback.
    assert cp.host != "127.0.0.1" and cp.server.startswith(f"https://{cp.host}:")
    endpoints = json.loads(cp.kubectl("get", "endpoints", "kubernetes", "-o", "json").stdout)
    (subset,) = endpoints["subsets"]
    assert [a["ip"] for a in subset["addresses"]] == [cp.host], subset

    # The session's broker, advertised on the same address (the host's clients reach it
    # there too).
    broker = kafka
    assert broker.bootstrap == f"{cp.host}:{broker.port}"
    topic = f"real-kubelet-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic)
    broker.produce(topic, [(f"host-{i}", f"from the host {i}", None) for i in range(5)])

    for doc in _rbac("default"):
        cp.kubectl("apply", "-f", "-", input=json.dumps(doc))
    pod = image_pod(CLIENT_POD, cluster.image)
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["serviceAccountName"] = LISTER
    (container,) = pod["spec"]["containers"]
    container["command"] = ["python", "-c", IN_POD]
    container["env"] = [
        {"name": "NAMESPACE", "value": "default"},
        {"name": "BOOTSTRAP", "value": broker.bootstrap},
        {"name": "TOPIC", "value": topic},
    ]
    t0 = time.monotonic()
    cp.kubectl("apply", "-f", "-", input=json.dumps(pod))
    deadline = time.monotonic() + 180
    phase, pod_ips = "", set[str]()
    while phase not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, f"pod {CLIENT_POD} still {phase!r}"
        time.sleep(0.5)
        status = json.loads(cp.kubectl("get", "pod", CLIENT_POD, "-o", "json").stdout)["status"]
        phase = status.get("phase", "")
        pod_ips |= {status["podIP"]} if status.get("podIP") else set()
    print(f"in-cluster client pod done in {time.monotonic() - t0:.1f}s")
    logs = cp.kubectl("logs", CLIENT_POD).stdout
    print(logs)
    assert phase == "Succeeded", logs
    lines = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
    # (a) in-cluster config: the service IP from the pod's environment, and the list
    # answered by the API server for the service account's token (RBAC's Role).
    assert lines["apiserver"] == "https://10.0.0.1:443", lines
    assert CLIENT_POD in json.loads(lines["pods"])
    user = f"system:serviceaccount:default:{LISTER}"
    lists = [
        e for e in cp.audit_events(user)
        if e.get("verb") == "list" and (e.get("objectRef") or {}).get("resource") == "pods"
    ]  # fmt: skip
    assert lists and all(e["responseStatus"]["code"] == 200 for e in lists), lists
    # from the pod's own address: not masqueraded
    assert {ip for e in lists for ip in e.get("sourceIPs", [])} == pod_ips, (pod_ips, lists)
    # (b) the pod produced to the broker and consumed the host's records and its own.
    expected = sorted([f"host-{i}" for i in range(5)] + [f"pod-{i}" for i in range(10)])
    assert json.loads(lines["consumed"]) == expected
    keys = sorted(m.key().decode() for m in broker.read_committed(topic))
    assert keys == expected

    # The host's kube-proxy: no error in its log.
    assert not cluster.proxy.log_errors(), cluster.proxy.log_errors()
    cp.kubectl("delete", "pod", CLIENT_POD, "--wait=true", "--timeout=60s")
