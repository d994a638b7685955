#!/usr/bin/env bash
# Builds the project's image from the Dockerfile with podman (runc), on bases made from
# Debian packages (no container registry is reachable here): local/dedup_local/image.py.
# Everything lives in $DEDUP_CACHE/podman; a second run with the same inputs returns at
# once. Installs podman, runc and mmdebstrap with apt-get when they are missing and we
# are root; otherwise stops with one line saying what to install.
source "$(dirname "$0")/lib.sh"
PY="$DEDUP_CACHE/venv/bin/python"
[[ -x "$PY" ]] || die "image: no virtual environment at $DEDUP_CACHE/venv (run: make setup-python)"

missing=()
for tool in podman runc mmdebstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    log "image: installing ${missing[*]} (Debian packages podman runc mmdebstrap)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >/dev/null
  else
    die "image: ${missing[*]} missing; install them: sudo apt-get install podman runc mmdebstrap"
  fi
fi
# One build at a time (ensure_image holds a lock); whoever waited finds it built.
cd "$REPO_ROOT"
PYTHONPATH="$REPO_ROOT/local" "$PY" -m dedup_local.image build >/dev/null
