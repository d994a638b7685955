#!/usr/bin/env bash
# What the local cluster's real nodes need besides kubelet and kube-proxy (which
# scripts/setup-kube.sh builds with the other Kubernetes binaries):
#   - containerd, runc, the CNI plugins (/usr/lib/cni) and iptables: Debian packages,
#     installed with apt-get when missing and we are root (as setup-image.sh does for
#     podman); otherwise stops with one line saying what to install;
#   - crictl, built from its Go module (sigs.k8s.io/cri-tools): a node's stop() removes
#     its pods through the CRI, so CNI tears their networks down;
#   - the pause image (the pod sandbox's process), compiled from the Kubernetes source
#     the control plane is built from (build/pause/linux/pause.c, gcc -static) and
#     packed as a docker-archive tarball that `ctr -n k8s.io images import` accepts (no
#     container registry is reachable here: nothing is pulled).
# Everything is cached under $DEDUP_CACHE/nodes with a stamp naming its inputs; a second
# run with the same inputs returns at once. Used by local/dedup_local/real_node.py.
source "$(dirname "$0")/lib.sh"

NODES_HOME="$DEDUP_CACHE/nodes"
BIN="$NODES_HOME/bin"
STAMPS="$NODES_HOME/stamps"
# Bump when a recipe below changes in a way that should rebuild what is cached.
RECIPE=1
PACKAGES=(containerd runc containernetworking-plugins iptables)
mkdir -p "$BIN" "$STAMPS"

if command -v flock >/dev/null; then
  exec 9>"$NODES_HOME/.lock"
  flock -n 9 || { log "nodes: another setup-nodes.sh is running; waiting for it"; flock 9; }
fi

