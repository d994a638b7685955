#!/usr/bin/env bash
# Builds the real Kubernetes control plane used by the integration tests, from the Go
# modules published on the Go module proxy, and caches it under
#   $DEDUP_CACHE/kube-$KUBERNETES_VERSION/bin/{kube-apiserver,kube-controller-manager,
#                                             kube-scheduler,kubectl,kubelet,kube-proxy,
#                                             etcd,helm}
# (kubelet and kube-proxy run the local cluster's real nodes: scripts/setup-nodes.sh.)
# Versions come from versions.env only. Every binary has a stamp file naming what it was
# built from; a binary whose stamp matches is reused, so a cached re-run takes a moment.
# The first run compiles Kubernetes from source (several minutes on two cores).
#
# Why not `go install`: k8s.io/kubernetes (and etcd's main module) replace their sibling
# modules with local paths that the module zip does not contain, and `go install pkg@v`
# refuses modules with replace directives. So the source is copied into a writable build
# directory and each local replace is turned into a requirement on the published module
# of the same release.
#
# Environment knobs: DEDUP_CACHE, GOPROXY (default: go's own), DEDUP_KUBE_KEEP_BUILD=1
# keeps the build directories (they are deleted after a successful build otherwise).
source "$(dirname "$0")/lib.sh"

KUBE_HOME="$DEDUP_CACHE/kube-$KUBERNETES_VERSION"
BIN="$KUBE_HOME/bin"
STAMPS="$KUBE_HOME/stamps"
BUILD_ROOT="$DEDUP_CACHE/build"
# Bump when the recipe below changes in a way that should rebuild cached binaries.
RECIPE=2

# The Go environment every set-up build shares (scripts/lib.sh: one compile cache in
# $DEDUP_CACHE/go-build, several GB for Kubernetes, so `make clean-cache` removes it too;
# Go's own module download cache; one compile at a time on the machine).
go_env

mkdir -p "$BIN" "$STAMPS"

# One setup at a time per cache (e.g. under `make -j`): the others wait, then reuse.
if command -v flock >/dev/null; then
  exec 9>"$KUBE_HOME/.lock"
  flock -n 9 || { log "kube: another setup-kube.sh is running; waiting for it"; flock 9; }
fi

# need_go: called before any build; the cached path needs no Go at all.
need_go() {
  command -v go >/dev/null || die "go not found: install Go >= 1.24 (https://go.dev/dl/) and re-run"
  mkdir -p "$BUILD_ROOT"
}

# stamp_want NAME -> the stamp content the cached binary must have
stamp_want() {
  case "$1" in
    etcd) echo "etcd $ETCD_VERSION recipe=$RECIPE" ;;
    helm) echo "helm $HELM_VERSION recipe=$RECIPE" ;;
    *) echo "$1 $KUBERNETES_VERSION recipe=$RECIPE" ;;
  esac
}

is_cached() {
  [[ -x "$BIN/$1" && -f "$STAMPS/$1" && "$(cat "$STAMPS/$1")" == "$(stamp_want "$1")" ]]
}

# install_bin NAME BUILT_FILE: atomically put a freshly built binary in place and stamp it.
install_bin() {
  local name="$1" built="$2"
  [[ -x "$built" ]] || die "$name: build produced no binary at $built"
  cp "$built" "$BIN/.$name.tmp"
  mv -f "$BIN/.$name.tmp" "$BIN/$name"
  stamp_want "$name" > "$STAMPS/$name"
  log "kube: installed $BIN/$name"
}

# module_dir MODULE@VERSION -> the extracted module directory in the module cache.
module_dir() {
  local json dir
  json="$(cd "$BUILD_ROOT" && go mod download -json "$1")" || die "go mod download $1 failed"
  dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  [[ -n "$dir" && -d "$dir" ]] || die "go mod download $1: no module directory in: $json"
  echo "$dir"
}

# module_time MODULE@VERSION -> the release time recorded by the proxy (RFC 3339), from
# the module's .info file; empty when unknown.
module_time() {
  local json info
  json="$(cd "$BUILD_ROOT" && go mod download -json "$1")" || return 0
  info="$(sed -n 's/^[[:space:]]*"Info": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  [[ -f "$info" ]] || return 0
  sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info" | head -1
}

