"""`python -m dedup_local.cluster`: start a 3-node local cluster, print KUBECONFIG, wait."""

from __future__ import annotations

import contextlib
import logging
import signal

from ..paths import REPO_ROOT
from . import ClusterTimings, LocalCluster


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    crds = sorted((REPO_ROOT / "crds").glob("*.yaml"))
    with LocalCluster(nodes=3, timings=ClusterTimings.fast(), crds=crds) as cluster:
        print(f"export KUBECONFIG={cluster.kubeconfig_path}", flush=True)
        print(
            f"nodes: {' '.join(cluster.node_names)}; storage class {cluster.storage_class}",
            flush=True,
        )
        print("Ctrl-C stops it.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
