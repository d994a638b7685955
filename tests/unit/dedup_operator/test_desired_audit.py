"""The scheduled audit's objects, rendered without a cluster."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from dedup_contract import names
from dedup_operator.desired import scheduled_audit as rec
from dedup_operator.desired.owner import Owner
from dedup_operator.desired.partition import worker_pod
from dedup_operator.spec import PipelineSpec
from dedup_spark.audit_job import build_parser, job_from_args

OWNER = Owner(name="events", namespace="analytics", uid="uid-1")
ROOT = Path(__file__).resolve().parents[3]


def spec(reconciliation: dict[str, Any] | None = None, **overrides: Any) -> PipelineSpec:
    body: dict[str, Any] = {
        "kafka": {
            "bootstrapServers": "kafka:9092",
            "inputTopic": "events",
            "outputTopic": "events-deduped",
            "deadLetterTopic": "events-dlq",
            "config": {"security.protocol": "SASL_SSL"},
            "securityRef": {"secretName": "kafka-creds"},
        },
        "partitions": 4,
        "messageId": {"source": "header", "field": "msg-id"},
        "window": {"duration": "7d"},
        "worker": {"image": "registry/dedup:1.2"},
        "reconciliation": reconciliation
        if reconciliation is not None
        else {"schedule": "0 3 * * *", "lookback": "36h", "spark": {"executors": 3}},
    }
    body.update(overrides)
    return PipelineSpec.parse("events", "analytics", body)


def flags(argv: list[str]) -> dict[str, str]:
    return {argv[i]: argv[i + 1] for i in range(0, len(argv) - 1) if argv[i].startswith("--")}


OWNERSHIP_FLAGS = ("--workers", "--owned-topic")


def test_no_reconciliation_no_objects() -> None:
    plain = PipelineSpec.parse(
        "events",
        "analytics",
        {
            "kafka": {"bootstrapServers": "k:9092", "inputTopic": "a", "outputTopic": "b"},
            "partitions": 1,
            "messageId": {"source": "key"},
            "window": {"duration": "1h"},
        },
    )
    assert rec.reconciliation_objects(plain, OWNER, spark_operator=False) == []
    assert rec.reconciliation_objects(plain, OWNER, spark_operator=True) == []


def test_cron_job_without_the_spark_operator() -> None:
    objs = rec.reconciliation_objects(spec(), OWNER, spark_operator=False)
    assert [o["kind"] for o in objs] == ["ServiceAccount", "Role", "RoleBinding", "CronJob"]
    for o in objs:
        assert o["metadata"]["name"] == "events-reconcile"
        assert o["metadata"]["namespace"] == "analytics"
        assert o["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert o["metadata"]["labels"][names.LABEL_PIPELINE] == "events"
        assert o["metadata"]["labels"][names.LABEL_COMPONENT] == "reconciliation"
    cron = objs[-1]
    s = cron["spec"]
    assert s["schedule"] == "0 3 * * *"
    assert s["concurrencyPolicy"] == "Forbid"
    assert s["successfulJobsHistoryLimit"] == 3 and s["failedJobsHistoryLimit"] == 3
    assert s["startingDeadlineSeconds"] == 300
    job = s["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0 and job["activeDeadlineSeconds"] == 6 * 3600
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == "events-reconcile"
    assert job["template"]["metadata"]["labels"][names.LABEL_COMPONENT] == "reconciliation"
    container = pod["containers"][0]
    assert container["image"] == "registry/dedup:1.2"  # the worker's image by default
    assert container["command"][0] == "dedup-audit"
    assert {"name": "reports", "mountPath": "/reports"} in container["volumeMounts"]
    assert {"name": "reports", "emptyDir": {}} in pod["volumes"]


def test_cron_job_command_is_what_dedup_reconcile_accepts() -> None:
    cron = rec.cron_job(spec(), OWNER)
    argv = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    f = flags(argv)
    assert f["--master"] == "k8s"
    assert f["--image"] == "registry/dedup:1.2"
    assert f["--executors"] == "3"
    assert f["--configmap"] == "events-reconciliation" == names.reconciliation_result("events")
    assert f["--report-dir"] == "/reports"
    assert f["--lookback"] == "36h"
    assert f["--window"] == "7d"
    # ownership: the recorded worker count and the internal topic
    assert f["--workers"] == "4"
    assert (
        f["--owned-topic"] == "analytics.events-owned" == names.owned_topic("analytics", "events")
    )
    args = build_parser().parse_args(argv[1:])
    job = job_from_args(args, now_ms=10 * 86_400_000)
    assert job.pipeline == "events" and job.namespace == "analytics"
    assert (job.input_topic, job.output_topic, job.dead_letter_topic) == (
        "events",
        "events-deduped",
        "events-dlq",
    )
    assert job.id_spec.source == "header" and job.id_spec.field == "msg-id"
    assert job.consumer_group == "dedup-events"
    assert job.window_ms == 7 * 86_400_000
    assert job.audit_range.from_ms == 10 * 86_400_000 - 36 * 3_600_000


def test_the_audit_follows_the_recorded_workers_and_a_user_named_internal_topic() -> None:
    from dataclasses import replace

    s = spec(
        kafka={
            "bootstrapServers": "kafka:9092",
            "inputTopic": "events",
            "outputTopic": "events-deduped",
            "ownedTopic": "shop.events-forwarded",
        }
    )
    f = flags(rec.command(replace(s, partitions=2)))  # status.ownership.workers 2
    assert (f["--workers"], f["--owned-topic"]) == ("2", "shop.events-forwarded")
    legacy = rec.command(replace(spec(), ownership=False))  # OwnershipOff: no internal topic
    assert flags(legacy)["--workers"] == "4" and "--owned-topic" not in legacy


def test_driver_env_downward_api_and_kafka_settings_as_the_worker() -> None:
    s = spec()
    cron = rec.cron_job(s, OWNER)
    env = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"]
    by_name = {e["name"]: e for e in env}
    assert by_name["DEDUP_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert by_name["DEDUP_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert by_name["DEDUP_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    worker_env = worker_pod(s, 0, 1, OWNER)["spec"]["containers"][0]["env"]
    kafka = [e for e in worker_env if e["name"].startswith("DEDUP_KAFKA_")]
    assert kafka and [e for e in env if e["name"].startswith("DEDUP_KAFKA_")] == kafka
    assert by_name["DEDUP_KAFKA_CONFIG"]["value"] == (
        "security.protocol=SASL_SSL,$(DEDUP_KAFKA_SECRET_CONFIG)"
    )


def test_role_allows_what_the_driver_calls_and_the_result_configmap() -> None:
    role = rec.role(spec(), OWNER)
    verbs: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""]
        if "resourceNames" in rule:
            assert rule["resources"] == ["configmaps"]
            assert rule["resourceNames"] == ["events-reconciliation"]
            assert set(rule["verbs"]) == {"get", "update"}
            continue
        verbs.setdefault(rule["resources"][0], set()).update(rule["verbs"])
    # Issue 18: the least Spark's driver calls (each verb's reason in DRIVER_GRANTS);
    # no patch of pods, no reading of other ConfigMaps, no creating Services.
    assert verbs == {
        "pods": {"get", "list", "watch", "create", "delete", "deletecollection"},
        "configmaps": {"create", "deletecollection"},
        "services": {"deletecollection"},
    }
    assert all(why for _, _, why in rec.DRIVER_GRANTS)
    binding = rec.role_binding(spec(), OWNER)
    assert binding["roleRef"]["name"] == "events-reconcile"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "events-reconcile", "namespace": "analytics"}
    ]


def test_scheduled_spark_application_with_the_spark_operator() -> None:
    objs = rec.reconciliation_objects(spec(), OWNER, spark_operator=True)
    assert [o["kind"] for o in objs] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ScheduledSparkApplication",
    ]
    ssa = objs[-1]
    assert ssa["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    s = ssa["spec"]
    assert s["schedule"] == "0 3 * * *"
    assert s["concurrencyPolicy"] == "Forbid"
    assert s["successfulRunHistoryLimit"] == 3 and s["failedRunHistoryLimit"] == 3
    t = s["template"]
    assert (t["type"], t["mode"], t["sparkVersion"]) == ("Python", "cluster", "4.0.0")
    assert t["image"] == "registry/dedup:1.2"
    assert t["mainApplicationFile"] == (
        "local:///opt/dedup/lib/python3.11/site-packages/dedup_spark/audit_job.py"
    )
    # the CronJob's command: without --master dedup-audit would run local[2]
    assert t["arguments"] == rec.command(spec())[1:]
    assert flags(t["arguments"])["--master"] == "k8s"
    assert t["driver"]["serviceAccount"] == "events-reconcile"
    assert t["driver"]["cores"] == 1 and t["driver"]["memory"]
    assert t["executor"]["instances"] == 3
    assert t["executor"]["cores"] == 1 and t["executor"]["memory"]
    # the fields the Kubeflow spark-operator's v1beta2 API documents for a scheduled run
    assert t["restartPolicy"] == {"type": "Never"}
    assert t["executor"]["serviceAccount"] == t["driver"]["serviceAccount"]
    assert {"name": "DEDUP_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in (
        t["driver"]["env"]
    )
    mounts = t["driver"]["volumeMounts"]
    assert {v["name"] for v in t["volumes"]} >= {m["name"] for m in mounts}
    assert isinstance(t["driver"]["cores"], int) and isinstance(t["executor"]["cores"], int)


def test_explicit_master_keeps_the_cron_job() -> None:
    s = spec({"schedule": "@daily", "spark": {"master": "local[2]", "image": "spark:img"}})
    assert not rec.uses_spark_operator(s, crd_installed=True)
    cron = rec.scheduler(s, OWNER, spark_operator=True)
    assert cron["kind"] == "CronJob"
    container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "spark:img"
    assert flags(container["command"])["--master"] == "local[2]"


def test_max_keys_only_window_audits_with_the_lookback_as_window() -> None:
    s = spec(window={"maxKeys": 1000})
    assert flags(rec.command(s))["--window"] == "36h"
    assert rec._duration(timedelta(minutes=90, seconds=5)) == "1h30m5s"


def test_spec_hash_follows_the_spec() -> None:
    a = rec.cron_job(spec(), OWNER)
    b = rec.cron_job(spec({"schedule": "0 4 * * *"}), OWNER)
    key = names.ANNOTATION_SPEC_HASH
    assert (
        a["metadata"]["annotations"][key]
        == rec.cron_job(spec(), OWNER)["metadata"]["annotations"][key]
    )
    assert a["metadata"]["annotations"][key] != b["metadata"]["annotations"][key]
    ssa = rec.scheduled_spark_application(spec(), OWNER)
    assert ssa["metadata"]["annotations"][key] == rec.spec_hash(ssa["spec"])


def test_application_file_matches_the_dockerfile() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11[-\w.]*\s*$", dockerfile, re.M)
    assert rec.IMAGE_PYTHON == "python3.11"
    assert f"python3 -m venv {rec.IMAGE_VENV}" in dockerfile
    assert (ROOT / "spark" / "dedup_spark" / "audit_job.py").is_file()
    assert rec.APPLICATION_FILE.endswith("/dedup_spark/audit_job.py")
