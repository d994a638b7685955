"""The operator at scale on the bare control plane, with simulated kubelets and workers.

    python bench/operator_scale.py [--pipelines 100] [--partitions 10] [--nodes 50]
                                   [--steady-s 300] [--no-baseline] [--record]

One invocation, on a real control plane (etcd, kube-apiserver, every controller) and a
real Kafka broker (the topic checks), with `dedup_local.kubelet_simulation.Kubelets`
playing the kubelets and the workers (named as a simulation: nodes renew their heartbeat
Leases every 10 s and report status every 60 s, worker pods are reported Running and
Ready once their volume is attached, each worker renews its Lease by the worker's rule;
no /metrics is served, so the status counters stay empty). Volumes are CSI volumes of the
local cluster's driver: the attach/detach controller attaches and detaches them through
VolumeAttachments, which the local cluster's attacher rule marks attached (never on two
nodes at once), so a crowded node's handover includes every volume's detach:

1. **Baseline**: a plain script creates what the operator creates for the same
   partitions (a PVC, a Lease and a pod each; a Service and a PodDisruptionBudget per
   pipeline) directly, through a client with the operator's default request limit
   (`--api-qps` 50/s, bursts of 100), and the time until every pod is Ready is taken.
2. **Apply -> all Ready**: the operator (production timings: `--interval 5`, the CRD's
   failover defaults) runs as a service account; every pipeline is created at once, and
   the time until each reports all its partitions Ready is taken.
3. **Steady state** over `--steady-s`: the operator's CPU (a share of one core), its peak RSS,
   API requests per second by verb counted from the API server's audit log by the
   operator's user (not by its own counters), list calls, status writes per second, the
   host's CPU, and how long the simulation's renewal rounds took (a saturated run).
4. **A crowded node dies**: the node carrying the most pipelines' partitions stops
   (no heartbeats, its workers stop renewing) just after its heartbeat Lease's renewal,
   so that the operator decides as late as `nodeLostAfter` allows (the worst case);
   kill -> every replacement's first Lease renewal at its new epoch, min/median/max,
   and the median second of each step after the kill.
5. **The leader dies**: a second replica has stood by since the start; the leader is
   killed (SIGKILL) and, at the same moment, one worker pod is deleted (work for the
   new leader); kill -> the standby's "became leader", kill -> its FailoverStarted for
   that partition (it acts), and how many other handovers it began (spurious).

Targets (issue 30): apply -> Ready within 1.5x the baseline; steady: no list calls from
a pass, CPU <= 5% of a core, RSS <= 256 MiB at 1,000 partitions; crowded node: every
replacement renewing <= 30 s after the kill; leader kill: the new leader acting <= 2
lease durations after the kill, 0 spurious handovers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import results as bench_results
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from worker_throughput import cpu_seconds, peak_rss_mib

from dedup_contract import kube_client, names
from dedup_contract.timefmt import parse_time
from dedup_local.cluster.timings import ClusterTimings
from dedup_local.control_plane import ControlPlane
from dedup_local.kafka import KafkaBroker
from dedup_local.kubelet_simulation import Kubelets, simulated_output, simulated_pipeline
from dedup_local.operator_process import OperatorProcess, running_operator
from dedup_local.paths import REPO_ROOT
from dedup_operator.cli import API_BURST, API_QPS

NAMESPACE, BASELINE_NAMESPACE = "scale", "scale-baseline"
OPERATOR_SA = "dedup-operator"
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SA}"
TARGET_APPLY_RATIO, TARGET_CPU, TARGET_RSS_MIB, TARGET_CROWDED_S = 1.5, 0.05, 256, 30.0
LEADER_LEASE_S = 15  # the chart's default
# each simulated node as a kubelet: its heartbeat Lease renewed every 10 s (the kubelet's
# default; the operator judges a node lost when it is unchanged for nodeLostAfter, 20 s),
# its status reported every 60 s (a kubelet with a Lease: on a change, else every 5 min)
NODE_LEASE_S, HEARTBEAT_S = ClusterTimings().node_lease_renew_s, 60.0


def attached_volumes(api: client.ApiClient, volumes: Iterable[str]) -> dict[str, str]:
    """Which of `volumes` are attached, by VolumeAttachment: volume -> node."""
    wanted = set(volumes)
    listed = client.StorageV1Api(api).list_volume_attachment()
    return {
        str(va.spec.source.persistent_volume_name): str(va.spec.node_name)
        for va in listed.items
        if va.status is not None
        and va.status.attached
        and va.spec.source.persistent_volume_name in wanted
    }


def wait_until(probe: Any, timeout_s: float, what: str, every: float = 1.0) -> float:
    """Seconds until `probe()` is true; raises on timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if probe():
            return time.monotonic() - t0
        time.sleep(every)
    raise SystemExit(f"bench: timed out after {timeout_s:.0f}s waiting for {what}")


