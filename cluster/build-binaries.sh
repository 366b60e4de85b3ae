#!/usr/bin/env bash
# Build etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok from the Go module
# proxy into a cache outside the checkout, keyed by the pinned versions. Idempotent: a complete
# cache is reused; prints the bin directory on stdout.
#
#   build-binaries.sh           the control plane (above)
#   build-binaries.sh kubelet   only the kubelet, for real Nodes (cluster/realnode.py), in a cache
#                               directory of its own so the control plane's stays complete
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# K8S_VERSION from the environment picks another Kubernetes release (its own cache directory);
# versions.env pins the default
k8s_wanted=${K8S_VERSION:-}
# shellcheck source=versions.env
source "$here/versions.env"
K8S_VERSION=${k8s_wanted:-$K8S_VERSION}
cache_root=${SLURMGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slurmgate}
mode=${1:-control-plane}
case "$mode" in
  control-plane)
    bin="$cache_root/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
    want=(etcd kube-apiserver kube-scheduler kube-controller-manager kwok)
    [ -f "$bin/kwok-stages.yaml" ] || rm -f "$bin/kwok"  # stages ship with the kwok build
    # binaries built before they carried their version are rebuilt (a relink, with a warm Go cache)
    [ -f "$bin/stamped" ] || rm -f "$bin"/kube-{apiserver,scheduler,controller-manager} ;;
  kubelet)
    bin="$cache_root/bin/kubelet-$K8S_VERSION"
    want=(kubelet) ;;
  *) echo "usage: $0 [kubelet]" >&2; exit 2 ;;
esac
complete=1
for b in "${want[@]}"; do [ -x "$bin/$b" ] || complete=0; done
if [ "$complete" = 1 ]; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { echo "go is required to build the control plane" >&2; exit 1; }
mkdir -p "$bin"
work=$(mktemp -d "$cache_root/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
log() { echo "[build] $*" >&2; }

# A module that requires k8s.io/kubernetes at the pinned version, importing the given commands.
k8s_module() {  # dir cmd...
  local mod=$1; shift
  mkdir -p "$mod"
  go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null
  local kmod
  kmod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$K8S_VERSION.mod
  local staging_version="v0.${K8S_VERSION#1.}"
  {
    echo "module local/k8sbuild"
    echo
    echo "go $(awk '/^go /{print $2; exit}' "$kmod")"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    # k8s.io/kubernetes points its staging modules at ./staging; map each to its published version.
    grep -E '=> \./staging/src/' "$kmod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } > "$mod/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for c in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
    printf ')\n'
  } > "$mod/tools.go"
  (cd "$mod" && go mod tidy -e >&2 2>&1 | tail -5 >&2 || true)
}

# the version the apiserver reports (/version, kubectl version): unstamped it says v0.0.0-master
stamp="-X k8s.io/component-base/version.gitVersion=v$K8S_VERSION"
stamp+=" -X k8s.io/component-base/version.gitMajor=${K8S_VERSION%%.*}"
minor=${K8S_VERSION#*.}
stamp+=" -X k8s.io/component-base/version.gitMinor=${minor%%.*}"

if [ "$mode" = kubelet ]; then
  log "kubelet v$K8S_VERSION (~1 min with a warm Go cache, ~10 min cold on 2 cores)"
  k8s_module "$work/k8s" kubelet
  (cd "$work/k8s" && go build -trimpath \
    -ldflags="-s -w $stamp" \
    -o "$bin/kubelet.tmp" k8s.io/kubernetes/cmd/kubelet >&2)
  mv "$bin/kubelet.tmp" "$bin/kubelet"
  echo "$bin"
  exit 0
fi

# Build a main package of a module through a throwaway module of ours: `go install mod@v` refuses
# modules whose go.mod has replace directives (etcd's and kwok's do).
build_pkg() {  # module version package output
  local dir="$work/$(basename "$4")"
  mkdir -p "$dir"
  printf 'module local/build\n\ngo 1.26\n' > "$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$3" > "$dir/tools.go"
  (cd "$dir" && go get "$1@$2" >&2 && go mod tidy >&2 && \
    go build -trimpath -ldflags="-s -w" -o "$4.tmp" "$3" >&2)
  mv "$4.tmp" "$4"
}

if [ ! -x "$bin/etcd" ]; then
  log "etcd v$ETCD_VERSION"
  build_pkg go.etcd.io/etcd/server/v3 "v$ETCD_VERSION" go.etcd.io/etcd/server/v3 "$bin/etcd"
fi

if [ ! -x "$bin/kwok" ]; then
  log "kwok v$KWOK_VERSION"
  build_pkg sigs.k8s.io/kwok "v$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "$bin/kwok.bin"
  # kwok needs Stage objects (node ready + lease heartbeat, pod ready/complete/delete);
  # take the ones its module ships, as its own `kwokctl` does.
  st="$(go env GOMODCACHE)/sigs.k8s.io/kwok@v$KWOK_VERSION/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"; cat "$st/$f"
  done > "$bin/kwok-stages.yaml"
  mv "$bin/kwok.bin" "$bin/kwok"
fi

k8s_missing=0
for b in kube-apiserver kube-scheduler kube-controller-manager; do [ -x "$bin/$b" ] || k8s_missing=1; done
if [ "$k8s_missing" = 1 ]; then
  log "kubernetes v$K8S_VERSION (this is the slow part: ~10-25 min cold on 2 cores)"
  mod="$work/k8s"
  k8s_module "$mod" kube-apiserver kube-controller-manager kube-scheduler
  for b in kube-apiserver kube-scheduler kube-controller-manager; do
    [ -x "$bin/$b" ] && continue
    log "  $b"
    (cd "$mod" && go build -trimpath -ldflags="-s -w $stamp" -o "$bin/$b.tmp" \
      "k8s.io/kubernetes/cmd/$b" >&2)
    mv "$bin/$b.tmp" "$bin/$b"
  done
  touch "$bin/stamped"
fi
echo "$bin"