# fresh_copy SRC DEST: writable copy of a (read-only) module cache directory. Its
# go.mod loses any `toolchain` line before go runs there, so the local Go builds it
# whenever it satisfies the `go` line (go would otherwise fetch that exact toolchain).
fresh_copy() {
  rm -rf "$2"
  mkdir -p "$(dirname "$2")"
  cp -r "$1" "$2"
  chmod -R u+w "$2"
  sed -i '/^toolchain[[:space:]]/d' "$2/go.mod"
}

# unlocalize_replaces DIR VERSION_FN: turn every `X => ./local/path` (or ../path) replace
# in DIR/go.mod into `require X VERSION`, where VERSION is printed by the shell function
# VERSION_FN called with the module path X. When it prints nothing, the replace is only
# dropped (e.g. etcd's `go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY` guards).
unlocalize_replaces() {
  local dir="$1" version_of="$2" mod ver
  local -a edits=()
  while read -r mod; do
    ver="$("$version_of" "$mod")"
    edits+=("-dropreplace=$mod")
    [[ -z "$ver" ]] || edits+=("-require=$mod@$ver")
  done < <(cd "$dir" && go mod edit -json | tr -d ' \t\n' \
    | grep -o '"Old":{[^}]*"Path":"[^"]*"[^}]*},"New":{[^}]*"Path":"\.[^"]*"' \
    | sed 's/^"Old":{[^}]*"Path":"\([^"]*\)".*/\1/')
  ((${#edits[@]} == 0)) || (cd "$dir" && go mod edit "${edits[@]}")
}

# --------------------------------------------------------------------------- kubernetes
KUBE_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)

staging_version() { echo "v0.${KUBERNETES_VERSION#*.}"; }

build_kubernetes() {
  local missing=() b
  for b in "${KUBE_BINS[@]}"; do is_cached "$b" || missing+=("$b"); done
  if ((${#missing[@]} == 0)); then
    log "kube: reusing kubernetes $KUBERNETES_VERSION binaries in $BIN"
    return 0
  fi
  need_go
  local t0=$SECONDS src work
  log "kube: building ${missing[*]} $KUBERNETES_VERSION from source (first time: ~10-20 min on 2 cores)"
  src="$(module_dir "k8s.io/kubernetes@v$KUBERNETES_VERSION")"
  work="$BUILD_ROOT/kubernetes-$KUBERNETES_VERSION"
  log "kube: preparing sources in $work"
  fresh_copy "$src" "$work"
  rm -rf "$work/vendor" "$work/go.work" "$work/go.work.sum"
  unlocalize_replaces "$work" staging_version

  local major minor date ldflags=() pkg key
  major="${KUBERNETES_VERSION%%.*}"
  minor="${KUBERNETES_VERSION#*.}"
  minor="${minor%%.*}"
  date="$(module_time "k8s.io/kubernetes@v$KUBERNETES_VERSION")"
  local -A vars=(
    [gitVersion]="v$KUBERNETES_VERSION"
    [gitMajor]="$major"
    [gitMinor]="$minor"
    [gitTreeState]="clean"
    [buildDate]="${date:-1970-01-01T00:00:00Z}"
  )
  for key in "${!vars[@]}"; do
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=("-X '$pkg.$key=${vars[$key]}'")
    done
  done

  local pkgs=()
  for b in "${missing[@]}"; do pkgs+=("./cmd/$b"); done
  log "kube: compiling ${pkgs[*]}"
  mkdir -p "$work/_out"
  go_prefetch "$work" mod "${pkgs[@]}"
  (cd "$work" && go_compile go build -mod=mod -trimpath -ldflags "-s -w ${ldflags[*]}" -o "$work/_out/" "${pkgs[@]}") \
    || die "kubernetes build failed (sources in $work)"
  for b in "${missing[@]}"; do install_bin "$b" "$work/_out/$b"; done
  "$BIN/kube-apiserver" --version >&2 || true
  [[ "${DEDUP_KUBE_KEEP_BUILD:-0}" == 1 ]] || rm -rf "$work"
  log "kube: kubernetes built in $((SECONDS - t0))s"
}

# ------------------------------------------------------------------------------- etcd
# The etcd server's main package is the root of go.etcd.io/etcd/server/v3 (etcd's own
# build.sh builds `./server` into bin/etcd). Its go.mod points its sibling modules at
# ../api etc.; those are published at the same version.
etcd_sibling_version() {
  case "$1" in
    go.etcd.io/etcd/api/v3 | go.etcd.io/etcd/client/pkg/v3 | go.etcd.io/etcd/client/v3 | go.etcd.io/etcd/pkg/v3)
      echo "v$ETCD_VERSION" ;;
    *) echo "" ;;
  esac
}

build_etcd() {
  if is_cached etcd; then
    log "kube: reusing etcd $ETCD_VERSION"
    return 0
  fi
  need_go
  local t0=$SECONDS src work
  log "kube: building etcd $ETCD_VERSION from source"
  src="$(module_dir "go.etcd.io/etcd/server/v3@v$ETCD_VERSION")"
  work="$BUILD_ROOT/etcd-$ETCD_VERSION"
  fresh_copy "$src" "$work"
  unlocalize_replaces "$work" etcd_sibling_version
  go_prefetch "$work" mod .
  (cd "$work" && go_compile go build -mod=mod -trimpath \
    -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v$ETCD_VERSION" \
    -o "$work/_out/etcd" .) || die "etcd build failed (sources in $work)"
  install_bin etcd "$work/_out/etcd"
  "$BIN/etcd" --version >&2 || true
  [[ "${DEDUP_KUBE_KEEP_BUILD:-0}" == 1 ]] || rm -rf "$work"
  log "kube: etcd built in $((SECONDS - t0))s"
}

# ------------------------------------------------------------------------------- helm
# helm has no replace directives, so `go install` works; the ldflags are those of its
# Makefile (version, and the Kubernetes version it reports to charts as the default).
build_helm() {
  if is_cached helm; then
    log "kube: reusing helm $HELM_VERSION"
    return 0
  fi
  need_go
  local t0=$SECONDS src kmajor kminor out
  log "kube: building helm $HELM_VERSION from source"
  src="$(module_dir "helm.sh/helm/v3@v$HELM_VERSION")"
  # k8s.io/client-go v0.34.x -> Kubernetes 1.34
  kminor="$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$src/go.mod" | head -1)"
  kmajor=1
  local v=helm.sh/helm/v3
  local ldflags="-s -w -X $v/internal/version.version=v$HELM_VERSION -X $v/internal/version.metadata="
  ldflags+=" -X $v/internal/version.gitTreeState=clean"
  if [[ -n "$kminor" ]]; then
    ldflags+=" -X $v/pkg/lint/rules.k8sVersionMajor=$kmajor -X $v/pkg/lint/rules.k8sVersionMinor=$kminor"
    ldflags+=" -X $v/pkg/chartutil.k8sVersionMajor=$kmajor -X $v/pkg/chartutil.k8sVersionMinor=$kminor"
  fi
  out="$BUILD_ROOT/helm-$HELM_VERSION"
  rm -rf "$out"
  mkdir -p "$out"
  go_prefetch "$src" readonly ./cmd/helm
  (cd "$BUILD_ROOT" && GOBIN="$out" go_compile go install -trimpath -ldflags "$ldflags" "$v/cmd/helm@v$HELM_VERSION") \
    || die "helm build failed"
  install_bin helm "$out/helm"
  "$BIN/helm" version >&2 || true
  rm -rf "$out"
  log "kube: helm built in $((SECONDS - t0))s"
}

case "${1:-all}" in
  all)
    # Side by side: each fetches its modules at once, and they compile one at a time
    # (go_compile), so that downloads overlap the compiles.
    t0=$SECONDS
    pids=()
    build_kubernetes & pids+=($!)
    build_etcd & pids+=($!)
    build_helm & pids+=($!)
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    ((failed == 0)) || die "kube: a build failed (its error is above)"
    rmdir "$BUILD_ROOT" 2>/dev/null || true
    log "kube: ready in $BIN ($((SECONDS - t0))s)"
    ;;
  kubernetes) build_kubernetes ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  *) die "usage: $0 [all|kubernetes|etcd|helm]" ;;
esac
