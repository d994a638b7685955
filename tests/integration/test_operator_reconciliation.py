"""The operator schedules the audit and takes its result over, on the local cluster.

- a pipeline with spec.reconciliation gets its ServiceAccount/Role/RoleBinding and a
  CronJob the API server validated (Forbid, bounded history, the driver's command);
- the job's result ConfigMap, written by dedup-audit's own publishing code (passed,
  then failed), lands in status.lastReconciliation with Events, metrics and condition
  ReconciliationHealthy (False with the numbers);
- finished runs beyond the CronJob's history limit are deleted (by kube-controller-manager's
  CronJob controller, from the limits the operator rendered);
- removing spec.reconciliation deletes the CronJob and its RBAC;
- with (test stand-ins of) the Spark operator's CRDs installed, a pipeline gets a
  ScheduledSparkApplication instead, and its newest run's state reaches the status.

No cron tick is waited for: the schedules never fire during the test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_contract import names
from dedup_local.kafka import KafkaBroker
from dedup_local.real_cluster import IMAGE_TAGS, RealCluster
from dedup_local.spark_pods import ExecutorWatch
from dedup_operator.desired import scheduled_audit
from dedup_spark.audit_job import build_parser, job_from_args, publish_summary
from dedupctl import cli as ctl
from support.cluster_fixtures import ClusterNamespace
from support.kafka_fixtures import NewTopic
from support.operator_helpers import (
    condition,
    dedupctl,
    events,
    get_pipeline,
    running_operator,
    wait_for,
    wait_for_event,
)
from support.pipelines import cluster_pipeline_body
from support.worker_helpers import event, produce, read_committed

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("local_crds"),
    pytest.mark.cluster_group("local-cluster"),
]

SPARK_OPERATOR_CRDS = Path(__file__).resolve().parents[1] / "support" / "spark_operator_crds.yaml"
NEVER = "0 0 1 1 *"  # once a year: no tick during a test
ALSO_NEVER = "0 0 2 1 *"


@pytest.fixture
def spark_operator_crds(local_cluster: RealCluster) -> Iterator[None]:
    """The stand-in CRDs for one test, removed afterwards (other tests of the session
    must see a cluster without the Spark operator)."""
    assert local_cluster.control_plane is not None
    installed = local_cluster.control_plane.install_crds([SPARK_OPERATOR_CRDS])
    try:
        yield
    finally:
        with local_cluster.api_client() as api:
            ext = client.ApiextensionsV1Api(api)
            for name in installed:
                try:
                    ext.delete_custom_resource_definition(name)
                except ApiException as exc:
                    if exc.status != 404:
                        raise


def pipeline_body(name: str, bootstrap: str, topic: str, storage_class: str) -> dict[str, Any]:
    audit = {"schedule": NEVER, "lookback": "2h", "spark": {"executors": 2}}
    return cluster_pipeline_body(name, bootstrap, topic, storage_class, reconciliation=audit)


def topics(kafka: KafkaBroker, new_topic: NewTopic) -> str:
    topic = new_topic(partitions=1)
    kafka.create_topic(f"{topic}-out", 1)
    kafka.create_topic(f"{topic}-dlq", 1)
    return topic


def summary(pipeline: str, ns: str, run: str, finished: datetime, **totals: int) -> dict[str, Any]:
    counts = {
        "input": 500,
        "valid": 500,
        "distinct": 400,
        "published": 400,
        "deadLettered": 0,
        "duplicates": 0,
        "missing": 0,
        "unexpected": 0,
        "orderViolations": 0,
        "inputDuplicateRate": 0.2,
    }
    counts.update(totals)
    at = finished.strftime("%Y-%m-%dT%H:%M:%SZ")
    failing = ("duplicates", "missing", "unexpected", "orderViolations")
    return {
        "pipeline": pipeline,
        "namespace": ns,
        "runId": run,
        "startedAt": at,
        "finishedAt": at,
        "passed": all(counts[k] == 0 for k in failing),
        "range": {"from": at, "to": at},
        "totals": counts,
        "deadLetteredByReason": {},
        "partitions": [{"partition": 0, **counts}],
        "report": "/reports",
    }


def publish_as_the_job(command: list[str], kubeconfig: Path, result: dict[str, Any]) -> None:
    """Write the result ConfigMap with dedup-audit's own code, from the flags the
    CronJob gives it."""
    args = build_parser().parse_args([*command[1:], "--kubeconfig", str(kubeconfig)])
    publish_summary(job_from_args(args), result)


def test_cron_job_result_in_status_and_removal(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns = cluster_namespace.name
    api = cluster_namespace.api_client
    batch, core, rbac = (
        client.BatchV1Api(api),
        client.CoreV1Api(api),
        client.RbacAuthorizationV1Api(api),
    )
    custom = client.CustomObjectsApi(api)
    topic = topics(kafka, new_topic)
    job = names.reconciliation_job("audited")
    with running_operator(local_cluster.kubeconfig_path, ns, tmp_path / "operator.log") as op:
        custom.create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            ns,
            names.PLURAL,
            pipeline_body("audited", kafka.bootstrap, topic, local_cluster.storage_class),
        )

        def cron_job() -> Any:
            try:
                return batch.read_namespaced_cron_job(job, ns)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        cron = wait_for(cron_job, 60, "the CronJob")
        assert cron.spec.schedule == NEVER
        assert cron.spec.concurrency_policy == "Forbid"
        assert cron.spec.successful_jobs_history_limit == 3
        assert cron.spec.failed_jobs_history_limit == 3
        assert cron.spec.starting_deadline_seconds == 300
        assert cron.metadata.owner_references[0].name == "audited"
        template = cron.spec.job_template.spec
        assert template.backoff_limit == 0
        pod = template.template.spec
        assert pod.restart_policy == "Never"
        assert pod.service_account_name == job
        command = pod.containers[0].command
        assert command[0] == "dedup-audit"
        assert command[command.index("--master") + 1] == "k8s"
        assert command[command.index("--configmap") + 1] == "audited-reconciliation"
        env = {e.name: e for e in pod.containers[0].env}
        assert env["DEDUP_POD_IP"].value_from.field_ref.field_path == "status.podIP"
        assert core.read_namespaced_service_account(job, ns).metadata.name == job
        rules = rbac.read_namespaced_role(job, ns).rules
        assert any("pods" in r.resources and "deletecollection" in r.verbs for r in rules)
        assert rbac.read_namespaced_role_binding(job, ns).role_ref.name == job

        # -- a spec change reaches the CronJob (replaced: its spec hash differs)
        custom.patch_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            ns,
            names.PLURAL,
            "audited",
            {"spec": {"reconciliation": {"schedule": ALSO_NEVER}}},
            _content_type="application/merge-patch+json",
        )
        wait_for(
            lambda: (c := cron_job()) is not None and c.spec.schedule == ALSO_NEVER,
            30,
            "the CronJob's new schedule",
        )

        # -- finished runs beyond the history limit: the CronJob controller deletes the
        # oldest (runs of a trivial pod, owned by the CronJob as the runs it starts are)
        uid = cron_job().metadata.uid
        owner = {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "name": job,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        runs = scheduled_audit.HISTORY_LIMIT + 2
        for n in range(runs):
            batch.create_namespaced_job(
                ns,
                {
                    "metadata": {"name": f"{job}-run-{n}", "ownerReferences": [owner]},
                    "spec": {
                        "backoffLimit": 0,
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [
                                    {
                                        "name": "run",
                                        "image": IMAGE_TAGS[0],
                                        "imagePullPolicy": "Never",
                                        "command": ["true"],
                                    }
                                ],
                            }
                        },
                    },
                },
            )

        def history() -> list[str] | None:
            kept = [
                j
                for j in batch.list_namespaced_job(ns).items
                if any(o.uid == uid for o in j.metadata.owner_references or [])
            ]
            complete = [
                j
                for j in kept
                if any(
                    c.type == "Complete" and c.status == "True" for c in j.status.conditions or []
                )
            ]
            # all runs finished (only finished ones are deleted) and the oldest deleted
            if len(kept) == len(complete) == scheduled_audit.HISTORY_LIMIT:
                return sorted(j.metadata.name for j in kept)
            return None

        kept = wait_for(history, 120, f"{runs} runs cut to the history limit", every=2)
        assert f"{job}-run-0" not in kept, kept

        # -- a passing audit, written as the job writes it
        t1 = datetime.now(UTC).replace(microsecond=0)
        publish_as_the_job(
            command,
            local_cluster.kubeconfig_path,
            summary("audited", ns, "run-1", t1),
        )

        def last(run: str) -> dict[str, Any] | None:
            found = get_pipeline(api, ns, "audited")
            got = ((found or {}).get("status") or {}).get("lastReconciliation") or {}
            return found if got.get("runId") == run else None

        found = wait_for(lambda: last("run-1"), 30, "the passing result in status")
        lr = found["status"]["lastReconciliation"]
        assert lr["passed"] is True and lr["checked"] == 500 and lr["duplicates"] == 0
        assert lr["reportRef"]["configMap"] == "audited-reconciliation"
        healthy = condition(found, "ReconciliationHealthy")
        assert healthy is not None and healthy["status"] == "True"
        wait_for_event(api, ns, "audited", "Normal", "ReconciliationPassed")
        cm = core.read_namespaced_config_map("audited-reconciliation", ns)
        assert [r.name for r in cm.metadata.owner_references or []] == ["audited"]

        # -- a failing one: the job replaces the ConfigMap, the owner reference stays
        t2 = t1 + timedelta(seconds=5)
        publish_as_the_job(
            command,
            local_cluster.kubeconfig_path,
            summary("audited", ns, "run-2", t2, duplicates=2, missing=3, orderViolations=1),
        )
        found = wait_for(lambda: last("run-2"), 30, "the failing result in status")
        lr = found["status"]["lastReconciliation"]
        assert (lr["passed"], lr["duplicates"], lr["missing"], lr["orderViolations"]) == (
            False,
            2,
            3,
            1,
        )
        healthy = condition(found, "ReconciliationHealthy")
        assert healthy is not None and healthy["status"] == "False"
        assert healthy["reason"] == "AuditFailed"
        for text in ("2 duplicates", "3 missing", "1 order violations", "500"):
            assert text in healthy["message"]
        failed = wait_for_event(api, ns, "audited", "Warning", "ReconciliationFailed")
        assert "2 duplicates" in failed[0]
        cm = core.read_namespaced_config_map("audited-reconciliation", ns)
        assert [r.name for r in cm.metadata.owner_references or []] == ["audited"]
        text = op.metrics()
        assert (
            f'dedup_operator_reconciliations_total{{namespace="{ns}",pipeline="audited",'
            'result="failed"} 1.0' in text
        )
        assert (
            f'dedup_operator_reconciliation_missing{{namespace="{ns}",pipeline="audited"}} 3.0'
            in text
        )
        # the same result again is not news
        assert sum(1 for _, r, _ in events(api, ns, "audited") if r == "ReconciliationFailed") == 1

        # -- a summary the operator cannot read: one Warning, the status stays
        core.patch_namespaced_config_map(
            "audited-reconciliation", ns, {"data": {names.RECONCILIATION_SUMMARY_KEY: "{"}}
        )
        unreadable = wait_for_event(api, ns, "audited", "Warning", "ReconciliationUnreadable")
        assert "not JSON" in unreadable[0]
        lr = (get_pipeline(api, ns, "audited") or {})["status"]["lastReconciliation"]
        assert lr["runId"] == "run-2"

        # -- the reconciliation removed from the spec: its CronJob and RBAC go
        custom.patch_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            ns,
            names.PLURAL,
            "audited",
            {"spec": {"reconciliation": None}},
            _content_type="application/merge-patch+json",
        )
        wait_for(lambda: cron_job() is None, 30, "the CronJob deleted")

        def rbac_gone() -> bool:
            try:
                rbac.read_namespaced_role(job, ns)
            except ApiException as exc:
                return exc.status == 404
            return False

        wait_for(rbac_gone, 15, "the audit's Role deleted")
        found = wait_for(
            lambda: (
                (p := get_pipeline(api, ns, "audited"))
                and condition(p, "ReconciliationHealthy") is None
                and p
            ),
            15,
            "ReconciliationHealthy gone",
        )


def test_scheduled_spark_application_with_the_spark_operator(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    spark_operator_crds: None,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    ns = cluster_namespace.name
    api = cluster_namespace.api_client
    custom = client.CustomObjectsApi(api)
    group, version = scheduled_audit.SPARK_OPERATOR_GROUP, scheduled_audit.SPARK_OPERATOR_VERSION
    topic = topics(kafka, new_topic)
    job = names.reconciliation_job("sparky")
    with running_operator(local_cluster.kubeconfig_path, ns, tmp_path / "operator.log"):
        custom.create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            ns,
            names.PLURAL,
            pipeline_body("sparky", kafka.bootstrap, topic, local_cluster.storage_class),
        )

        def scheduled() -> dict[str, Any] | None:
            try:
                got: dict[str, Any] = custom.get_namespaced_custom_object(
                    group, version, ns, "scheduledsparkapplications", job
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return got

        ssa = wait_for(scheduled, 60, "the ScheduledSparkApplication")
        spec = ssa["spec"]
        assert spec["concurrencyPolicy"] == "Forbid"
        assert spec["schedule"] == NEVER
        assert (spec["successfulRunHistoryLimit"], spec["failedRunHistoryLimit"]) == (3, 3)
        assert spec["template"]["type"] == "Python" and spec["template"]["mode"] == "cluster"
        assert spec["template"]["executor"]["instances"] == 2
        assert spec["template"]["driver"]["serviceAccount"] == job
        with pytest.raises(ApiException) as no_cron:
            client.BatchV1Api(api).read_namespaced_cron_job(job, ns)
        assert no_cron.value.status == 404

        # a run as the Spark operator would start it, labelled with its schedule
        custom.create_namespaced_custom_object(
            group,
            version,
            ns,
            "sparkapplications",
            {
                "apiVersion": f"{group}/{version}",
                "kind": "SparkApplication",
                "metadata": {
                    "name": f"{job}-1700000000",
                    "labels": {scheduled_audit.SCHEDULED_APP_LABEL: job},
                },
                "spec": spec["template"],
                "status": {"applicationState": {"state": "COMPLETED"}},
            },
        )

        def state() -> dict[str, Any] | None:
            found = get_pipeline(api, ns, "sparky")
            lr = ((found or {}).get("status") or {}).get("lastReconciliation") or {}
            return lr if lr.get("sparkApplicationState") == "COMPLETED" else None

        lr = wait_for(state, 30, "the SparkApplication's state in status")
        assert lr["sparkApplication"] == f"{job}-1700000000"


def test_a_run_of_the_cron_job_audits_the_pipeline_with_executor_pods(
    local_cluster: RealCluster,
    cluster_namespace: ClusterNamespace,
    kafka: KafkaBroker,
    new_topic: NewTopic,
    tmp_path: Path,
) -> None:
    """The real thing: the workers deduplicate; a Job from the operator's CronJob runs
    the driver pod, which gets two executor pods from the API server and audits the
    topics; the result reaches the status. Then a duplicate planted in the output makes
    the next run fail and flips ReconciliationHealthy."""
    ns, api = cluster_namespace.name, cluster_namespace.api_client
    topic = topics(kafka, new_topic)
    name = "live"
    cron = names.reconciliation_job(name)
    ids = [f"ev-{i % 250}" for i in range(300)]  # 50 repeats within the window
    with running_operator(local_cluster.kubeconfig_path, ns, tmp_path / "operator.log"):
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            ns,
            names.PLURAL,
            pipeline_body(name, kafka.bootstrap, topic, local_cluster.storage_class),
        )
        produce(kafka.bootstrap, topic, [*(event(i) for i in ids), b"not json"])
        wait_for(
            lambda: len(read_committed(kafka.bootstrap, f"{topic}-out")) == 250 or None,
            180,
            "the workers to publish 250 ids",
            every=2,
        )

        def run_audit(job: str) -> tuple[dict[str, Any], ExecutorWatch]:
            watch = ExecutorWatch(api, ns)
            try:
                local_cluster.kubectl("create", "job", f"--from=cronjob/{cron}", job, "-n", ns)

                def finished() -> dict[str, Any] | None:
                    found = get_pipeline(api, ns, name)
                    lr = ((found or {}).get("status") or {}).get("lastReconciliation") or {}
                    return found if lr.get("runId") not in (None, *seen_runs) else None

                found = wait_for(finished, 300, f"the result of {job} in status", every=2)
            except AssertionError:
                pods = client.CoreV1Api(api).list_namespaced_pod(ns).items
                for pod in pods:
                    if pod.metadata.name.startswith(job):
                        print(local_cluster.pod_log(ns, pod.metadata.name)[-4000:])
                raise
            finally:
                watch.stop()
            seen_runs.add(found["status"]["lastReconciliation"]["runId"])
            return found, watch

        seen_runs: set[str] = set()
        found, watch = run_audit("audit-1")
        lr = found["status"]["lastReconciliation"]
        assert lr["passed"] is True, lr
        assert (lr["checked"], lr["duplicates"], lr["missing"]) == (301, 0, 0)
        healthy = condition(found, "ReconciliationHealthy")
        assert healthy is not None and healthy["status"] == "True"
        driver_pods = {
            p.metadata.name
            for p in client.CoreV1Api(api).list_namespaced_pod(ns).items
            if p.metadata.name.startswith("audit-1-")
        }
        # dedupctl reads the same result (the person's view of it)
        shown = dedupctl(
            "audit", name, "-n", ns, "-o", "json", kubeconfig=local_cluster.kubeconfig_path
        )
        assert shown.returncode == 0, (shown.stdout, shown.stderr)
        doc = json.loads(shown.stdout)["last"]
        assert (doc["runId"], doc["passed"], doc["checked"]) == (lr["runId"], True, 301)
        assert len(watch.seen) >= 2, watch.seen
        for executor, seen in watch.seen.items():
            owners = {owner for kind, owner in seen.owners if kind == "Pod"}
            assert owners and owners <= driver_pods, (executor, seen.owners, driver_pods)
            assert "Running" in seen.phases
            # containers of containerd, from the image, that registered with the driver
            # across nodes (their logs kept after Spark deleted them)
            assert seen.container_ids and all(
                c.startswith("containerd://") for c in seen.container_ids
            ), seen
            executor_log = local_cluster.pod_log(ns, executor)
            assert "Successfully registered with driver" in executor_log, executor_log[-2000:]

        # A duplicate planted in the output: the next run fails, with the numbers.
        first = read_committed(kafka.bootstrap, f"{topic}-out")[0]
        planted = Producer(kafka.client_config(**{"transactional.id": f"plant-{ns}"}))
        planted.init_transactions(30)
        planted.begin_transaction()
        planted.produce(
            f"{topic}-out",
            first.value(),
            first.key(),
            0,
            timestamp=first.timestamp()[1],
            headers=first.headers(),
        )
        planted.commit_transaction(30)
        # the next run started as a person would, `dedupctl audit --now` (a Job from the
        # CronJob, waited for with its progress): it fails, with the numbers, exit 1
        now = dedupctl(
            "audit", name, "--now", "-n", ns, "-o", "json",
            kubeconfig=local_cluster.kubeconfig_path, timeout=900,
        )  # fmt: skip
        assert now.returncode == ctl.AUDIT_FAILED, (now.stdout, now.stderr)
        assert "driver" in now.stderr  # the progress shown while it ran
        found = get_pipeline(api, ns, name) or {}
        lr = found["status"]["lastReconciliation"]
        assert json.loads(now.stdout)["last"]["runId"] == lr["runId"] not in seen_runs
        assert (lr["passed"], lr["duplicates"]) == (False, 1), lr
        jobs = client.BatchV1Api(api).list_namespaced_job(ns).items
        assert any(
            j.metadata.owner_references and j.metadata.owner_references[0].kind == "CronJob"
            and j.metadata.name not in ("audit-1",)
            for j in jobs
        )  # fmt: skip
        healthy = condition(found, "ReconciliationHealthy")
        assert healthy is not None and healthy["status"] == "False"
        assert "1 duplicate" in healthy["message"], healthy
        wait_for_event(api, ns, name, "Warning", "ReconciliationFailed")
