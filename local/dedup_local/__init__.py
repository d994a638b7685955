"""The embedded local environment: a real Kafka broker, a real Kubernetes control plane
and a local SparkSession, launched from the artifacts that `scripts/setup-*.sh` cache.

Used by `make demo`, the test fixtures and the benchmarks alike, so all three run on the
same real parts.
"""
