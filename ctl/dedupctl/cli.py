"""`dedupctl` (and `kubectl dedup`, kubectl's plugin convention through the
`kubectl-dedup` entry point): a pipeline's health, its handovers and its audits.

    dedupctl status [PIPELINE] [-A] [-o table|json|yaml] [--watch]
    dedupctl failovers PIPELINE [-o table|json|yaml]
    dedupctl audit PIPELINE [--now] [--timeout S] [-o table|json|yaml]
    dedupctl switch-ownership PIPELINE --yes
    dedupctl finalize-upgrade PIPELINE --yes
    dedupctl version

`--kubeconfig`, `--context`, `-n/--namespace` as kubectl (KUBECONFIG, then
~/.kube/config, then the pod's service account). This module is the shell: it reads the
API and hands plain dicts to the pure `view`. Exit codes (docs/operations.md#dedupctl):
0 ok (audit: passed), 1 the audit failed, 2 usage, 3 no cluster reachable or no usable
kubeconfig, 4 no such pipeline or namespace, 5 the DedupPipeline CRD is not installed,
6 forbidden or unauthorized, 7 an audit could not be run or did not finish in time,
8 finalize-upgrade: the pipeline is not yet all on this release.
Each error is one line on stderr, `dedupctl: ...`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import yaml

from dedup_contract import kube_client, names
from dedup_contract.release import VERSION
from dedup_contract.store_format import RELEASES_BEFORE_FINALIZED
from dedup_contract.timefmt import format_time
from dedup_contract.worker_metrics import scrape
from dedupctl import finalize, view

OK, AUDIT_FAILED, USAGE, UNREACHABLE, NOT_FOUND, NO_CRD, FORBIDDEN, AUDIT_UNFINISHED = range(8)
NOT_READY = 8  # finalize-upgrade: the pipeline is not all on this release yet
REQUEST_TIMEOUT_S = 10.0


class CtlError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------------------ the API


class Cluster:
    """The few reads and writes dedupctl makes, with a person's errors turned into
    CtlError (one line, an exit code)."""

    def __init__(self, kubeconfig: str | None, context: str | None, namespace: str | None):
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        self._client = client
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        default_path = Path.home() / ".kube" / "config"
        context_ns: str | None = None
        try:
            if path or default_path.exists() or context:
                file = path or str(default_path)
                if not Path(file).exists():
                    raise CtlError(UNREACHABLE, f"kubeconfig {file} not found")
                self.api = kube_client.api_client(file, context=context, retries=1)
                contexts, active = config.list_kube_config_contexts(file)  # type: ignore[no-untyped-call]
                chosen = next((c for c in contexts if c["name"] == context), active)
                context_ns = ((chosen or {}).get("context") or {}).get("namespace")
            else:  # in-cluster only: no kubeconfig to fall back on
                self.api = kube_client.api_client(default_kubeconfig=False, retries=1)
                ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                context_ns = ns_file.read_text().strip() if ns_file.exists() else None
        except ConfigException as exc:
            raise CtlError(UNREACHABLE, f"no usable kubeconfig: {exc}") from None
        self.host = str(self.api.configuration.host)
        self.namespace = namespace or context_ns or "default"
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.batch = client.BatchV1Api(self.api)

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args) with a request timeout; ApiException 404 passes through as None."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status in (401, 403):
                word = "forbidden" if exc.status == 403 else "unauthorized"
                raise CtlError(FORBIDDEN, f"{word}: cannot {what}: {_api_message(exc)}") from None
            raise CtlError(
                UNREACHABLE, f"the API server at {self.host} answered {exc.status} to {what}"
            ) from None
        except (HTTPError, OSError) as exc:
            raise CtlError(
                UNREACHABLE, f"cannot reach the cluster at {self.host}: {_root_cause(exc)}"
            ) from None

    def check_crd(self) -> None:
        """CtlError(NO_CRD) unless the API server serves dedup.io/v1alpha1 deduppipelines."""
        found = self.call(
            f"read the API's resources of {names.GROUP}/{names.VERSION}",
            self.custom.get_api_resources,
            names.GROUP,
            names.VERSION,
        )
        plurals = {r.name for r in (found.resources if found is not None else None) or []}
        if names.PLURAL not in plurals:
            raise CtlError(
                NO_CRD,
                f"the DedupPipeline CRD ({names.PLURAL}.{names.GROUP}) is not installed in "
                f"the cluster at {self.host}",
            )

    def pipeline(self, name: str) -> dict[str, Any]:
        found = self.call(
            f"get deduppipelines {name} in namespace {self.namespace}",
            self.custom.get_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            self.namespace,
            names.PLURAL,
            name,
        )
        if found is None:
            self.check_crd()
            raise CtlError(NOT_FOUND, f'pipeline "{name}" not found in namespace {self.namespace}')
        return dict(found)

    def pipelines(self, all_namespaces: bool) -> list[dict[str, Any]]:
        if all_namespaces:
            found = self.call(
                "list deduppipelines in all namespaces",
                self.custom.list_cluster_custom_object,
                names.GROUP,
                names.VERSION,
                names.PLURAL,
            )
        else:
            found = self.call(
                f"list deduppipelines in namespace {self.namespace}",
                self.custom.list_namespaced_custom_object,
                names.GROUP,
                names.VERSION,
                self.namespace,
                names.PLURAL,
            )
        if found is None:
            self.check_crd()
            return []
        items = [dict(i) for i in found.get("items") or []]
        return sorted(items, key=lambda b: (b["metadata"]["namespace"], b["metadata"]["name"]))

    def worker_metrics(self, namespace: str, pod: str, pod_ip: str | None) -> str | None:
        """A worker's /metrics through the API server's pod proxy (what `kubectl get
        --raw /api/v1/namespaces/NS/pods/POD:9400/proxy/metrics` reads), else straight
        from the pod's IP (inside the cluster's network; on the local cluster, whose pod
        IPs are loopback addresses the API server refuses to proxy to); None when
        neither answers (the columns then show "—")."""
        try:
            text = self.core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod}:{names.METRICS_PORT}", namespace, "metrics", _request_timeout=3
            )
            if isinstance(text, str) and text:
                return text
        except Exception:
            pass
        return scrape(pod_ip, timeout_s=1.0) if pod_ip else None

    def pod_ips(self, namespace: str) -> dict[str, str]:
        found = self.call(
            f"list pods in namespace {namespace}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=names.LABEL_PIPELINE,
        )
        return {
            p.metadata.name: p.status.pod_ip
            for p in (found.items if found is not None else [])
            if p.status is not None and p.status.pod_ip
        }

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        found = self.call(
            f"list events in namespace {namespace}",
            self.core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.name={name},involvedObject.kind={names.KIND}",
        )
        out = []
        for e in found.items if found is not None else []:
            at = e.last_timestamp or e.event_time or e.first_timestamp
            at = at or e.metadata.creation_timestamp
            out.append(
                {
                    "type": e.type,
                    "reason": e.reason,
                    "message": e.message,
                    "time": format_time(at) if at else None,
                }
            )
        return out

    def patch_pipeline(self, name: str, patch: dict[str, Any]) -> None:
        self.call(
            f"patch deduppipelines {name} in namespace {self.namespace}",
            self.custom.patch_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            self.namespace,
            names.PLURAL,
            name,
            patch,
        )

    def annotate_pipeline(self, name: str, key: str, value: str) -> None:
        self.patch_pipeline(name, {"metadata": {"annotations": {key: value}}})

    def worker_pods(self, name: str) -> list[dict[str, Any]]:
        found = self.call(
            f"list pods in namespace {self.namespace}",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{names.LABEL_PIPELINE}={name},"
            f"{names.LABEL_COMPONENT}={names.COMPONENT_WORKER}",
        )
        items = [] if found is None else found.items
        return [self.api.sanitize_for_serialization(pod) for pod in items]  # type: ignore[no-untyped-call]

    def finalize_pipeline(self, name: str, release: str) -> None:
        self.patch_pipeline(name, {"spec": {"upgrade": {"finalizedRelease": release}}})

    def apply_guard(self, policy: dict[str, Any], binding: dict[str, Any]) -> None:
        """Create or replace the rollback guard (cluster-scoped: a cluster admin's)."""
        admission = self._client.AdmissionregistrationV1Api(self.api)
        for body, read, create, replace in (
            (
                policy,
                admission.read_validating_admission_policy,
                admission.create_validating_admission_policy,
                admission.replace_validating_admission_policy,
            ),
            (
                binding,
                admission.read_validating_admission_policy_binding,
                admission.create_validating_admission_policy_binding,
                admission.replace_validating_admission_policy_binding,
            ),
        ):
            kind, name = body["kind"], body["metadata"]["name"]
            held = self.call(f"get {kind} {name}", read, name)
            if held is None:
                self.call(f"create {kind} {name}", create, body)
            else:
                body = {**body, "metadata": {**body["metadata"],
                        "resourceVersion": held.metadata.resource_version}}  # fmt: skip
                self.call(f"replace {kind} {name}", replace, name, body)

    def config_map_data(self, namespace: str, name: str, key: str) -> str | None:
        found = self.call(
            f"get configmap {name}", self.core.read_namespaced_config_map, name, namespace
        )
        return None if found is None else (found.data or {}).get(key)


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message"))
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _root_cause(exc: BaseException) -> str:
    reason: object = getattr(exc, "reason", None)
    while isinstance(reason, BaseException) and getattr(reason, "reason", None) is not None:
        reason = getattr(reason, "reason", None)
    text = str(reason or exc)
    return text.split(": ", 1)[-1] if "Connection refused" in text else text


def _now() -> datetime:
    return datetime.now(UTC)


def emit(doc: Any, output: str, render: Callable[[], str]) -> None:
    if output == "json":
        print(json.dumps(doc, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), end="")
    else:
        print(render())


# ----------------------------------------------------------------------------- commands


def _samples(
    cluster: Cluster, bodies: Sequence[Mapping[str, Any]]
) -> dict[tuple[str, str, int], view.WorkerSample]:
    targets = [
        (b["metadata"]["namespace"], b["metadata"]["name"], int(e["partition"]), str(e["pod"]))
        for b in bodies
        for e in (b.get("status") or {}).get("partitions") or []
        if e.get("pod") and e.get("phase") == "Running"
    ]

    ips: dict[str, str] = {}
    for ns in sorted({t[0] for t in targets}):
        ips.update({f"{ns}/{pod}": ip for pod, ip in cluster.pod_ips(ns).items()})

    def one(t: tuple[str, str, int, str]) -> view.WorkerSample | None:
        text = cluster.worker_metrics(t[0], t[3], ips.get(f"{t[0]}/{t[3]}"))
        return None if text is None else view.parse_worker_metrics(text, time.monotonic())

    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(one, targets))
    return {(t[0], t[1], t[2]): s for t, s in zip(targets, got, strict=True) if s is not None}


