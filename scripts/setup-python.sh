#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment under $DEDUP_CACHE/venv and
# installs the project in editable mode with its dev extras. Reinstalls only when
# pyproject.toml changed since the last install.
source "$(dirname "$0")/lib.sh"
VENV="$DEDUP_CACHE/venv"
STAMP="$VENV/.pyproject.sha256"
want="$(sha256sum "$REPO_ROOT/pyproject.toml" | cut -d' ' -f1)"
extras="${DEDUP_EXTRAS:-dev}"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want:$extras:$REPO_ROOT" ]]; then
  log "python: reusing $VENV"
  exit 0
fi
command -v python3 >/dev/null || die "python3 not found"
if [[ ! -x "$VENV/bin/python" ]]; then
  log "python: creating virtual environment $VENV"
  python3 -m venv "$VENV"
fi
log "python: installing project [$extras] (first time downloads pyspark, ~400 MB)"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --progress-bar off -e "$REPO_ROOT[$extras]" 2>&1 | grep -vE '^(Requirement already satisfied|  )' >&2 || true
"$VENV/bin/python" -c "import dedup_worker, dedup_operator, dedup_spark" || die "project import failed"
echo "$want:$extras:$REPO_ROOT" > "$STAMP"
log "python: ready"