def operator_kubeconfig(cp: ControlPlane, api: client.ApiClient, path: Path) -> Path:
    """A kubeconfig of the service account OPERATOR_SA (bound to cluster-admin: the bench
    measures load, the chart's RBAC is tested elsewhere), so the audit log has its user."""
    core: Any = client.CoreV1Api(api)
    core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": OPERATOR_SA}})
    rbac: Any = client.RbacAuthorizationV1Api(api)
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": f"bench-{OPERATOR_SA}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": NAMESPACE}],
        }
    )
    token = core.create_namespaced_service_account_token(
        OPERATOR_SA, NAMESPACE, {"spec": {"expirationSeconds": 86400}}
    ).status.token
    config = yaml.safe_load(cp.kubeconfig_path.read_text())
    config["users"] = [{"name": OPERATOR_SA, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = OPERATOR_SA
    path.write_text(yaml.safe_dump(config))
    return path


def baseline(
    api_admin: client.ApiClient,
    kubeconfig: Path,
    pipelines: list[str],
    partitions: int,
    kubelets: Kubelets,
) -> float:
    """What the operator creates, created directly at the operator's request rate; seconds
    until every pod is Ready."""
    api = kube_client.api_client(kubeconfig, qps=API_QPS, burst=API_BURST)  # the operator's
    core: Any = client.CoreV1Api(api)
    coordination: Any = client.CoordinationV1Api(api)
    policy: Any = client.PolicyV1Api(api)
    ns = BASELINE_NAMESPACE
    t0 = time.monotonic()
    for name in pipelines:
        selector = {names.LABEL_PIPELINE: name, names.LABEL_COMPONENT: names.COMPONENT_WORKER}
        core.create_namespaced_service(
            ns,
            {
                "metadata": {"name": f"{name}-workers"},
                "spec": {"clusterIP": "None", "selector": selector, "ports": [{"port": 9400}]},
            },
        )
        policy.create_namespaced_pod_disruption_budget(
            ns,
            {
                "metadata": {"name": f"{name}-workers"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
            },
        )
        for p in range(partitions):
            claim = names.volume_claim(name, p)
            core.create_namespaced_persistent_volume_claim(
                ns,
                {
                    "metadata": {"name": claim, "labels": {names.LABEL_PIPELINE: name}},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "",
                        "resources": {"requests": {"storage": "10Gi"}},
                    },
                },
            )
            coordination.create_namespaced_lease(
                ns,
                {
                    "metadata": {
                        "name": names.lease(name, p),
                        "labels": {names.LABEL_PIPELINE: name},
                    },
                    "spec": {"leaseDurationSeconds": 15, "leaseTransitions": 0},
                },
            )
            labels = {**selector, names.LABEL_PARTITION: str(p), names.LABEL_EPOCH: "1"}
            core.create_namespaced_pod(ns, {
                "metadata": {"name": f"{name}-p{p}-e1", "labels": labels},
                "spec": {
                    "nodeSelector": {kubelets.label: "yes"},
                    "containers": [{"name": "worker", "image": "dedup-operator:bench", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}],
                    "volumes": [{"name": "store", "persistentVolumeClaim": {"claimName": claim}}],
                },
            })  # fmt: skip
    total = len(pipelines) * partitions
    admin: Any = client.CoreV1Api(api_admin)

    def all_ready() -> bool:
        pods = admin.list_namespaced_pod(ns).items
        return sum(1 for p in pods if p.status.phase == "Running") == total

    wait_until(all_ready, 1800, "the baseline's pods Running")
    return time.monotonic() - t0


def ready_pipelines(api: client.ApiClient, partitions: int) -> int:
    found: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
        names.GROUP, names.VERSION, NAMESPACE, names.PLURAL
    )
    return sum(
        1 for p in found["items"] if (p.get("status") or {}).get("readyPartitions") == partitions
    )


def host_busy() -> tuple[float, float]:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, float(sum(values))


def audit_in(cp: ControlPlane, since: datetime, until: datetime) -> list[dict[str, Any]]:
    out = []
    for event in cp.audit_events(OPERATOR_USER):
        at = parse_time(event.get("stageTimestamp"))
        if at is not None and since <= at <= until:
            out.append(event)
    return out


def passes_and_wakes(metrics: str) -> tuple[float, dict[str, float]]:
    """The operator's passes (every pipeline, every result) and the passes a change
    called for by what called for them (`dedup_operator_passes_woken_total`'s kind),
    from its /metrics."""
    passes, woken = 0.0, defaultdict[str, float](float)
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if not sample.name.endswith("_total"):  # a counter's `_created` sample
                continue
            if family.name == "dedup_operator_reconciles":
                passes += float(sample.value)
            elif family.name == "dedup_operator_passes_woken":
                woken[sample.labels.get("kind", "?")] += float(sample.value)
    return passes, woken


def steady(
    cp: ControlPlane, op: OperatorProcess, pid: int, kubelets: Kubelets, seconds: float
) -> dict[str, Any]:
    rounds_before = len(kubelets.step_seconds)
    passes0, woken0 = passes_and_wakes(op.metrics())
    cpu0, busy0, start = cpu_seconds(pid), host_busy(), datetime.now().astimezone()
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    cpu1, busy1, end = cpu_seconds(pid), host_busy(), datetime.now().astimezone()
    passes1, woken1 = passes_and_wakes(op.metrics())
    events = audit_in(cp, start, end)
    verbs = Counter(str(e.get("verb")) for e in events)

    def ref(event: dict[str, Any]) -> dict[str, Any]:
        return dict(event.get("objectRef") or {})

    status_writes = sum(
        1 for e in events
        if e.get("verb") == "patch" and ref(e).get("resource") == names.PLURAL and ref(e).get("subresource") == "status"
    )  # fmt: skip
    rounds = kubelets.step_seconds[rounds_before:]
    by_resource = Counter(
        f"{e.get('verb')} {ref(e).get('resource')}{'/' + ref(e)['subresource'] if ref(e).get('subresource') else ''}"
        for e in events
    )  # fmt: skip
    return {
        "by_resource": {k: n / elapsed for k, n in by_resource.most_common(8)},
        "seconds": elapsed,
        "cpu_share": (cpu1 - cpu0) / elapsed,
        "rss_mib": peak_rss_mib(pid),  # its peak since it started
        "requests_per_s": {verb: n / elapsed for verb, n in sorted(verbs.items())},
        "lists": verbs.get("list", 0),
        "status_writes_per_s": status_writes / elapsed,
        "passes_per_s": (passes1 - passes0) / elapsed,
        "woken_per_s": {
            k: (n - woken0.get(k, 0.0)) / elapsed
            for k, n in woken1.items()
            if n > woken0.get(k, 0.0)
        },
        "host_cpu": (busy1[0] - busy0[0]) / max(1.0, busy1[1] - busy0[1]),
        "round_s": (statistics.median(rounds), max(rounds)) if rounds else (0.0, 0.0),
    }


@dataclass(frozen=True)
class Crowded:
    node: str
    pipelines: int
    took: list[float]  # kill -> each replacement's first renewal, sorted
    volumes: tuple[int, int]  # attached to the node before; attached elsewhere after
    killed_at: datetime  # wall clock (the audit log's)
    cpu_share: float  # the operator's, from the kill to the last replacement's renewal
    # each replacement's start in the simulation: milestone -> seconds after the kill
    started: dict[str, list[float]]


def crowded_node(api: client.ApiClient, kubelets: Kubelets, pid: int) -> Crowded:
    """Kill the node carrying the most pipelines just after its heartbeat (the decision
    as late as nodeLostAfter lets it come: the worst case); seconds from the kill to each
    of its workers' replacement's first Lease renewal at its new epoch."""
    pods: list[Any] = (
        client.CoreV1Api(api)
        .list_namespaced_pod(
            NAMESPACE, label_selector=f"{names.LABEL_COMPONENT}={names.COMPONENT_WORKER}"
        )
        .items
    )
    by_node: dict[str, list[Any]] = {}
    for pod in pods:
        by_node.setdefault(pod.spec.node_name, []).append(pod)
    node = max(
        by_node, key=lambda n: len({p.metadata.labels[names.LABEL_PIPELINE] for p in by_node[n]})
    )
    victims = [
        (
            names.lease(
                p.metadata.labels[names.LABEL_PIPELINE],
                int(p.metadata.labels[names.LABEL_PARTITION]),
            ),
            int(p.metadata.labels[names.LABEL_EPOCH]),
        )
        for p in by_node[node]
    ]
    successors = [
        names.worker_pod(
            p.metadata.labels[names.LABEL_PIPELINE],
            int(p.metadata.labels[names.LABEL_PARTITION]),
            int(p.metadata.labels[names.LABEL_EPOCH]) + 1,
        )
        for p in by_node[node]
    ]
    pipelines = len({p.metadata.labels[names.LABEL_PIPELINE] for p in by_node[node]})
    held = [v for v, n in attached_volumes(api, kubelets.volumes).items() if n == node]
    kubelets.wait_for_heartbeat(node)  # the worst case: decided nodeLostAfter after
    killed_at, cpu0, t0 = datetime.now().astimezone(), cpu_seconds(pid), time.monotonic()
    kubelets.lose(node)
    wait_until(
        lambda: all((lease, epoch + 1) in kubelets.taken for lease, epoch in victims),
        300,
        "every replacement renewing",
        every=0.5,
    )
    cpu_share = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
    took = sorted(kubelets.taken[(lease, epoch + 1)] - t0 for lease, epoch in victims)
    now_on = attached_volumes(api, kubelets.volumes)
    moved = sum(1 for v in held if now_on.get(v) not in (None, node))
    started: dict[str, list[float]] = {}
    for pod in successors:
        for milestone, at in kubelets.milestones.get(pod, {}).items():
            started.setdefault(milestone, []).append(at - t0)
    return Crowded(node, pipelines, took, (len(held), moved), killed_at, cpu_share, started)


OPERATOR_STEPS = {  # the Events a crowded node's handovers post, in order
    "FailoverStarted": "decided",
    "WorkerFenced": "fenced",
    "WorkerDeleted": "released",
    "WorkerCreated": "created",
}


def crowded_timeline(crowded: Crowded, records: list[dict[str, Any]]) -> str:
    """Median seconds after the kill of each step of the node's handovers (the only ones
    from the kill until the leader kill): the operator's from its log (the Events it
    posted), the replacement's start from the simulation (a step saw it bound, then its
    volume attached: Running), and its first renewal."""
    at: dict[str, list[float]] = {}
    for r in records:
        step, when = OPERATOR_STEPS.get(str(r.get("reason"))), parse_time(r.get("timestamp"))
        if step is not None and when is not None and when >= crowded.killed_at:
            at.setdefault(step, []).append((when - crowded.killed_at).total_seconds())
    at.update(crowded.started)
    at["renewed"] = crowded.took
    order = [*OPERATOR_STEPS.values(), "bound", "attached", "renewed"]
    return ", ".join(f"{s} {statistics.median(at[s]):.1f}" for s in order if at.get(s))


def requests_after(
    cp: ControlPlane, since: datetime, seconds: float, keep: Path | None = None
) -> tuple[Counter[str], list[int]]:
    """The operator's API requests in the `seconds` after `since`, by verb and resource,
    and how many each second; with `keep`, each one's audit event written there (a JSON
    line each: when it was received and answered, what it asked)."""
    until = since + timedelta(seconds=seconds)
    events = audit_in(cp, since, until)
    if keep is not None:
        keep.write_text("".join(json.dumps(e) + "\n" for e in events))
    by_resource: Counter[str] = Counter()
    per_second = [0] * (int(seconds) + 1)
    for e in events:
        ref = e.get("objectRef") or {}
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        by_resource[f"{e.get('verb')} {ref.get('resource')}{sub}"] += 1
        at = parse_time(e.get("stageTimestamp"))
        if at is not None:
            per_second[min(len(per_second) - 1, int((at - since).total_seconds()))] += 1
    return by_resource, per_second


def handover_steps(api: client.ApiClient) -> dict[str, float]:
    """The median second, after the decision, of each step of the pipelines' last
    handovers (status.partitions[].lastHandover.steps)."""
    found: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
        names.GROUP, names.VERSION, NAMESPACE, names.PLURAL
    )
    steps: dict[str, list[float]] = {}
    for body in found["items"]:
        for entry in (body.get("status") or {}).get("partitions") or []:
            for step, at in ((entry.get("lastHandover") or {}).get("steps") or {}).items():
                steps.setdefault(step, []).append(float(at))
    medians = {step: statistics.median(ats) for step, ats in steps.items()}
    return dict(sorted(medians.items(), key=lambda kv: kv[1]))


