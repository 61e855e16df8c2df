#!/usr/bin/env bash
# Build the real node's parts from Go modules, once: kubelet, kube-scheduler,
# kube-controller-manager and kube-proxy from the pinned k8s.io/kubernetes (the API server's release),
# containerd + ctr + the runc shim from the module proxy, and a static pause binary.
# Later runs reuse them while what they are built from is unchanged. Prints the directory.
#
#   tests/realnode/build.sh                   # build if needed, print the bin directory
#   HEADROOM_REALNODE_DIR=/x build.sh         # put the binaries elsewhere
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")"
out="${HEADROOM_REALNODE_DIR:-$repo/.cache/realnode/$version}"
stamp="$(cat "$here/go.mod" "$here/go.sum" "$here"/cmd/*/main.go "$here/containerd/go.mod" "$here/containerd/go.sum" "$0" | sha256sum | cut -c1-16)"
bins=(kubelet kube-scheduler kube-controller-manager kube-proxy pause containerd ctr containerd-shim-runc-v2)
ok=1
for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || ok=0; done
if [[ $ok == 1 && "$(cat "$out/stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "$out"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "Go is needed to build the real test node: install Go 1.26+ (https://go.dev/dl/)" >&2
  exit 1
fi
mkdir -p "$out"
minor="${version#v1.}"; minor="${minor%%.*}"
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
start=$(date +%s)
(cd "$here" && GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$out/" ./cmd/kubelet ./cmd/kube-scheduler ./cmd/kube-controller-manager ./cmd/kube-proxy) >&2
(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/pause" ./cmd/pause) >&2
(cd "$here/containerd" && GOFLAGS=-mod=mod go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w" -o "$out/" \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2) >&2
echo "$stamp" > "$out/stamp"
echo "built the real node's kubelet, scheduler, controller-manager, kube-proxy ($version), containerd and pause in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