def status_document(
    cluster: Cluster,
    pipeline: str | None,
    all_namespaces: bool,
    before: Mapping[tuple[str, str, int], view.WorkerSample] | None,
    sample_s: float,
) -> tuple[dict[str, Any], dict[tuple[str, str, int], view.WorkerSample]]:
    """The status document and this round's worker samples (the next round's `before`).
    Without `before`, samples twice `sample_s` apart to tell the input rate."""
    bodies = [cluster.pipeline(pipeline)] if pipeline else cluster.pipelines(all_namespaces)
    if before is None and sample_s > 0:
        before = _samples(cluster, bodies)
        if before:
            time.sleep(sample_s)
    now = _samples(cluster, bodies)
    docs = []
    for b in bodies:
        ns, name = b["metadata"]["namespace"], b["metadata"]["name"]
        mine = {p: s for (n, m, p), s in now.items() if (n, m) == (ns, name)}
        rates = {p: view.input_rate((before or {}).get((ns, name, p)), s) for p, s in mine.items()}
        docs.append(view.pipeline_doc(b, mine, rates))
    return view.status_doc(docs), now


def _render_status(doc: Mapping[str, Any]) -> str:
    return view.render_status(doc, _now())


def cmd_status(cluster: Cluster, args: argparse.Namespace) -> int:
    before = None
    while True:
        doc, before = status_document(
            cluster, args.pipeline, args.all_namespaces, before, args.rate_sample
        )
        if not args.watch:
            emit(doc, args.output, functools.partial(_render_status, doc))
            return OK
        if args.output == "table":
            if sys.stdout.isatty():
                print("\033[H\033[2J", end="")
            print(f"Every {args.interval:g}s: dedupctl status   {format_time(_now())}\n")
            print(view.render_status(doc, _now()), flush=True)
        elif args.output == "json":  # one document per line and refresh (JSON Lines)
            print(json.dumps(doc), flush=True)
        else:
            emit(doc, args.output, str)
            print("---", flush=True)
        time.sleep(args.interval)


