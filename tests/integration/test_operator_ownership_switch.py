"""The one-step switch of a pipeline that ran before ownership (OwnershipOff) to
ownership, on the local cluster (worker pods run as processes), the real broker and the
operator as a real process: `dedupctl switch-ownership` sets the annotation; every old
worker is gone before the first worker under ownership exists (seen on one pod watch,
whose events the API server orders); the internal topic is created; the workers run
with DEDUP_OWNED_TOPIC and DEDUP_OWNERSHIP_SWITCH; the conditions clear; and, with the
workers' store conversion, ids seen before the switch repeated on another partition
after it are not published again."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from dedup_contract import names
from dedup_local.kafka import KafkaBroker, produce_all
from dedup_local.real_cluster import RealCluster
from dedupctl import cli as ctl
from support.cluster_fixtures import ClusterNamespace
from support.kafka_fixtures import NewTopic
from support.operator_helpers import (
    condition,
    get_pipeline,
    reasons_once_posted,
    running_operator,
    wait_for,
)
from support.pipeline_traffic import create_pipeline, pipeline_body, ready_pipeline, topics
from support.worker_helpers import event, output_ids

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("local_crds"),
    pytest.mark.cluster_group("local-cluster"),
]

PARTITIONS = 2


class PodLog:
    """Every ADDED/DELETED event of the pipeline's pods, in the API server's order, with
    whether the pod runs under ownership (DEDUP_OWNED_TOPIC)."""

    def __init__(self, api: client.ApiClient, ns: str, pipeline: str) -> None:
        self.seen: list[tuple[str, str, bool]] = []
        self.error: BaseException | None = None  # the watch broke before stop()
        self._stopped = threading.Event()
        self._api, self._ns, self._pipeline = api, ns, pipeline
        self._watch = watch.Watch()
        core = client.CoreV1Api(api)
        listed = core.list_namespaced_pod(ns, label_selector=self._selector)
        for pod in listed.items:
            self.seen.append(("ADDED", pod.metadata.name, _owned(pod)))
        self._version = listed.metadata.resource_version
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def _selector(self) -> str:
        return f"{names.LABEL_PIPELINE}={self._pipeline}"

    def _run(self) -> None:
        core = client.CoreV1Api(self._api)
        try:
            for e in self._watch.stream(
                core.list_namespaced_pod,
                self._ns,
                label_selector=self._selector,
                resource_version=self._version,
                timeout_seconds=600,
            ):
                if e["type"] in ("ADDED", "DELETED"):
                    pod = e["object"]
                    self.seen.append((e["type"], pod.metadata.name, _owned(pod)))
        except Exception as exc:  # a watch cut short: the order seen is incomplete
            if not self._stopped.is_set():
                self.error = exc

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()


def _owned(pod: Any) -> bool:
    return any(e.name == "DEDUP_OWNED_TOPIC" for e in pod.spec.containers[0].env or [])


def _env(api: client.ApiClient, ns: str, pod: str) -> dict[str, str]:
    found = client.CoreV1Api(api).read_namespaced_pod(pod, ns)
    return {e.name: e.value for e in found.spec.containers[0].env or []}


def _produce(kafka: KafkaBroker, topic: str, ids: dict[int, list[str]]) -> int:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    records = [
        {"value": event(i, n), "partition": p}
        for p, chunk in ids.items()
        for n, i in enumerate(chunk)
    ]
    return produce_all(producer, topic, records, timeout_s=60)


def test_an_ownership_off_pipeline_switches_in_one_step(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns = cluster_namespace.name
    api = local_cluster.api_client()
    custom = client.CustomObjectsApi(api)
    topic = topics(kafka, new_topic, PARTITIONS)
    internal = names.owned_topic(ns, "legacy")
    create_pipeline(
        api,
        ns,
        pipeline_body("legacy", kafka.bootstrap, topic, PARTITIONS, local_cluster.storage_class),
    )
    # as the operator before ownership left it: workers ran, no status.ownership
    custom.patch_namespaced_custom_object_status(
        names.GROUP,
        names.VERSION,
        ns,
        names.PLURAL,
        "legacy",
        {"status": {"phase": "Running", "partitions": [
            {"partition": p, "epoch": 1, "pod": f"legacy-p{p}-e1"} for p in range(PARTITIONS)
        ]}},
    )  # fmt: skip
    before = {p: [f"old-{p}-{n}" for n in range(40)] for p in range(PARTITIONS)}
    with running_operator(local_cluster.kubeconfig_path, ns, tmp_path / "operator.log") as op:
        try:
            body = ready_pipeline(api, ns, "legacy", PARTITIONS)
            assert condition(body, "OwnershipOff")["status"] == "True"  # type: ignore[index]
            assert body["status"]["ownership"] == {"enabled": False}
            old_pods = [f"legacy-p{p}-e1" for p in range(PARTITIONS)]
            assert not any("DEDUP_OWNED_TOPIC" in _env(api, ns, pod) for pod in old_pods)
            # ids the workers' stores hold from before the switch, published per partition
            _produce(kafka, topic, before)
            for p in range(PARTITIONS):
                wait_for(
                    lambda p=p: len(output_ids(kafka.bootstrap, f"{topic}-out", p)) >= 40,
                    90,
                    f"partition {p}'s old worker to publish its ids",
                    every=1,
                )

            log = PodLog(api, ns, "legacy")
            argv = ["switch-ownership", "legacy", "-n", ns,
                    "--kubeconfig", str(local_cluster.kubeconfig_path)]  # fmt: skip
            with pytest.raises(SystemExit) as refused:
                ctl.main(argv)  # without --yes: says what it would do, changes nothing
            assert refused.value.code == ctl.USAGE
            assert ctl.main([*argv, "--yes"]) == ctl.OK
            annotations = get_pipeline(api, ns, "legacy")["metadata"]["annotations"]  # type: ignore[index]
            assert annotations[names.ANNOTATION_SWITCH_TO_OWNERSHIP] == "true"

            def switched() -> dict[str, Any] | None:
                p = get_pipeline(api, ns, "legacy") or {}
                status = p.get("status") or {}
                if (
                    (status.get("ownership") or {}).get("switched")
                    and condition(p, "OwnershipSwitching") is None
                    and (condition(p, "Ready") or {}).get("status") == "True"
                ):
                    return p
                return None

            body = wait_for(switched, 240, "the switch to complete", every=1)
            log.stop()
        except AssertionError as exc:
            pods = client.CoreV1Api(api).list_namespaced_pod(ns)
            states = {
                p.metadata.name: [
                    (c.restart_count, c.last_state.terminated and c.last_state.terminated.exit_code)
                    for c in p.status.container_statuses or []
                ]
                for p in pods.items
            }
            claims = {
                c.metadata.name: (c.status.phase, c.spec.volume_name)
                for c in client.CoreV1Api(api).list_namespaced_persistent_volume_claim(ns).items
            }
            raise AssertionError(
                f"{exc}\npods: {states}\nclaims: {claims}\n"
                f"{get_pipeline(api, ns, 'legacy')}\n{op.log()[-6000:]}"
            ) from None

        # every old worker was gone before any worker under ownership existed
        assert log.error is None, f"the pod watch broke: {log.error}"
        seen = log.seen
        old_gone = [n for n, (kind, _, owned) in enumerate(seen) if kind == "DELETED" and not owned]
        new_added = [n for n, (kind, _, owned) in enumerate(seen) if kind == "ADDED" and owned]
        assert {seen[n][1] for n in old_gone} == set(old_pods), seen
        assert new_added and max(old_gone) < min(new_added), seen
        new_pods = sorted(seen[n][1] for n in new_added)
        assert new_pods == [f"legacy-p{p}-e2" for p in range(PARTITIONS)], seen

        status = body["status"]
        assert set(status["ownership"]) == {"workers", "reshards", "switched"}
        assert (status["ownership"]["workers"], status["ownership"]["reshards"]) == (2, 0)
        assert condition(body, "OwnershipOff") is None
        assert names.FINALIZER_OWNED_TOPIC in body["metadata"]["finalizers"]
        info = kafka.admin().list_topics(topic=internal, timeout=10).topics[internal]
        assert info.error is None and len(info.partitions) == PARTITIONS
        for pod in new_pods:
            env = _env(api, ns, pod)
            assert env["DEDUP_OWNED_TOPIC"] == internal and env["DEDUP_WORKERS"] == "2"
            assert env["DEDUP_OWNERSHIP_SWITCH"] == "true"
        reasons = reasons_once_posted(
            api, ns, "legacy", "OwnershipSwitchStarted", "OwnershipSwitchWorkersStopped",
            "WorkerSwitchStarted", "WorkerSwitchCompleted", "OwnershipSwitchCompleted",
            "OwnedTopicCreated",
        )  # fmt: skip
        assert reasons.count("OwnershipSwitchCompleted") == 1
        assert status["failovers"] == 0  # planned, not a failover

        # the stores were completed: every id from before, repeated on the other
        # partition, is not published again; new ids are, once, on their owner's partition
        repeats = {p: before[(p + 1) % PARTITIONS] for p in range(PARTITIONS)}
        fresh = {p: [f"new-{p}-{n}" for n in range(20)] for p in range(PARTITIONS)}
        _produce(kafka, topic, {p: repeats[p] + fresh[p] for p in range(PARTITIONS)})
        want = {i for chunk in (*before.values(), *fresh.values()) for i in chunk}

        def caught_up() -> list[str] | None:
            got = [
                i for q in range(PARTITIONS) for i in output_ids(kafka.bootstrap, f"{topic}-out", q)
            ]
            return got if set(got) >= want else None

        got = wait_for(caught_up, 120, "the new ids to be published", every=2)
        assert len(got) == len(set(got)), f"{len(got) - len(set(got))} ids published twice"
        assert set(got) == want
