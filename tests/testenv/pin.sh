#!/usr/bin/env bash
# Pin another Kubernetes release for the test control plane: writes go.<version>.mod and
# go.<version>.sum beside go.mod (the newest release, the default), requiring that
# release's k8s.io/kubernetes, its staging modules at v0.<minor>.<patch> and the etcd
# server its own go.mod names. build.sh builds from them when HEADROOM_K8S_VERSION asks.
#
#   tests/testenv/pin.sh v1.35.4
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="${1:?usage: pin.sh vMAJOR.MINOR.PATCH}"
staging="v0.${version#v1.}"
upstream="$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
etcd="$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$upstream")"
modfile="$here/go.$version.mod"
{
  echo "// Builds the real kube-apiserver and etcd $version for the tests (written by pin.sh)."
  echo "module github.com/kube-headroom/testenv"
  echo
  echo "go 1.26.0"
  echo
  echo "require ("
  echo "	go.etcd.io/etcd/server/v3 $etcd"
  echo "	k8s.io/component-base $staging"
  echo "	k8s.io/kubernetes $version"
  echo ")"
  echo
  echo "replace ("
  awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print "\t" $1 " => " $1 " '"$staging"'"}' "$upstream"
  echo ")"
} > "$modfile"
: > "$here/go.$version.sum"
(cd "$here" && go mod tidy -modfile="$modfile")
echo "pinned $version (etcd $etcd) in $modfile" >&2
