"""Shared pytest configuration. Fixtures for the real parts live in tests/support/.

Integration tests run in parallel processes grouped by the cluster they share
(scripts/test.sh runs one `pytest --cluster-group NAME` per group), since most of their
time is waiting on real parts (a node's grace period, a Lease running out, a broker).
Each process starts its group's session fixtures once: the local cluster with
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
OTHER_GROUP = "kafka-spark"
GROUPS = (*(group for _, group in CLUSTER_GROUPS), OTHER_GROUP)


def cluster_group(fixtures: set[str]) -> str:
    for fixture, group in CLUSTER_GROUPS:
        if fixture in fixtures:
            return group
    return OTHER_GROUP


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cluster-group",
        choices=GROUPS,
        help="run only the tests of this group (the session cluster they share)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = config.getoption("--cluster-group")
    if wanted is None:
        return
    keep, drop = [], []
    for item in items:
        group = cluster_group(set(getattr(item, "fixturenames", ())))
        (keep if group == wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
