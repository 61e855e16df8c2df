#!/usr/bin/env bash
# Build the real kube-apiserver and etcd the integration tests run against (SPEC §14),
# and kstatus (tests/kstatus, cli-utils) that judges the status Headroom writes,
# from the Go modules pinned in go.mod/go.sum, once. Later runs reuse the binaries while
# go.mod, go.sum and this script are unchanged. Prints the directory holding them.
#
#   tests/testenv/build.sh                               # build if needed, print the bin directory
#   HEADROOM_K8S_VERSION=v1.35.4 tests/testenv/build.sh  # an older release pinned by pin.sh
#   HEADROOM_TESTENV_DIR=/x build.sh                     # put the binaries elsewhere
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
newest="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")"
k8s_version="${HEADROOM_K8S_VERSION:-$newest}"
modfile="$here/go.mod"
if [[ "$k8s_version" != "$newest" ]]; then
  modfile="$here/go.$k8s_version.mod"
  if [[ ! -f "$modfile" ]]; then
    echo "Kubernetes $k8s_version is not pinned for the tests: $(cd "$here" && ls go.v*.mod 2>/dev/null | sed 's/^go\.//; s/\.mod$//' | tr '\n' ' ')and $newest are (tests/testenv/pin.sh pins another)" >&2
    exit 1
  fi
fi
sumfile="${modfile%.mod}.sum"
minor="${k8s_version#v1.}"; minor="${minor%%.*}"
out="${HEADROOM_TESTENV_DIR:-$repo/.cache/testenv/$k8s_version}"
kstatus_dir="$repo/tests/kstatus"
stamp="$(cat "$modfile" "$sumfile" "$kstatus_dir/go.mod" "$kstatus_dir/go.sum" "$kstatus_dir/main.go" "$0" | sha256sum | cut -c1-16)"

if [[ -x "$out/kube-apiserver" && -x "$out/etcd" && -x "$out/kstatus" && "$(cat "$out/stamp" 2>/dev/null)" == "$stamp" ]]; then

  echo "$out"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "Go is needed to build kube-apiserver and etcd for the demo and the tests: install Go 1.26+ (https://go.dev/dl/)" >&2
  exit 1
fi
mkdir -p "$out"
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
start=$(date +%s)
(cd "$here" && GOFLAGS=-mod=mod go build -modfile="$modfile" -trimpath -ldflags "$ldflags" -o "$out/" ./cmd/kube-apiserver ./cmd/etcd) >&2
(cd "$kstatus_dir" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/kstatus" .) >&2

echo "$stamp" > "$out/stamp"
echo "built kube-apiserver $k8s_version and etcd in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
