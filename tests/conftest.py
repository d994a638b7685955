"""Shared pytest configuration. Fixtures for the real parts live in tests/support/."""

pytest_plugins = [
    "support.kafka_fixtures",
    "support.kube_fixtures",
    "support.cluster_fixtures",
    "support.spark_fixtures",
]