def cmd_failovers(cluster: Cluster, args: argparse.Namespace) -> int:
    body = cluster.pipeline(args.pipeline)
    rows = view.failover_rows(body, cluster.events(cluster.namespace, args.pipeline))
    emit(
        {"pipeline": args.pipeline, "failovers": rows},
        args.output,
        lambda: view.render_failovers(rows),
    )
    return OK


def _audit_doc(cluster: Cluster, body: Mapping[str, Any]) -> dict[str, Any]:
    last = (body.get("status") or {}).get("lastReconciliation") or {}
    cm = (last.get("reportRef") or {}).get("configMap") or names.reconciliation_result(
        body["metadata"]["name"]
    )
    text = cluster.config_map_data(cluster.namespace, cm, names.RECONCILIATION_SUMMARY_KEY)
    summary = None
    if text:
        try:
            loaded = json.loads(text)
            summary = loaded if isinstance(loaded, dict) else None
        except ValueError:
            summary = None
    if summary is not None and summary.get("runId") != last.get("runId"):
        summary = None  # a newer run than status shows yet, or an older one
    return view.audit_doc(body, summary)


def cmd_audit(cluster: Cluster, args: argparse.Namespace) -> int:
    body = cluster.pipeline(args.pipeline)
    if args.now:
        body = run_audit_now(cluster, body, args.timeout)
    doc = _audit_doc(cluster, body)
    emit(doc, args.output, lambda: view.render_audit(doc, _now()))
    last = doc["last"]
    if not last:
        return AUDIT_UNFINISHED
    return OK if last.get("passed") else AUDIT_FAILED


