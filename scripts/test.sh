#!/usr/bin/env bash
# The whole suite: fast unit tests first, then the integration tests against the real
# Kafka broker, kube-apiserver and SparkSession. Prints progress per test.
source "$(dirname "$0")/lib.sh"
PY="$DEDUP_CACHE/venv/bin/python"
cd "$REPO_ROOT"
start=$(date +%s)
log "unit tests"
"$PY" -m pytest -m "not integration" -v -p no:cacheprovider tests
# In parallel, one process per cluster the tests share (tests/conftest.py): the local
# cluster with containers, the one with processes, the bare control plane, Kafka+Spark.
workers="${DEDUP_TEST_WORKERS:-4}"
log "integration tests (real Kafka, kube-apiserver, Spark, containers) in $workers processes"
"$PY" -m pytest -m integration -v -p no:cacheprovider -n "$workers" --dist loadgroup tests
log "all tests passed in $(( $(date +%s) - start ))s"
