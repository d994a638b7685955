"""Shared pytest configuration. Fixtures for the real parts live in tests/support/.

Integration tests run in parallel (pytest-xdist, `--dist loadgroup`: scripts/test.sh)
grouped by the cluster they share, since most of their time is waiting on real parts
(a node's grace period, a Lease running out, a broker). Each group runs in one worker
process, which starts that group's session fixtures once: the local cluster with
containers, the local cluster of processes, the bare control plane, or only Kafka and
Spark. Tests never share a cluster across processes.
"""

from __future__ import annotations

import pytest

pytest_plugins = [
    "support.kafka_fixtures",
    "support.kube_fixtures",
    "support.cluster_fixtures",
    "support.spark_fixtures",
]

CLUSTER_GROUPS = (
    ("container_cluster", "containers"),
    ("local_cluster", "local-cluster"),
    ("kube", "control-plane"),
)
"""The first session fixture a test uses, in this order, names its group."""


def cluster_group(fixtures: set[str]) -> str:
    for fixture, group in CLUSTER_GROUPS:
        if fixture in fixtures:
            return group
    return "kafka-spark"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("integration") and not item.get_closest_marker("xdist_group"):
            fixtures = set(getattr(item, "fixturenames", ()))
            item.add_marker(pytest.mark.xdist_group(cluster_group(fixtures)))