def cmd_switch_ownership(cluster: Cluster, args: argparse.Namespace) -> int:
    """Ask the operator to switch an OwnershipOff pipeline to ownership (the annotation
    `dedup.io/switch-to-ownership: "true"`); without --yes only say what it would do."""
    body = cluster.pipeline(args.pipeline)
    where = f"{cluster.namespace}/{args.pipeline}"
    state = view.switch_state(body)
    if state == view.SWITCH_OWNED:
        print(f"pipeline {where} runs under ownership already: nothing to switch")
        return OK
    if state == view.SWITCH_DONE:
        when = ((body.get("status") or {}).get("ownership") or {}).get("switched")
        print(f"pipeline {where} was switched to ownership at {when}: nothing to do")
        return OK
    if state == view.SWITCH_IN_PROGRESS:
        print(
            f"pipeline {where}: the switch to ownership is under way "
            f"(follow it: dedupctl status {args.pipeline} -n {cluster.namespace})"
        )
        return OK
    print(view.switch_plan_text(body))
    if not args.yes:
        fail(USAGE, f"nothing done: add --yes to switch pipeline {where} to ownership")
    cluster.annotate_pipeline(args.pipeline, names.ANNOTATION_SWITCH_TO_OWNERSHIP, "true")
    print(
        f"pipeline {where}: switch to ownership asked (annotation "
        f'{names.ANNOTATION_SWITCH_TO_OWNERSHIP}="true"); follow it: dedupctl status '
        f"{args.pipeline} -n {cluster.namespace}"
    )
    return OK


def cmd_finalize_upgrade(cluster: Cluster, args: argparse.Namespace) -> int:
    """Finalize the pipeline's upgrade to this release: install the rollback guard, then
    set spec.upgrade.finalizedRelease (the operator rolls the workers, which write the
    newest store format); without --yes only say what it would do."""
    body = cluster.pipeline(args.pipeline)
    where = f"{cluster.namespace}/{args.pipeline}"
    done = ((body.get("spec") or {}).get("upgrade") or {}).get("finalizedRelease")
    if done == VERSION:
        print(f"pipeline {where} is finalized at release {VERSION} already: nothing to do")
        return OK
    why_not = finalize.blockers(body, cluster.worker_pods(args.pipeline), VERSION)
    if why_not:
        fail(NOT_READY, f"pipeline {where} cannot be finalized yet: " + "; ".join(why_not))
    refused = ", ".join(RELEASES_BEFORE_FINALIZED)
    print(
        f"pipeline {where}: finalize the upgrade to release {VERSION}. Its workers roll one "
        f"at a time and mark their stores format 3, which release {refused} cannot open; "
        f"from then on a rollback to {refused} is refused (ValidatingAdmissionPolicy "
        f"{finalize.GUARD})."
    )
    if not args.yes:
        fail(USAGE, f"nothing done: add --yes to finalize pipeline {where}")
    cluster.apply_guard(
        finalize.guard_policy(RELEASES_BEFORE_FINALIZED, VERSION), finalize.guard_binding()
    )
    cluster.finalize_pipeline(args.pipeline, VERSION)
    print(
        f"pipeline {where}: finalized at release {VERSION} (spec.upgrade.finalizedRelease); "
        f"follow the roll: dedupctl status {args.pipeline} -n {cluster.namespace}"
    )
    return OK


