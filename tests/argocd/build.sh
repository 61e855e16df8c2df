#!/usr/bin/env bash
# Build Argo CD v3.6.2 from the Go module proxy, once: a binary holding the application
# controller, the repo-server and git-ask-pass (tests/argocd/main.go), its role links, the
# Application/AppProject CRDs and base ConfigMaps/Secret from the module's manifests/, and
# the module's hack/git-verify-wrapper.sh, which the repo-server calls for every git
# checkout. Later runs reuse them while this script and main.go are unchanged. Prints the
# directory.
#
# Argo CD's go.mod asks for Go 1.27: GOTOOLCHAIN is set here only, so the go command fetches
# that toolchain from the module proxy (once per machine, ~75 MB); the project's own Go
# modules keep the Go they have. The module zip leaves out the nested ./gitops-engine
# module its go.mod replaces locally: it is downloaded at the same version into it.
#
#   tests/argocd/build.sh                         # build if needed, print the directory
#   HEADROOM_ARGOCD_DIR=/x tests/argocd/build.sh  # put the binary elsewhere
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version=v3.6.2
roles=(argocd-application-controller argocd-repo-server argocd-git-ask-pass)
stamp="$(cat "$0" "$here/main.go" | sha256sum | cut -c1-16)"
out="${HEADROOM_ARGOCD_DIR:-$repo/.cache/argocd}"
if [[ -x "$out/argocd" && "$(cat "$out/stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "$out"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "Go is needed to build Argo CD for the tests: install Go 1.26+ (https://go.dev/dl/)" >&2
  exit 1
fi
export GOTOOLCHAIN=go1.27.3
rm -rf "$out" && mkdir -p "$out/manifests" "$out/hack"
work="$(mktemp -d)"
dir() { (cd "$work" && go mod download -json "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'); }
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
start=$(date +%s)
src="$work/argo-cd"
cp -r "$(dir "github.com/argoproj/argo-cd/v3@$version")" "$src"
chmod -R u+w "$src"
rm -rf "$src/gitops-engine"
cp -r "$(dir "github.com/argoproj/argo-cd/gitops-engine/v3@$version")" "$src/gitops-engine"
chmod -R u+w "$src/gitops-engine"
mkdir -p "$src/cmd/headroom-testbed"
cp "$here/main.go" "$src/cmd/headroom-testbed/main.go"
(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/argocd" ./cmd/headroom-testbed) >&2
for role in "${roles[@]}"; do ln -s argocd "$out/$role"; done
cp "$src"/manifests/crds/application-crd.yaml "$src"/manifests/crds/appproject-crd.yaml "$out/manifests/"
cp "$src"/manifests/base/config/argocd-*.yaml "$out/manifests/"
cp "$src/hack/git-verify-wrapper.sh" "$out/hack/"
chmod +x "$out/hack/git-verify-wrapper.sh"
echo "$version" > "$out/version"
echo "$stamp" > "$out/stamp"
echo "built Argo CD $version in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
