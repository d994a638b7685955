#!/usr/bin/env bash
# The whole suite: fast unit tests first, then the integration tests against the real
# Kafka broker, kube-apiserver, SparkSession and containers. Prints progress per test.
#
# The integration tests run as one pytest process per cluster they share
# (tests/conftest.py, --cluster-group): the local cluster on real nodes, the bare control
# plane, Kafka+Spark, the stand-in cluster with containers. Their time is mostly waiting
# on real parts, so the groups run side by side; each line is prefixed by its group.
# Their session parts (broker, control plane, nodes, SparkSession) start one at a time
# on the machine (a machine-wide start lock, dedup_local.patience): on two cores four
# starting at once thrashed for half an hour (issue 46). The quick starts go first (a
# broker, a control plane: seconds each), then the real nodes of the longest group.
# DEDUP_TEST_GROUPS=sequential runs them one after the other.
source "$(dirname "$0")/lib.sh"
PY="$DEDUP_CACHE/venv/bin/python"
cd "$REPO_ROOT"
start=$(date +%s)
log "unit tests"
"$PY" -m pytest -m "not integration" -v -p no:cacheprovider tests

# the order in which they ask for the start lock: see above
groups=(kafka-spark control-plane local-cluster containers)
results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT
run_group() {
  local group="$1"
  set +e
  PYTHONUNBUFFERED=1 "$PY" -m pytest -m integration -v -p no:cacheprovider --durations=12 \
    --cluster-group "$group" tests 2>&1 | tee "$results/$group.log" | sed -u "s/^/[$group] /"
  echo "${PIPESTATUS[0]}" >"$results/$group.rc"
}
log "integration tests (real Kafka, kube-apiserver, Spark, containers): ${groups[*]}"
if [[ "${DEDUP_TEST_GROUPS:-parallel}" == sequential ]]; then
  for group in "${groups[@]}"; do run_group "$group"; done
else
  for group in "${groups[@]}"; do
    run_group "$group" &
    sleep "${DEDUP_GROUP_STAGGER_S:-3}"  # the order in which they reach the start lock
  done
  wait
fi

passed=0 failed=0 skipped=0 status=0
for group in "${groups[@]}"; do
  rc="$(cat "$results/$group.rc" 2>/dev/null || echo 1)"
  summary="$(grep -E '^=+ .* in [0-9.]+s' "$results/$group.log" | tail -n1 | tr -d '=')"
  log "$group: exit $rc:${summary:- no summary}"
  for kind in passed failed skipped errors; do
    n="$(grep -oE "[0-9]+ $kind" <<<"$summary" | grep -oE '[0-9]+' || true)"
    case "$kind" in
      passed) passed=$((passed + ${n:-0})) ;;
      failed | errors) failed=$((failed + ${n:-0})) ;;
      skipped) skipped=$((skipped + ${n:-0})) ;;
    esac
  done
  # 5: no test in the group (pytest's exit code for "nothing collected") is not a failure
  if [[ "$rc" != 0 && "$rc" != 5 ]]; then status=1; fi
  # 3: a session part did not start (tests/support/session_parts.py): the group stopped
  # there, with the cause in one line; the tests it did not run count as one failure
  if [[ "$rc" == 3 ]]; then
    failed=$((failed + 1))
    reason="$(grep -m1 -E 'Exit: ' "$results/$group.log" | sed 's/^.*Exit: //; s/ *!*$//')"
    log "$group: stopped early: ${reason:-a session part did not start}"
  fi
done
log "all tests finished in $(( $(date +%s) - start ))s"
# The failures again, by name and first reason, where the end of a long log is all a
# CI page shows (the "short test summary info" lines of each group, pytest -ra).
for group in "${groups[@]}"; do
  grep -E '^(FAILED|ERROR) ' "$results/$group.log" 2>/dev/null | sed "s/^/[$group] /" || true
done
echo "integration: $passed passed, $failed failed, $skipped skipped"
exit "$status"