def run_audit_now(cluster: Cluster, body: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """Starts a run of the pipeline's scheduled audit now (a Job from its CronJob, as
    `kubectl create job --from=cronjob/...` does) and waits until its result reaches
    the pipeline's status, showing progress on stderr. Returns the pipeline then."""
    name = body["metadata"]["name"]
    ns = cluster.namespace
    if not (body.get("spec") or {}).get("reconciliation"):
        raise CtlError(
            AUDIT_UNFINISHED, f"{name}: no audit scheduled (spec.reconciliation is not set)"
        )
    cron_name = names.reconciliation_job(name)
    cron = cluster.call(
        f"get cronjob {cron_name}", cluster.batch.read_namespaced_cron_job, cron_name, ns
    )
    if cron is None:
        raise CtlError(
            AUDIT_UNFINISHED,
            f"{name}: no CronJob {cron_name} (the operator has not created it yet, or the "
            "audit runs as a ScheduledSparkApplication: start it with the Spark operator)",
        )
    before = ((body.get("status") or {}).get("lastReconciliation") or {}).get("time")
    job_name = f"{cron_name[:50]}-now-{int(time.time()) % 100000:05d}"
    template: dict[str, Any] = cluster.api.sanitize_for_serialization(cron.spec.job_template)  # type: ignore[no-untyped-call]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": ns,
            "labels": (template.get("metadata") or {}).get("labels") or {},
            "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": cron_name,
                    "uid": cron.metadata.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": template["spec"],
    }
    cluster.call(f"create job {job_name}", cluster.batch.create_namespaced_job, ns, job)
    progress = Progress(f"audit {ns}/{name}: Job {job_name}")
    start = time.monotonic()
    failed_at: float | None = None
    try:
        while True:
            found = cluster.pipeline(name)
            last = (found.get("status") or {}).get("lastReconciliation") or {}
            if last.get("time") and last.get("time") != before:
                progress.done(f"result in status after {time.monotonic() - start:.0f}s")
                return found
            j = cluster.call(f"get job {job_name}", cluster.batch.read_namespaced_job, job_name, ns)
            job_state = _job_state(j)
            if job_state == "failed" and failed_at is None:
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > 60:
                progress.done("failed")
                raise CtlError(
                    AUDIT_UNFINISHED,
                    f"audit Job {job_name} failed without a result in status; see "
                    f"kubectl logs -n {ns} job/{job_name}",
                )
            if time.monotonic() - start > timeout_s:
                progress.done("timed out")
                raise CtlError(
                    AUDIT_UNFINISHED,
                    f"audit Job {job_name} gave no result within {timeout_s:.0f}s "
                    f"(it keeps running; dedupctl audit {name} shows it later)",
                )
            progress.update(_audit_pods(cluster, ns, job_name) + f", job {job_state}")
            time.sleep(2)
    except KeyboardInterrupt:
        progress.done("interrupted (the Job keeps running)")
        raise


def _job_state(job: Any) -> str:
    if job is None:
        return "gone"
    s = job.status
    if s is None:
        return "pending"
    for c in s.conditions or []:
        if c.status == "True" and c.type in ("Failed", "Complete", "SuccessCriteriaMet"):
            return "failed" if c.type == "Failed" else "complete"
    return "running" if s.active else "pending"


def _audit_pods(cluster: Cluster, ns: str, job_name: str) -> str:
    pods = cluster.call("list pods", cluster.core.list_namespaced_pod, ns)
    drivers, executors = [], []
    for pod in pods.items if pods is not None else []:
        labels = pod.metadata.labels or {}
        if (
            labels.get("job-name") == job_name
            or labels.get("batch.kubernetes.io/job-name") == job_name
        ):
            drivers.append(pod)
    driver_names = {p.metadata.name for p in drivers}
    for pod in pods.items if pods is not None else []:
        owners = {o.name for o in pod.metadata.owner_references or []}
        if owners & driver_names:
            executors.append(pod)
    driver = drivers[0].status.phase if drivers else "not created"
    running = sum(1 for p in executors if p.status.phase == "Running")
    return f"driver {driver}, executors {running} running of {len(executors)}"


