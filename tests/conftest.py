"""Shared pytest configuration. Fixtures for the real parts live in tests/support/.

Integration tests run in parallel processes grouped by the cluster they share
(scripts/test.sh runs one `pytest --cluster-group NAME` per group), since most of their
time is waiting on real parts (a node's grace period, a Lease running out, a broker).
Each process starts its group's session fixtures once: the stand-in node agent (with
podman containers, and its own tests' process pods), the local cluster on real nodes, the
bare control plane, or only Kafka and Spark. Tests never share a cluster across processes.
"""

from __future__ import annotations

import pytest

pytest_plugins = [
    "support.kafka_fixtures",
    "support.kube_fixtures",
    "support.cluster_fixtures",
    "support.neighbour_scenario",
    "support.spark_fixtures",
]

CLUSTER_GROUPS = (
    ("container_cluster", "containers"),
    ("local_cluster", "local-cluster"),
    ("stand_in_cluster", "containers"),
    ("own_real_nodes", "local-cluster"),
    ("kube", "control-plane"),
)
"""The session fixture that starts each group's cluster. A test declares its group with
``@pytest.mark.cluster_group(NAME)`` (usually once per module, in ``pytestmark``); the
first of these fixtures it uses, in this order, must be its group's, so that no process
starts a second group's cluster."""
OTHER_GROUP = "kafka-spark"
GROUPS = (*(group for _, group in CLUSTER_GROUPS), OTHER_GROUP)


def fixture_group(fixtures: set[str]) -> str:
    """The group whose cluster the first group fixture a test uses belongs to."""
    for fixture, group in CLUSTER_GROUPS:
        if fixture in fixtures:
            return group
    return OTHER_GROUP


def declared_group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("cluster_group")
    if marker is None:
        return None
    (group,) = marker.args
    return str(group)


def run_order(item: pytest.Item) -> int:
    """0: a test with real nodes of its own; 1: a background scenario's beginning; 2: the
    rest (in collection order: the sort is stable); 3: a background scenario's end."""
    if "own_real_nodes" in getattr(item, "fixturenames", ()):
        return 0
    marker = item.get_closest_marker("background_scenario")
    if marker is None:
        return 2
    return 1 if marker.args == ("begins",) else 3


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cluster-group",
        choices=GROUPS,
        help="run only the tests of this group (the session cluster they share)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wrong = []
    for item in items:
        if item.get_closest_marker("integration") is None:
            continue
        declared = declared_group(item)
        used = fixture_group(set(getattr(item, "fixturenames", ())))
        if declared not in GROUPS:
            wrong.append(f"{item.nodeid}: no cluster_group marker (one of {', '.join(GROUPS)})")
        elif declared != used:
            wrong.append(
                f"{item.nodeid}: declares cluster group {declared} but its fixtures start {used}'s cluster"
            )
    if wrong:
        raise pytest.UsageError(
            "integration tests with a wrong cluster group:\n" + "\n".join(wrong)
        )
    # The host has one kube-proxy (dedup_local.real_network: a machine-wide lock): a test
    # that starts a real-node cluster of its own (`own_real_nodes`: the demo's Ctrl-C
    # test) runs first, before the session's `local_cluster` starts, or it would wait for
    # the session to end.
    # A scenario in the background of the session (support/neighbour_scenario.py): the
    # test that begins it right after those, the one that sees it through last.
    items.sort(key=run_order)
    wanted = config.getoption("--cluster-group")
    if wanted is None:
        return
    keep, drop = [], []
    for item in items:
        group = declared_group(item) or OTHER_GROUP
        (keep if group == wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
