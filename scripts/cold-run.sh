#!/usr/bin/env bash
# The cold path every new user and every new CI machine takes, as a check: clones this
# repository at a commit, points every cache the set-up fills at an empty directory
# (DEDUP_CACHE, Go's module and compile caches, pip's cache), runs `.ci/run` there as CI
# does (CI=true, no standard input) and prints the set-up time, the test time and the
# result. The figures of docs/development.md come from it.
#
#   scripts/cold-run.sh [--rev REV] [--cache DIR] [--keep] [--setup-only] [--log FILE]
#
#   --rev REV      the commit to clone (default: HEAD; uncommitted changes are not in it)
#   --cache DIR    the empty (or absent) directory for the caches: DEDUP_CACHE itself,
#                  with Go's module cache and pip's inside it (default: a new one under
#                  /var/tmp); removed afterwards with the clone, unless --keep
#   --keep         keep the caches (e.g. --cache ~/.cache/dedup-operator warms the
#                  default cache for later runs) and the clone
#   --setup-only   run `make setup` instead of `.ci/run`: the set-up's time alone
#   --log FILE     where the run's output goes, each line stamped with the seconds since
#                  the clone began (default: /var/tmp/dedup-cold-run.TIME.log)
#
# What it cannot make cold: Debian packages a run installed with apt-get (podman, runc,
# containerd, ...) stay installed on the machine, and the Go toolchain is the machine's.
# Exit code: the run's (0: passed).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
rev=HEAD cache="" keep=0 setup_only=0 logfile=""
while (($#)); do
  case "$1" in
    --rev) rev="$2"; shift 2 ;;
    --cache) cache="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --setup-only) setup_only=1; shift ;;
    --log) logfile="$2"; shift 2 ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cold-run: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
say() { printf '[cold-run %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

commit="$(git -C "$REPO_ROOT" rev-parse --verify "$rev^{commit}")" \
  || { echo "cold-run: '$rev' is not a commit of $REPO_ROOT" >&2; exit 2; }
if [[ -z "$cache" ]]; then
  mkdir -p /var/tmp
  cache="$(mktemp -d /var/tmp/dedup-cold.XXXXXX)"
elif [[ -e "$cache" && -n "$(ls -A "$cache")" ]]; then
  echo "cold-run: $cache is not empty: a cold run needs an empty cache directory" >&2
  exit 2
fi
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
clone="$(mktemp -d /var/tmp/dedup-cold-clone.XXXXXX)"
logfile="${logfile:-/var/tmp/dedup-cold-run.$(date +%Y%m%dT%H%M%S).log}"

start=$(date +%s)
say "cloning $commit into $clone; caches in $cache"
git clone --quiet --no-local "$REPO_ROOT" "$clone/repo"
clone="$clone/repo"
git -C "$clone" checkout --quiet --detach "$commit"

# Each line of the run stamped with the seconds since the clone began, to find where
# the set-up ends (the first line of lint, which `make test` runs after the set-up).
stamp() {
  local line
  while IFS= read -r line; do
    printf '%s %s\n' "$(($(date +%s) - start))" "$line"
  done
}
if ((setup_only)); then
  cmd=(make --no-print-directory setup)
else
  cmd=(bash .ci/run)
fi
say "running ${cmd[*]} (output: $logfile)"
set +e
(
  cd "$clone"
  export CI=true DEDUP_CACHE="$cache" GOMODCACHE="$cache/go-mod" PIP_CACHE_DIR="$cache/pip"
  unset GOCACHE GOFLAGS DEDUP_GOCACHE
  "${cmd[@]}" </dev/null 2>&1
) | stamp | tee "$logfile" | sed -u 's/^[0-9]* //'
rc=${PIPESTATUS[0]}
set -e
end=$(($(date +%s) - start))

setup_end="$(grep -m1 -E '^[0-9]+ == ruff$' "$logfile" | cut -d' ' -f1 || true)"
setup_end="${setup_end:-$end}"
minutes() { awk -v s="$1" 'BEGIN { printf "%.1f min", s / 60 }'; }
say "commit:   $commit"
say "set-up:   $(minutes "$setup_end") (clone to the set-up's end)"
if ((!setup_only)); then
  say "tests:    $(minutes $((end - setup_end))) (lint, unit and integration tests)"
  grep -E '^[0-9]+ integration: [0-9]+ passed' "$logfile" | tail -n1 | sed 's/^[0-9]* /[cold-run] /' || true
fi
say "in all:   $(minutes "$end"), exit $rc ($([[ $rc == 0 ]] && echo passed || echo FAILED))"
grep -E '^[0-9]+ \[setup [0-9:]+\] .* (built|ready) in [0-9]+s' "$logfile" | sed 's/^[0-9]* /  /' || true
say "log: $logfile"
if ((keep)); then
  say "kept: $cache and $clone"
else
  chmod -R u+w "$cache/go-mod" 2>/dev/null || true
  rm -rf "$cache" "$(dirname "$clone")"
fi
exit "$rc"