def leader_kill(
    api: client.ApiClient, leader: OperatorProcess, standby: OperatorProcess, pipeline: str
) -> tuple[float | None, float | None, list[str]]:
    """Kill the leader and delete `pipeline`'s partition-0 worker pod at once: seconds
    until the standby leads and until it begins that partition's handover (None: not
    within 4 lease durations), and the other handovers it began."""
    core: Any = client.CoreV1Api(api)
    pods = core.list_namespaced_pod(
        NAMESPACE, label_selector=f"{names.LABEL_PIPELINE}={pipeline},{names.LABEL_PARTITION}=0"
    ).items
    killed_at = datetime.now(UTC)
    leader.kill()
    for pod in pods:
        core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
    target = f"{NAMESPACE}/{pipeline}"

    def since_kill(record: dict[str, Any]) -> float:
        at = parse_time(record.get("timestamp"))
        return (at - killed_at).total_seconds() if at is not None else float("inf")

    def acted() -> bool:
        return any(
            r.get("reason") == "FailoverStarted" and r.get("pipeline") == target
            for r in standby.log_records()
        )

    deadline = time.monotonic() + 4 * LEADER_LEASE_S
    while time.monotonic() < deadline and not acted():
        time.sleep(0.5)
    time.sleep(LEADER_LEASE_S)  # a spurious handover would begin within a duration
    records = [r for r in standby.log_records() if since_kill(r) >= 0]
    leads = next((since_kill(r) for r in records if r.get("message") == "became leader"), None)
    begun = [r for r in records if r.get("reason") == "FailoverStarted"]
    acts = next((since_kill(r) for r in begun if r.get("pipeline") == target), None)
    spurious = [str(r.get("message")) for r in begun if r.get("pipeline") != target]
    return leads, acts, spurious


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--steady-s", type=float, default=300.0)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument(
        "--pass-threads", type=int, default=None, help="the operator's (default: its own)"
    )
    parser.add_argument(
        "--operator-log",
        type=Path,
        help="keep the operator's log there (default: deleted), and beside it (.audit.jsonl) "
        "its API requests from the crowded node's kill on, as the audit log has them",
    )
    bench_results.add_arguments(parser)
    args = parser.parse_args()
    pipelines = [f"s{i:03d}" for i in range(args.pipelines)]
    total = args.pipelines * args.partitions
    per_node = -(-total // args.nodes)
    cpus = max(8, per_node)  # 500m a worker, with room
    print(
        f"[bench] {args.pipelines} pipelines x {args.partitions} partitions = {total:,} on {args.nodes} simulated nodes",
        flush=True,
    )
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="operator-scale-")))
        cp = stack.enter_context(
            ControlPlane(with_controllers=True, crds=sorted((REPO_ROOT / "crds").glob("*.yaml")))
        )
        kafka = stack.enter_context(KafkaBroker())
        admin = cp.api_client()
        core: Any = client.CoreV1Api(admin)
        for ns in (NAMESPACE, BASELINE_NAMESPACE):
            core.create_namespace({"metadata": {"name": ns}})
        wait_until(
            lambda: bool(core.list_namespaced_service_account(NAMESPACE).items),
            60,
            "the default service account",
        )
        topic = "scale-in"
        kafka.create_topic(topic, args.partitions)
        for name in pipelines:  # each pipeline an output of its own (shared_kafka.py)
            kafka.create_topic(
                simulated_output(topic, name), args.partitions, {"retention.ms": "-1"}
            )
        kubeconfig = operator_kubeconfig(cp, admin, tmp / "operator.kubeconfig")
        base_s = None
        if not args.no_baseline:
            nodes = [f"base-{n}" for n in range(args.nodes)]
            with Kubelets(
                admin,
                BASELINE_NAMESPACE,
                nodes,
                "dedup.io/bench-baseline",
                cpus=cpus,
                heartbeat_s=HEARTBEAT_S,
                node_lease_s=NODE_LEASE_S,
                attach_volumes=True,
            ) as base:
                for name in pipelines:
                    base.create_volumes(name, args.partitions)
                base_s = baseline(admin, cp.kubeconfig_path, pipelines, args.partitions, base)
            print(
                f"baseline: every pod Running {base_s:.1f}s after the first create (a plain script, {API_QPS:g} requests/s)",
                flush=True,
            )
        nodes = [f"node-{n}" for n in range(args.nodes)]
        kubelets = stack.enter_context(
            Kubelets(
                admin,
                NAMESPACE,
                nodes,
                "dedup.io/bench",
                cpus=cpus,
                heartbeat_s=HEARTBEAT_S,
                node_lease_s=NODE_LEASE_S,
                attach_volumes=True,
            )
        )
        for name in pipelines:
            kubelets.create_volumes(name, args.partitions)
        production: tuple[str, ...] = ("--topic-check-interval", "30", "--leader-lease-duration", str(LEADER_LEASE_S),
                      "--status-counters-interval", "60")  # fmt: skip
        if args.pass_threads is not None:
            production += ("--pass-threads", str(args.pass_threads))
        if args.operator_log:  # this run's lines only: "became leader" of an earlier run
            for log in (args.operator_log, args.operator_log.with_suffix(".standby.log")):
                log.unlink(missing_ok=True)  # would pass for this one's
        op = stack.enter_context(running_operator(kubeconfig, NAMESPACE, args.operator_log or tmp / "operator.log", interval=5.0, extra=production))  # fmt: skip
        wait_until(
            lambda: any(r.get("message") == "became leader" for r in op.log_records()),
            60,
            "the operator to lead",
        )
        standby_log = (
            args.operator_log.with_suffix(".standby.log")
            if args.operator_log
            else tmp / "standby.log"
        )
        standby = stack.enter_context(running_operator(kubeconfig, NAMESPACE, standby_log, interval=5.0, extra=production))  # fmt: skip
        custom = client.CustomObjectsApi(admin)
        t0 = time.monotonic()
        for name in pipelines:
            custom.create_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                NAMESPACE,
                names.PLURAL,
                simulated_pipeline(kafka.bootstrap, topic, kubelets.label, name, args.partitions),
            )
        wait_until(
            lambda: ready_pipelines(admin, args.partitions) == len(pipelines),
            3600,
            "every pipeline Ready",
            every=2.0,
        )
        apply_s = time.monotonic() - t0
        ratio = (
            f" = {apply_s / base_s:.2f}x the baseline (target <= {TARGET_APPLY_RATIO}x)"
            if base_s
            else ""
        )
        print(
            f"operator: apply -> all {total:,} partitions Ready {apply_s:.1f}s{ratio}; "
            f"{len(attached_volumes(admin, kubelets.volumes)):,} volumes attached through "
            "VolumeAttachments",
            flush=True,
        )
        pid = op.operator_pid()
        s = steady(cp, op, pid, kubelets, args.steady_s)
        verbs = ", ".join(f"{v} {r:.2f}/s" for v, r in s["requests_per_s"].items())
        saturated = s["host_cpu"] > 0.9 or s["round_s"][1] > 5.0
        woken = sum(s["woken_per_s"].values())
        causes = ", ".join(f"{k} {r:.2f}/s" for k, r in sorted(s["woken_per_s"].items()))
        print(
            f"steady ({s['seconds']:.0f}s): operator CPU {s['cpu_share']:.1%} of a core (target <= {TARGET_CPU:.0%}), "
            f"peak RSS {s['rss_mib']:.0f} MiB (target <= {TARGET_RSS_MIB}), requests {verbs}; list calls {s['lists']}; "
            f"status writes {s['status_writes_per_s']:.2f}/s; passes {s['passes_per_s']:.2f}/s (woken by a change "
            f"{woken:.2f}/s{': ' + causes if causes else ''}); host CPU {s['host_cpu']:.0%}; simulation rounds "
            f"median {s['round_s'][0]:.2f}s max {s['round_s'][1]:.2f}s{' (SATURATED)' if saturated else ''}",
            flush=True,
        )
        print(
            "  requests by resource: "
            + ", ".join(f"{k} {r:.2f}/s" for k, r in s["by_resource"].items()),
            flush=True,
        )
        crowded = crowded_node(admin, kubelets, pid)
        took, (held, moved) = crowded.took, crowded.volumes
        print(
            f"crowded node {crowded.node} ({len(took)} partitions of {crowded.pipelines} pipelines) killed: "
            f"replacements' first renewals {took[0]:.1f} / {statistics.median(took):.1f} / {took[-1]:.1f}s "
            f"(min/median/max; target every one <= {TARGET_CROWDED_S:.0f}s); its {held} volumes detached, "
            f"{moved} attached to another node; operator CPU meanwhile {crowded.cpu_share:.0%} of a core",
            flush=True,
        )
        time.sleep(2.0)  # (the audit log's last lines written)
        audit_kept = args.operator_log.with_suffix(".audit.jsonl") if args.operator_log else None
        by_resource, per_second = requests_after(cp, crowded.killed_at, took[-1], audit_kept)
        print(
            f"  the operator's requests from the kill on: {sum(per_second)} "
            f"({', '.join(f'{k} {n}' for k, n in by_resource.most_common(8))}); "
            f"per second: {' '.join(map(str, per_second))}",
            flush=True,
        )
        wait_until(lambda: "ready" in handover_steps(admin), 60, "the handovers recorded")
        steps = ", ".join(f"{k} {v:.1f}" for k, v in handover_steps(admin).items())
        print(f"  handover steps, median seconds after the decision: {steps}", flush=True)
        print(
            f"  median seconds after the kill: {crowded_timeline(crowded, op.log_records())}",
            flush=True,
        )
        leads, acts, spurious = leader_kill(admin, op, standby, pipelines[0])
        print(
            f"leader killed: the standby leads after {leads if leads is None else round(leads, 1)}s, acts (a deleted "
            f"worker's handover) after {acts if acts is None else round(acts, 1)}s (target <= {2 * LEADER_LEASE_S}s); "
            f"spurious handovers {len(spurious)} (target 0){': ' + '; '.join(spurious[:3]) if spurious else ''}",
            flush=True,
        )
        if kubelets.errors:
            print(f"simulation errors: {kubelets.errors[:5]}", file=sys.stderr)
    label = f"{args.pipelines}x{args.partitions} on {args.nodes} nodes"
    figures = [
        bench_results.Figure(
            f"operator_scale.apply.{label}", "operator_scale.py",
            f"{label}: apply -> all Ready {apply_s:.0f}s" + (f", baseline {base_s:.0f}s ({apply_s / base_s:.2f}x)" if base_s else ""),
            f"<= {TARGET_APPLY_RATIO}x: " + (bench_results.verdict(apply_s / base_s <= TARGET_APPLY_RATIO) if base_s else "no baseline run"),
        ),
        bench_results.Figure(
            f"operator_scale.steady.{label}", "operator_scale.py",
            f"{label}: CPU {s['cpu_share']:.1%}, RSS {s['rss_mib']:.0f} MiB, {s['lists']} lists, status writes {s['status_writes_per_s']:.2f}/s" + (" (saturated)" if saturated else ""),
            f"CPU <= 5%, RSS <= 256 MiB, 0 lists: {bench_results.verdict(s['cpu_share'] <= TARGET_CPU and s['rss_mib'] <= TARGET_RSS_MIB and s['lists'] == 0)}",
        ),
        bench_results.Figure(
            f"operator_scale.crowded.{label}", "operator_scale.py",
            f"{label}: node with {len(took)} partitions of {crowded.pipelines} pipelines: every replacement renewing by {took[-1]:.1f}s",
            f"<= 30 s: {bench_results.verdict(took[-1] <= TARGET_CROWDED_S)}",
        ),
        bench_results.Figure(
            f"operator_scale.leader_kill.{label}", "operator_scale.py",
            f"{label}: leader killed: acting after {'never' if acts is None else f'{acts:.1f}s'}, {len(spurious)} spurious handovers",
            f"<= {2 * LEADER_LEASE_S} s, 0 spurious: {bench_results.verdict(acts is not None and acts <= 2 * LEADER_LEASE_S and not spurious)}",
        ),
    ]  # fmt: skip
    bench_results.record_figures(args, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
