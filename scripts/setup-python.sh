#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment under $DEDUP_CACHE/venv and
# installs the project in editable mode with its dev extras, which builds the C extension
# dedup_contract._murmur2 in place (a C compiler and Python's headers are needed). Reinstalls
# only when pyproject.toml or the extension's sources changed since the last install.
# The local harness (local/dedup_local) is not in the wheel: a .pth file puts local/ on
# the venv's path, for the tests, the demo and every process they start.
source "$(dirname "$0")/lib.sh"
VENV="$DEDUP_CACHE/venv"
STAMP="$VENV/.pyproject.sha256"
# pyproject.toml and the C extension's sources (the editable install builds it in place)
want="$(cat "$REPO_ROOT/pyproject.toml" "$REPO_ROOT"/contract/dedup_contract/*.c | sha256sum | cut -d' ' -f1)"
extras="${DEDUP_EXTRAS:-dev}"

# local/ on the venv's path (one line in a .pth file of its site-packages)
harness_path() {
  local site
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$REPO_ROOT/local" >"$site/dedup-local-harness.pth"
}

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want:$extras:$REPO_ROOT" ]] &&
  compgen -G "$REPO_ROOT/contract/dedup_contract/_murmur2*.so" >/dev/null; then
  harness_path
  log "python: reusing $VENV"
  exit 0
fi
command -v python3 >/dev/null || die "python3 not found"
command -v cc >/dev/null || die "no C compiler (cc) for dedup_contract._murmur2: apt-get install gcc"
if [[ ! -x "$VENV/bin/python" ]]; then
  log "python: creating virtual environment $VENV"
  python3 -m venv "$VENV"
fi
log "python: installing project [$extras] (first time downloads pyspark, ~400 MB)"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --progress-bar off -e "$REPO_ROOT[$extras]" 2>&1 | grep -vE '^(Requirement already satisfied|  )' >&2 || true
harness_path
"$VENV/bin/python" -c "import dedup_contract, dedup_worker, dedup_operator, dedup_spark, dedupctl, dedup_local, dedup_contract._murmur2" || die "project import failed"
echo "$want:$extras:$REPO_ROOT" > "$STAMP"
log "python: ready"
