#!/usr/bin/env bash
# The real nodes' volumes (issue 28, "Volumes through real CSI"), cached under
#   $DEDUP_CACHE/csi/bin/{csi-attacher,csi-provisioner,dedup-csi-disk}
#   $DEDUP_CACHE/csi/rbac/{csi-attacher,csi-provisioner}.yaml
# - csi-attacher and csi-provisioner: the kubernetes-csi sidecars, built from their Go
#   modules at the versions of versions.env; their published RBAC (deploy/kubernetes/
#   rbac.yaml of the same module) is kept beside them for local/dedup_local/real_csi.py.
# - dedup-csi-disk: the project's own CSI driver (local/csi-disk), a stand-in for a
#   cloud disk. csi-driver-host-path and node-driver-registrar are not served by the Go
#   module proxy here, so the driver also serves the kubelet's plugin registration
#   socket itself (what node-driver-registrar would do).
# Every binary has a stamp naming its inputs (the driver's: a digest of its sources);
# a binary whose stamp matches is reused, so a cached re-run takes a moment.
#
# The sidecars' go.mod pin k8s.io/* with replace directives, which `go install pkg@v`
# refuses; so, as scripts/setup-kube.sh does for Kubernetes, the module is copied into a
# writable build directory and built there as the main module (the replaces name
# published versions, no local paths, so they stay).
source "$(dirname "$0")/lib.sh"

CSI_HOME="$DEDUP_CACHE/csi"
BIN="$CSI_HOME/bin"
STAMPS="$CSI_HOME/stamps"
BUILD_ROOT="$CSI_HOME/build"  # its own: the other setups remove theirs when empty
DRIVER_SRC="$REPO_ROOT/local/csi-disk"
# Bump when a recipe below changes in a way that should rebuild what is cached.
RECIPE=1

go_env  # scripts/lib.sh: the Go environment every set-up build shares

mkdir -p "$BIN" "$STAMPS" "$CSI_HOME/rbac"

if command -v flock >/dev/null; then
  exec 9>"$CSI_HOME/.lock"
  flock -n 9 || { log "csi: another setup-csi.sh is running; waiting for it"; flock 9; }
fi

need_go() {
  command -v go >/dev/null || die "go not found: install Go >= 1.26 (https://go.dev/dl/) and re-run"
  mkdir -p "$BUILD_ROOT"
}

is_cached() { # NAME WANT
  [[ -x "$BIN/$1" && "$(cat "$STAMPS/$1" 2>/dev/null)" == "$2" ]]
}

install_bin() { # NAME BUILT WANT
  [[ -x "$2" ]] || die "$1: build produced no binary at $2"
  cp "$2" "$BIN/.$1.tmp"
  mv -f "$BIN/.$1.tmp" "$BIN/$1"
  echo "$3" >"$STAMPS/$1"
  log "csi: installed $BIN/$1"
}

# build_sidecar NAME MODULE VERSION: ./cmd/NAME of MODULE@vVERSION, and its rbac.yaml.
build_sidecar() {
  local name="$1" module="$2" version="$3"
  local want="$name $module@v$version recipe=$RECIPE"
  if is_cached "$name" "$want" && [[ -f "$CSI_HOME/rbac/$name.yaml" ]]; then
    log "csi: reusing $name v$version"
    return 0
  fi
  need_go
  local t0=$SECONDS src work json
  log "csi: building $name v$version from $module"
  json="$(cd "$BUILD_ROOT" && go mod download -json "$module@v$version")" || die "go mod download $module@v$version failed"
  src="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  [[ -n "$src" && -d "$src" ]] || die "go mod download $module@v$version: no module directory"
  work="$BUILD_ROOT/$name-$version"
  rm -rf "$work"
  cp -r "$src" "$work"
  chmod -R u+w "$work"
  sed -i '/^toolchain[[:space:]]/d' "$work/go.mod"
  rm -rf "$work/vendor"
  go_prefetch "$work" mod "./cmd/$name"
  (cd "$work" && go_compile go build -mod=mod -trimpath -ldflags "-s -w -X main.version=v$version" \
    -o "$work/_out/$name" "./cmd/$name") || die "$name build failed (sources in $work)"
  cp "$work/deploy/kubernetes/rbac.yaml" "$CSI_HOME/rbac/.$name.yaml.tmp"
  mv -f "$CSI_HOME/rbac/.$name.yaml.tmp" "$CSI_HOME/rbac/$name.yaml"
  install_bin "$name" "$work/_out/$name" "$want"
  [[ "${DEDUP_KUBE_KEEP_BUILD:-0}" == 1 ]] || rm -rf "$work"
  log "csi: $name built in $((SECONDS - t0))s"
}

# The driver: its stamp is a digest of its sources (go.mod, go.sum, *.go) and Go's version.
build_driver() {
  local digest want
  digest="$( { cd "$DRIVER_SRC" && sha256sum go.mod go.sum ./*.go; go version 2>/dev/null || true; } \
    | sha256sum | cut -c1-16)"
  want="dedup-csi-disk $digest recipe=$RECIPE"
  if is_cached dedup-csi-disk "$want"; then
    log "csi: reusing dedup-csi-disk ($digest)"
    return 0
  fi
  need_go
  local t0=$SECONDS out="$BUILD_ROOT/dedup-csi-disk"
  rm -rf "$out"
  mkdir -p "$out"
  go_prefetch "$DRIVER_SRC" readonly .
  (cd "$DRIVER_SRC" && go_compile go build -mod=readonly -trimpath -ldflags "-s -w -X main.version=$digest" \
    -o "$out/dedup-csi-disk" .) || die "dedup-csi-disk build failed"
  install_bin dedup-csi-disk "$out/dedup-csi-disk" "$want"
  rm -rf "$out"
  log "csi: dedup-csi-disk built in $((SECONDS - t0))s"
}

t0=$SECONDS
case "${1:-all}" in
  all)
    # Side by side: downloads overlap, compiles take turns (go_compile).
    pids=()
    build_driver & pids+=($!)
    build_sidecar csi-attacher github.com/kubernetes-csi/external-attacher/v4 "$CSI_ATTACHER_VERSION" &
    pids+=($!)
    build_sidecar csi-provisioner github.com/kubernetes-csi/external-provisioner/v6 "$CSI_PROVISIONER_VERSION" &
    pids+=($!)
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    ((failed == 0)) || die "csi: a build failed (its error is above)"
    ;;
  driver) build_driver ;;
  sidecars)
    build_sidecar csi-attacher github.com/kubernetes-csi/external-attacher/v4 "$CSI_ATTACHER_VERSION"
    build_sidecar csi-provisioner github.com/kubernetes-csi/external-provisioner/v6 "$CSI_PROVISIONER_VERSION"
    ;;
  *) die "usage: $0 [all|driver|sidecars]" ;;
esac
rmdir "$BUILD_ROOT" 2>/dev/null || true
log "csi: ready in $BIN ($((SECONDS - t0))s)"
