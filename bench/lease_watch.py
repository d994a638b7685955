"""The floor under the operator's CPU at scale: following the partition Leases' renewals.

    python bench/lease_watch.py [--leases 1000] [--lease-s 15] [--seconds 30] [--record]

On a bare control plane (real etcd and kube-apiserver), `--leases` Leases are renewed by
a writer process at the worker's rate (each every third of `--lease-s`: 200 a second for
1,000 partitions at the CRD's 15 s), and this process follows them with the operator's
own watch cache (`dedup_operator.cache.WatchedKind`, each renewal noted on a Lease clock
as the operator's watches do). It prints this process's CPU over `--seconds` (the writer,
the API server and etcd are other processes), per second and per renewal, next to the
operator's steady-state target (5% of a core at 1,000 partitions,
`bench/operator_scale.py`): what the operator pays for following its workers before any
pass runs. Not in `make bench`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from datetime import UTC, datetime
from typing import Any

import results as bench_results
from kubernetes import client
from worker_throughput import cpu_seconds

from dedup_contract import kube_client
from dedup_contract.lease_clock import LeaseClock
from dedup_contract.timefmt import format_micro_time
from dedup_local.control_plane import ControlPlane
from dedup_operator.cache import WatchedKind
from dedup_operator.observed import observe_lease

NAMESPACE = "lease-watch"
TARGET_CPU = 0.05  # the operator's steady target at 1,000 partitions (issue 30)


def renew_forever(kubeconfig: str, count: int, rate: float) -> None:
    """The writer (a process of its own): one PATCH of renewTime per renewal, round
    robin over the Leases, at `rate` a second, without a client-side request limit."""
    leases = client.CoordinationV1Api(kube_client.api_client(kubeconfig, qps=None))
    i, t0 = 0, time.monotonic()
    while True:
        body = {"spec": {"renewTime": format_micro_time(datetime.now(UTC))}}
        leases.patch_namespaced_lease(f"l{i % count}", NAMESPACE, body, _preload_content=False)
        i += 1
        ahead = t0 + i / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--lease-s", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=30.0)
    bench_results.add_arguments(parser)
    args = parser.parse_args()
    rate = args.leases / (args.lease_s / 3)
    print(
        f"[bench] {args.leases:,} Leases renewed every {args.lease_s / 3:g}s "
        f"({rate:.0f} renewals/s), followed by the operator's watch cache",
        flush=True,
    )
    with ControlPlane(with_controllers=False) as cp:
        api = cp.api_client()
        # raw JSON bodies (the client sends them as they are)
        namespace: Any = {"metadata": {"name": NAMESPACE}}
        client.CoreV1Api(api).create_namespace(namespace)
        leases = client.CoordinationV1Api(api)
        now = format_micro_time(datetime.now(UTC))
        for i in range(args.leases):
            lease: Any = {
                "metadata": {"name": f"l{i}", "labels": {"dedup.io/pipeline": f"p{i // 10}"}},
                "spec": {
                    "holderIdentity": f"w{i}",
                    "leaseDurationSeconds": args.lease_s,
                    "renewTime": now,
                },
            }
            leases.create_namespaced_lease(NAMESPACE, lease)
        clock = LeaseClock()
        watched = WatchedKind(
            "leases",
            leases.list_namespaced_lease,
            NAMESPACE,
            label_selector="dedup.io/pipeline",
            on_change=lambda obj: observe_lease(obj, clock),
        )
        watched.start()
        if not watched.wait_synced(60):
            print("the watch never synced", file=sys.stderr)
            return 1
        writer = multiprocessing.get_context("spawn").Process(
            target=renew_forever, args=(str(cp.kubeconfig_path), args.leases, rate), daemon=True
        )
        writer.start()
        try:
            time.sleep(5.0)  # the writer at its rate
            cpu0, t0 = cpu_seconds(), time.monotonic()
            time.sleep(args.seconds)
            share = (cpu_seconds() - cpu0) / (time.monotonic() - t0)
        finally:
            writer.kill()
            writer.join()
            watched.stop()
    per_event_us = share / rate * 1e6
    print(
        f"following {rate:.0f} renewals/s: {share:.1%} of a core, {per_event_us:.0f} us a "
        f"renewal ({share / TARGET_CPU:.0%} of the operator's {TARGET_CPU:.0%} target at "
        f"1,000 partitions)",
        flush=True,
    )
    label = f"{args.leases:,} Leases, {rate:.0f} renewals/s"
    bench_results.record_figures(
        args,
        [
            bench_results.Figure(
                f"lease_watch.{args.leases}",
                "lease_watch.py",
                f"{label}: the watch alone {share:.1%} of a core ({per_event_us:.0f} us a renewal)",
                f"none: the floor under operator CPU <= {TARGET_CPU:.0%} "
                f"({share / TARGET_CPU:.0%} of it)",
            )
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
