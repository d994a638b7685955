# Shared shell helpers for the setup scripts. Source it; do not run it.
# Everything fetched or built lives under $DEDUP_CACHE, outside the repository.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DEDUP_CACHE="${DEDUP_CACHE:-$HOME/.cache/dedup-operator}"
mkdir -p "$DEDUP_CACHE"
# shellcheck source=../versions.env
source "$REPO_ROOT/versions.env"

log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