class Progress:
    """One line of progress on stderr: redrawn in place on a terminal, else a line every
    15 s."""

    FRAMES = "|/-\\"

    def __init__(self, what: str) -> None:
        self.what, self.start, self.n, self.last_line = what, time.monotonic(), 0, -1e9
        self.tty = sys.stderr.isatty()

    def update(self, state: str) -> None:
        elapsed = time.monotonic() - self.start
        self.n += 1
        if self.tty:
            line = f"\r{self.FRAMES[self.n % 4]} {self.what}: {state} ({elapsed:.0f}s)"
            print(line.ljust(100), end="", file=sys.stderr, flush=True)
        elif elapsed - self.last_line >= 15:
            self.last_line = elapsed
            print(f"{self.what}: {state} ({elapsed:.0f}s)", file=sys.stderr, flush=True)

    def done(self, state: str) -> None:
        end = "\r" if self.tty else ""
        print(
            f"{end}{self.what}: {state}".ljust(100 if self.tty else 0), file=sys.stderr, flush=True
        )


# ---------------------------------------------------------------------------------- CLI


def parser(prog: str = "dedupctl") -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="kubeconfig file")
    common.add_argument("--context", default=argparse.SUPPRESS, help="kubeconfig context")
    common.add_argument(
        "-n", "--namespace", default=argparse.SUPPRESS, help="namespace (default: the context's)"
    )
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")

    p = argparse.ArgumentParser(
        prog=prog,
        parents=[common],
        description="Status, handovers and audits of DedupPipelines.",
        epilog="exit codes: 0 ok, 1 audit failed, 2 usage, 3 cluster unreachable, "
        "4 not found, 5 CRD not installed, 6 forbidden, 7 audit not run or unfinished, "
        "8 not all on this release (finalize-upgrade)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("status", parents=[common, out], help="pipelines and their partitions")
    s.add_argument("pipeline", nargs="?")
    s.add_argument("-A", "--all-namespaces", action="store_true")
    s.add_argument("-w", "--watch", action="store_true", help="refresh in place")
    s.add_argument("--interval", type=float, default=2.0, help="--watch refresh seconds")
    s.add_argument(
        "--rate-sample",
        type=float,
        default=1.0,
        help="seconds between the two scrapes that give the input rate (0: no rate)",
    )
    f = sub.add_parser("failovers", parents=[common, out], help="handover history")
    f.add_argument("pipeline")
    a = sub.add_parser("audit", parents=[common, out], help="the last audit's findings")
    a.add_argument("pipeline")
    a.add_argument("--now", action="store_true", help="run the scheduled audit now and wait")
    a.add_argument("--timeout", type=float, default=900.0, help="--now: seconds to wait")
    sub.add_parser("version", help="the release of dedupctl")
    w = sub.add_parser(
        "switch-ownership",
        parents=[common],
        help="switch a pipeline that ran before ownership (OwnershipOff) to ownership",
    )
    w.add_argument("pipeline")
    w.add_argument(
        "--yes", action="store_true", help="do it (without: only say what it would do, exit 2)"
    )
    z = sub.add_parser(
        "finalize-upgrade",
        parents=[common],
        help="finalize a pipeline's upgrade to this release (no rollback after it)",
    )
    z.add_argument("pipeline")
    z.add_argument(
        "--yes", action="store_true", help="do it (without: only say what it would do, exit 2)"
    )
    return p


COMMANDS: dict[str, Callable[[Cluster, argparse.Namespace], int]] = {
    "status": cmd_status,
    "failovers": cmd_failovers,
    "audit": cmd_audit,
    "switch-ownership": cmd_switch_ownership,
    "finalize-upgrade": cmd_finalize_upgrade,
}


def fail(code: int, message: str) -> NoReturn:
    print(f"dedupctl: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def main(argv: list[str] | None = None, prog: str = "dedupctl") -> int:
    args = parser(prog).parse_args(argv)
    if args.command == "version":  # needs no cluster
        print(f"dedupctl {VERSION}")
        return OK
    try:
        cluster = Cluster(
            getattr(args, "kubeconfig", None),
            getattr(args, "context", None),
            getattr(args, "namespace", None),
        )
        return COMMANDS[args.command](cluster, args)
    except CtlError as exc:
        fail(exc.code, str(exc))
    except KeyboardInterrupt:
        return OK if getattr(args, "watch", False) else 130
    except BrokenPipeError:
        return OK


def kubectl_plugin() -> int:
    """`kubectl dedup ...`: kubectl runs `kubectl-dedup` from PATH with the rest."""
    return main(prog="kubectl dedup")


if __name__ == "__main__":
    raise SystemExit(main())
