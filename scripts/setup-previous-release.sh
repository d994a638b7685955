#!/usr/bin/env bash
# The previous release (versions.env: PREVIOUS_RELEASE at PREVIOUS_RELEASE_COMMIT): its
# source tree from `git archive`, its image built by the same cached podman build as this
# commit's (local/dedup_local/previous_release.py), and the archive real nodes import.
# A second run with the same inputs returns at once.
source "$(dirname "$0")/lib.sh"
PY="$DEDUP_CACHE/venv/bin/python"
[[ -x "$PY" ]] || die "previous release: no virtual environment at $DEDUP_CACHE/venv (run: make setup-python)"
cd "$REPO_ROOT"
PYTHONPATH="$REPO_ROOT/local" "$PY" -m dedup_local.previous_release build >/dev/null \
  || die "previous release: not built (the line above says why)"