# ------------------------------------------------------------------------- packages
install_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v ctr >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
    || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  if ((${#missing[@]} == 0)); then
    log "nodes: containerd $(containerd --version | awk '{print $3}'), runc, CNI plugins present"
    return 0
  fi
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    log "nodes: installing ${PACKAGES[*]} (Debian packages)"
    # Waits for the dpkg lock: `make setup` may run setup-image.sh's apt-get beside this.
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    # The package's own service is never started here (no systemd): every node runs
    # its own containerd with its own root, state and socket.
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      "${PACKAGES[@]}" >/dev/null
  else
    die "nodes: ${missing[*]} missing; install them: sudo apt-get install ${PACKAGES[*]}"
  fi
}

# ------------------------------------------------------------------------- crictl
build_crictl() {
  local want="crictl $CRI_TOOLS_VERSION recipe=$RECIPE"
  if [[ -x "$BIN/crictl" && "$(cat "$STAMPS/crictl" 2>/dev/null)" == "$want" ]]; then
    log "nodes: reusing crictl $CRI_TOOLS_VERSION"
    return 0
  fi
  command -v go >/dev/null || die "go not found: install Go >= 1.24 (https://go.dev/dl/) and re-run"
  local t0=$SECONDS out="$NODES_HOME/build-crictl"
  rm -rf "$out"
  mkdir -p "$out"
  # cri-tools has no replace directives, so `go install` works.
  go_env
  local src
  src="$(cd "$out" && go mod download -json "sigs.k8s.io/cri-tools@v$CRI_TOOLS_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')" || true
  [[ -z "$src" ]] || go_prefetch "$src" readonly ./cmd/crictl
  (cd "$out" && GOBIN="$out" go_compile go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRI_TOOLS_VERSION" \
    "sigs.k8s.io/cri-tools/cmd/crictl@v$CRI_TOOLS_VERSION") || die "crictl build failed"
  cp "$out/crictl" "$BIN/.crictl.tmp"
  mv -f "$BIN/.crictl.tmp" "$BIN/crictl"
  echo "$want" >"$STAMPS/crictl"
  rm -rf "$out"
  log "nodes: crictl built in $((SECONDS - t0))s"
}

# ------------------------------------------------------------------------- pause
# The tarball's name carries the Kubernetes version and a digest of its inputs (pause.c,
# the compiler's version, this recipe), so another source or compiler makes another one.
pause_image() {
  local src dir digest tag ref tarball work layer_sha config_sha
  command -v gcc >/dev/null || die "nodes: gcc missing (for the pause image); install it: sudo apt-get install gcc libc6-dev"
  command -v go >/dev/null || die "go not found: install Go >= 1.24 (https://go.dev/dl/) and re-run"
  # a directory of its own to run go in: setup-kube.sh, beside it under make -j, removes
  # $DEDUP_CACHE/build when it is done (a shared one vanished under this cd once)
  local modwork
  modwork="$(mktemp -d "$NODES_HOME/mod.XXXXXX")"
  dir="$(cd "$modwork" && go mod download -json "k8s.io/kubernetes@v$KUBERNETES_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  rmdir "$modwork" 2>/dev/null || true
  src="$dir/build/pause/linux/pause.c"
  [[ -f "$src" ]] || die "nodes: no $src in the Kubernetes module"
  # The tag its Makefile gives the image (TAG ?= 3.10.1).
  tag="$(sed -n 's/^TAG ?= *//p' "$dir/build/pause/Makefile" | head -1)"
  [[ -n "$tag" ]] || die "nodes: no TAG in $dir/build/pause/Makefile"
  digest="$( { sha256sum "$src" | cut -d' ' -f1; gcc --version | head -1; echo "recipe=$RECIPE"; } \
    | sha256sum | cut -c1-12)"
  ref="localhost/dedup-pause:$tag"
  tarball="$NODES_HOME/pause-$tag-$digest.tar"
  if [[ -f "$tarball" ]]; then
    log "nodes: reusing the pause image $tarball"
  else
    local t0=$SECONDS
    work="$(mktemp -d "$NODES_HOME/pause-build.XXXXXX")"
    mkdir -p "$work/rootfs" "$work/archive"
    # The flags of build/pause/Makefile (CFLAGS = -Os -Wall -Werror -static -DVERSION=...).
    gcc -Os -Wall -Werror -static -DVERSION="v$tag-dedup" -o "$work/rootfs/pause" "$src" \
      || die "nodes: compiling pause.c failed"
    strip "$work/rootfs/pause" 2>/dev/null || true
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/rootfs" \
      -cf "$work/layer.tar" pause
    layer_sha="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
    # The image config as the official pause image has it: /pause as 65535:65535.
    printf '%s' "{\"architecture\":\"amd64\",\"os\":\"linux\",\"created\":\"1970-01-01T00:00:00Z\",\"config\":{\"Entrypoint\":[\"/pause\"],\"User\":\"65535:65535\",\"WorkingDir\":\"/\"},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer_sha\"]},\"history\":[{\"created\":\"1970-01-01T00:00:00Z\",\"created_by\":\"gcc -static build/pause/linux/pause.c (Kubernetes v$KUBERNETES_VERSION)\"}]}" \
      >"$work/config.json"
    config_sha="$(sha256sum "$work/config.json" | cut -d' ' -f1)"
    mkdir -p "$work/archive/$layer_sha"
    mv "$work/layer.tar" "$work/archive/$layer_sha/layer.tar"
    mv "$work/config.json" "$work/archive/$config_sha.json"
    printf '%s' "[{\"Config\":\"$config_sha.json\",\"RepoTags\":[\"$ref\"],\"Layers\":[\"$layer_sha/layer.tar\"]}]" \
      >"$work/archive/manifest.json"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/archive" \
      -cf "$tarball.tmp" .
    mv -f "$tarball.tmp" "$tarball"
    rm -rf "$work"
    # Older pause tarballs (other inputs) go.
    find "$NODES_HOME" -maxdepth 1 -name 'pause-*.tar' ! -path "$tarball" -delete
    log "nodes: pause image $ref made in $((SECONDS - t0))s: $tarball"
  fi
  # What real_node.py reads: the image reference and its tarball.
  printf '%s\n%s\n' "$ref" "$tarball" >"$NODES_HOME/.pause.tmp"
  mv -f "$NODES_HOME/.pause.tmp" "$NODES_HOME/pause"
}

t0=$SECONDS
install_packages
build_crictl
pause_image
log "nodes: ready in $NODES_HOME ($((SECONDS - t0))s)"
