"""`dedup-operator`: run the DedupPipeline operator (kopf) against a cluster.

Exit codes: 0 stopped by SIGTERM/SIGINT; 1 unexpected failure (one log line says what);
2 bad command line; 3 the cluster cannot be used (unreachable, not authorized, or the
DedupPipeline CRD is not installed).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from dedup_operator.event_poster import EventPoster
    from dedup_operator.kube import Kube

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CLUSTER = 3
# The passes' request bucket (--api-qps, --api-burst). controller-runtime's old default
# of 20/s, bursts of 30, made a crowded node's handover wait for its tokens: ~250
# requests (12 status writes a partition, its taint, fence, delete, create) at 20 a
# second (bench/operator_scale.py). Kept bounded, well above that, against a runaway.
API_QPS, API_BURST = 50.0, 100
# Request buckets of their own, beside the passes': the leader Lease's renewals (one per
# third of a duration) never wait behind a pass, and the Events never hold a pass up.
LEADER_QPS, LEADER_BURST = 5.0, 10
EVENTS_QPS, EVENTS_BURST = 10.0, 25

log = logging.getLogger("dedup_operator")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dedup-operator",
        description=(
            "Reconcile DedupPipeline resources into one worker pod per input partition, "
            "each with its own volume and Lease, and move a partition to another node "
            "when its node is lost."
        ),
        epilog=(
            "Exit codes: 0 stopped by a signal, 1 unexpected failure, 2 bad command line, "
            "3 cluster unusable (unreachable, forbidden, or CRD not installed)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable; default: every namespace)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: in-cluster, then ~/.kube/config)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=5.0,
        help="seconds between reconcile passes of a pipeline with something pending (a "
        "handover, a worker starting, a volume detaching)",
    )
    p.add_argument(
        "--resync-interval",
        type=float,
        default=30.0,
        help="seconds between passes of a pipeline at rest (nothing pending; never more "
        "than the topic check's and the counters' intervals); a change of its pods, "
        "volume claims, Leases' holders, nodes or spec, or a node of its workers falling "
        "silent, calls for a pass at once",
    )
    p.add_argument(
        "--status-counters-interval",
        type=float,
        default=60.0,
        help="seconds between scrapes of a pipeline's workers for the counters in its "
        "status (records, duplicates, lag); live values are on the workers' /metrics",
    )
    p.add_argument(
        "--pass-threads",
        type=int,
        default=4,
        help="reconcile passes over different pipelines at once (one at a time per pipeline)",
    )
    p.add_argument(
        "--api-qps",
        type=float,
        default=API_QPS,
        help="requests a second the passes may send to the API server (bursts of "
        "--api-burst); 0: no client-side limit, API Priority and Fairness alone (as "
        "controller-runtime since v0.21). A node lost with 20 partitions of 20 pipelines "
        "sends ~250 requests in its first 15 s (bench/operator_scale.py)",
    )
    p.add_argument("--api-burst", type=int, default=API_BURST, help="see --api-qps")
    p.add_argument(
        "--topic-check-interval",
        type=float,
        default=30.0,
        help="seconds between checks of the input topic",
    )
    p.add_argument(
        "--ensure-interval",
        type=float,
        default=300.0,
        help="seconds between checks that each pipeline's own objects (its workers' "
        "ServiceAccount, Role, RoleBinding, Service and PodDisruptionBudget) exist; "
        "always on a spec change and at start",
    )
    p.add_argument(
        "--metrics-port", type=int, default=8080, help="port of the operator's /metrics (0 = off)"
    )
    p.add_argument(
        "--metrics-address", default="0.0.0.0", help="address of the operator's /metrics"
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=8080,
        help="port of the operator's /healthz and /readyz (0 = off); when it equals "
        "--metrics-port, one server answers /metrics, /healthz and /readyz",
    )
    p.add_argument("--health-address", default="0.0.0.0", help="address of /healthz and /readyz")
    p.add_argument(
        "--leader-election-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of the Lease dedup-operator-leader that elects the one acting "
        "replica (default: $POD_NAMESPACE, else the first --namespace, else default)",
    )
    p.add_argument(
        "--leader-lease-duration", type=int, default=15, help="seconds of the leader Lease"
    )
    p.add_argument(
        "--no-leader-election",
        action="store_true",
        help="act without electing a leader (only when one replica runs)",
    )
    p.add_argument("--log-format", choices=["json", "text"], default="json")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING"], default="INFO")
    return p


def _preflight(
    kubeconfig: str | None, namespaces: Sequence[str], qps: float, burst: int
) -> tuple[object, str | None]:
    """An API client, after checking the cluster answers and serves DedupPipelines.
    Returns (api client, error message)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from dedup_contract import names
    from dedup_operator.kube import api_client

    try:
        api = api_client(kubeconfig, qps=qps, burst=burst)
    except (ConfigException, OSError) as exc:
        return None, f"no usable cluster configuration: {exc}"
    custom = client.CustomObjectsApi(api)
    try:
        if namespaces:
            for ns in namespaces:
                custom.list_namespaced_custom_object(
                    names.GROUP, names.VERSION, ns, names.PLURAL, limit=1
                )
        else:
            custom.list_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL, limit=1)
    except ApiException as exc:
        if exc.status == 404:
            return api, (
                "the DedupPipeline CRD is not installed: "
                "kubectl apply -f crds/dedup.io_dedupPipelines.yaml"
            )
        if exc.status in (401, 403):
            return api, f"not allowed to list deduppipelines ({exc.status} {exc.reason})"
        return api, f"the API server refused: {exc.status} {exc.reason}"
    except (HTTPError, OSError) as exc:
        return api, f"cannot reach the API server: {exc}"
    return api, None


