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

# The URL of Maven Central as this Maven installation's super POM names it (override
# with MAVEN_CENTRAL_URL, e.g. for a corporate mirror).
maven_central_url() {
  if [[ -n "${MAVEN_CENTRAL_URL:-}" ]]; then
    echo "$MAVEN_CENTRAL_URL"
    return
  fi
  local home jar
  home="$(mvn -v 2>/dev/null | sed -n 's/^Maven home: //p')"
  jar="$(ls "$home"/lib/maven-model-builder-*.jar 2>/dev/null | head -n1)"
  [[ -n "$jar" ]] || die "cannot find Maven's super POM under '$home'; set MAVEN_CENTRAL_URL"
  unzip -p "$jar" org/apache/maven/model/pom-4.0.0.xml |
    sed -n 's#.*<url>\(https://[^<]*\)</url>.*#\1#p' | head -n1
}

# Writes a Maven settings.xml into directory $1 that sends every repository to Maven
# Central (a POM's extra repositories, such as the GCS mirror in Spark's parent POM, may
# be unreachable) and prints its path; DEDUP_MAVEN_SETTINGS names your own instead.
maven_settings() {
  if [[ -n "${DEDUP_MAVEN_SETTINGS:-}" ]]; then
    echo "$DEDUP_MAVEN_SETTINGS"
    return
  fi
  local url
  url="$(maven_central_url)"
  cat >"$1/settings.xml" <<EOF
<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors>
    <mirror><id>central-only</id><mirrorOf>*</mirrorOf><url>$url</url></mirror>
  </mirrors>
</settings>
EOF
  echo "$1/settings.xml"
}

# ----------------------------------------------------------------------------- Go builds
# Every Go build of the set-up (etcd, helm, Kubernetes, crictl, the CSI sidecars, the
# driver) shares one environment: one compile cache ($DEDUP_CACHE/go-build, or
# DEDUP_GOCACHE), Go's own module download cache (GOMODCACHE, unless the caller set it),
# static binaries, no workspace, no VCS stamping (the sources come from module zips).
# The pinned releases need Go 1.24+; go fetches a newer toolchain from the proxy when the
# local one is older (a no-op when it is new enough).
go_env() {
  export GOCACHE="${DEDUP_GOCACHE:-$DEDUP_CACHE/go-build}"
  export GOWORK=off
  export CGO_ENABLED=0
  export GOFLAGS="-buildvcs=false -p=$(go_build_jobs)"
  export GO111MODULE=on
  export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
}

# go_build_jobs -> how many packages one go build compiles at once: the cores, or
# DEDUP_GO_JOBS.
go_build_jobs() { echo "${DEDUP_GO_JOBS:-$(nproc 2>/dev/null || echo 2)}"; }

# go_compile CMD...: runs CMD (a go build or go install) holding the machine-wide Go
# compile lock, so that `make -j` set-ups (and two checkouts' set-ups on one machine)
# compile one Go program at a time: on two cores, six builds side by side thrashed (a
# cold set-up took 34 minutes, Kubernetes 951 s of it), and one after the other each
# finds the packages the one before compiled (the same k8s.io/* releases) in the shared
# compile cache. Downloads are not under the lock: fetch the modules first
# (go_prefetch). DEDUP_GO_LOCK names another lock file.
go_compile() {
  local lock="${DEDUP_GO_LOCK:-/tmp/dedup-operator-go-compile.lock}" t0=$SECONDS fd rc=0
  exec {fd}>"$lock"
  if ! flock -n "$fd"; then
    log "go: waiting for another Go build to finish (one at a time: $lock)"
    flock "$fd"
    log "go: waited $((SECONDS - t0))s"
  fi
  "$@" || rc=$?
  exec {fd}>&-
  return "$rc"
}

# go_prefetch DIR MOD PACKAGE...: downloads the modules that building PACKAGE... in the
# main module DIR with -mod=MOD (mod: a writable copy; readonly: the module cache's own
# copy, or a checkout whose go.mod and go.sum must stay as they are) needs: network, no
# compiling (`go list -deps` only reads the imports), outside the compile lock, so that
# one build's downloads overlap another's compile. `go mod download` would fetch every
# module of the graph, and some of Kubernetes' are not served (k8s.io/sample-cli-plugin).
# A failed prefetch only leaves the downloads to the build.
go_prefetch() {
  local dir="$1" mode="$2" t0=$SECONDS
  shift 2
  if (cd "$dir" && go list -mod="$mode" -e -deps "$@" >/dev/null); then
    log "go: fetched the modules of $(basename "$dir") ($*) in $((SECONDS - t0))s"
  else
    log "go: prefetching the modules of $dir failed; its build fetches them"
  fi
}