def _configure_logging(fmt: str, level: str) -> None:
    import kopf

    kopf.configure(
        verbose=level == "DEBUG",
        quiet=level == "WARNING",
        log_format=kopf.LogFormat.JSON if fmt == "json" else kopf.LogFormat.FULL,
        log_refkey="object",
    )
    logging.getLogger().setLevel(level)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)


async def _run_operator(
    clusterwide: bool,
    namespaces: list[str],
    health_port: int,
    health_address: str,
    with_metrics: bool,
) -> None:
    """kopf's operator in this loop, with /healthz and /readyz served from the same loop
    (see dedup_operator.health). Called after the preflight reached the API server."""
    import kopf

    from dedup_operator.health import Health, serve

    health = Health(connected=True)
    runner = await serve(health, health_port, health_address, with_metrics) if health_port else None
    try:
        await kopf.operator(
            clusterwide=clusterwide,
            namespaces=namespaces,
            standalone=True,
            ready_flag=health.started,
        )
    finally:
        if runner is not None:
            await runner.cleanup()


def _export_client_counts(kube: Kube, events: EventPoster) -> None:
    """The API client's 429 refusals, the watches' lists and the Events dropped, read at
    each scrape."""
    from dedup_operator import operator_metrics

    operator_metrics.API_THROTTLED.set_function(lambda: getattr(kube.api, "throttled", 0))
    operator_metrics.EVENTS_DROPPED.set_function(lambda: events.dropped)
    for kind in kube.watch_lists():
        operator_metrics.WATCH_LISTS.labels(kind).set_function(
            lambda kind=kind: kube.watch_lists().get(kind, 0)  # type: ignore[misc]
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (
        args.interval <= 0
        or args.topic_check_interval <= 0
        or args.leader_lease_duration < 1
        or args.pass_threads < 1
        or args.status_counters_interval <= 0
        or args.ensure_interval <= 0
        or args.resync_interval <= 0
        or args.api_qps < 0
        or args.api_burst < 1
    ):
        print(
            "dedup-operator: --interval, --resync-interval, --topic-check-interval, "
            "--leader-lease-duration, --pass-threads, --status-counters-interval, "
            "--api-burst and --ensure-interval must be positive, --api-qps 0 or more",
            file=sys.stderr,
        )
        return EXIT_USAGE
    _configure_logging(args.log_format, args.log_level)
    # SIGUSR1 prints every thread's stack to stderr: what a person (or a test) looks at
    # when the operator seems stuck (`kill -USR1 <pid>`), without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if args.kubeconfig:
        if not os.path.exists(args.kubeconfig):
            log.error("kubeconfig %s does not exist", args.kubeconfig)
            return EXIT_CLUSTER
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it

    from dedup_contract import kube_client
    from dedup_operator import handlers
    from dedup_operator.kube import Kube, attached_volume
    from dedup_operator.settings import ReconcileSettings

    namespaces: list[str] = list(args.namespace)
    api, problem = _preflight(
        args.kubeconfig,
        namespaces if not args.all_namespaces else [],
        args.api_qps,
        args.api_burst,
    )
    if problem:
        log.error("dedup-operator cannot start: %s", problem)
        return EXIT_CLUSTER
    kube = Kube(api)  # type: ignore[arg-type]
    handlers.RUNTIME.wakeups.volume_owner = lambda va: kube.pipeline_of_volume(attached_volume(va))
    # Nodes, node Leases, VolumeAttachments, the DedupPipelines and their worker pods,
    # volume claims and partition Leases: watched, not listed per pass; each Lease
    # renewal noted as it happens; each change calls for the passes it concerns
    kube.watch_cluster(
        on_heartbeat=handlers.RUNTIME.lease_watch.observe_lease,
        namespaces=[] if args.all_namespaces else namespaces,
        on_partition_lease=handlers.RUNTIME.lease_watch.observe_lease,
        on_event=handlers.on_watch_event,
    )
    # Events: posted by one thread through a bucket of their own, off the passes' path
    events = kube.post_events_from_thread(kube_client.sibling(api, EVENTS_QPS, EVENTS_BURST))  # type: ignore[arg-type]
    _export_client_counts(kube, events)
    handlers.RUNTIME.kube = kube
    handlers.RUNTIME.namespaces = () if args.all_namespaces else tuple(namespaces)
    identity = None
    if not args.no_leader_election:
        from dedup_operator.leader import LeaderElection, leader_identity

        election_ns = args.leader_election_namespace or (namespaces[0] if namespaces else "default")
        identity = leader_identity()
        handlers.RUNTIME.leader = LeaderElection(
            # its own bucket: a renewal never waits behind the passes' requests
            kube_client.sibling(api, LEADER_QPS, LEADER_BURST),  # type: ignore[arg-type]
            election_ns,
            identity,
            args.leader_lease_duration,
        )
    handlers.RUNTIME.pass_threads = args.pass_threads
    handlers.RUNTIME.settings = ReconcileSettings(
        interval_s=args.interval,
        topic_check_s=args.topic_check_interval,
        ensure_s=args.ensure_interval,
        counters_s=args.status_counters_interval,
        resync_s=args.resync_interval,
        namespaces=handlers.RUNTIME.namespaces,
    )
    shared_port = args.metrics_port and args.metrics_port == args.health_port
    if args.metrics_port and not shared_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, args.metrics_address)
    clusterwide = args.all_namespaces or not namespaces
    from dedup_contract.release import VERSION

    log.info(
        "dedup-operator starting",
        extra={
            "version": VERSION,
            "namespaces": "*" if clusterwide else ",".join(namespaces),
            "identity": identity,
            "interval_s": args.interval,
            "resync_s": args.resync_interval,
            "pass_threads": args.pass_threads,
            "metrics_port": args.metrics_port,
            "health_port": args.health_port,
        },
    )
    try:
        asyncio.run(
            _run_operator(
                clusterwide,
                [] if clusterwide else namespaces,
                args.health_port,
                args.health_address,
                bool(shared_port),
            )
        )
    except asyncio.CancelledError:  # as kopf.run: a cancelled operator has stopped
        pass
    except Exception as exc:
        log.error("dedup-operator failed: %s: %s", type(exc).__name__, exc)
        _exit_now(EXIT_FAILED)
    log.info("dedup-operator stopped")
    _exit_now(EXIT_OK)


def _exit_now(code: int) -> NoReturn:
    """End the process once the logs are flushed, without interpreter finalization: the
    watch threads (cache.py) are daemons blocked on their streams, and one writing a
    log line while the interpreter finalizes aborts it (SIGABRT, seen in the suite)
    instead of exiting with `code`."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
