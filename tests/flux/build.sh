#!/usr/bin/env bash
# Build Flux's source-controller, kustomize-controller and helm-controller from the Go
# module proxy, once, at the versions flux2 v2.9.5 pins (the v1.10 line needs Go 1.27), and
# collect their CRDs (config/crd/bases). Later runs reuse them while this script is
# unchanged. Prints the directory.
#
# Not pristine release builds in one respect: source-controller v1.9.6 requires
# github.com/fluxcd/pkg/artifact v0.18.3, which the module proxy does not serve; it is
# built with that module replaced by v0.18.1. The module zips leave out the nested ./api
# module each go.mod replaces locally: it is downloaded at the same version into ./api.
#
#   tests/flux/build.sh                       # build if needed, print the directory
#   HEADROOM_FLUX_DIR=/x tests/flux/build.sh  # put the binaries elsewhere
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
controllers=(source-controller@v1.9.6 kustomize-controller@v1.9.6 helm-controller@v1.6.4)
stamp="$(cat "$0" | sha256sum | cut -c1-16)"
out="${HEADROOM_FLUX_DIR:-$repo/.cache/flux}"
ok=1
for c in "${controllers[@]}"; do [[ -x "$out/${c%@*}" ]] || ok=0; done
if [[ $ok == 1 && "$(cat "$out/stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "$out"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "Go is needed to build the Flux controllers for the tests: install Go 1.26+ (https://go.dev/dl/)" >&2
  exit 1
fi
rm -rf "$out" && mkdir -p "$out/crds"
work="$(mktemp -d)"
dir() { (cd "$work" && go mod download -json "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'); }
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
start=$(date +%s)
for c in "${controllers[@]}"; do
  name="${c%@*}" version="${c#*@}"
  src="$work/$name"
  cp -r "$(dir "github.com/fluxcd/$c")" "$src"
  chmod -R u+w "$src"
  cp -r "$(dir "github.com/fluxcd/$name/api@$version")" "$src/api"
  chmod -R u+w "$src/api"
  if [[ $name == source-controller ]]; then
    (cd "$src" && go mod edit -replace github.com/fluxcd/pkg/artifact=github.com/fluxcd/pkg/artifact@v0.18.1)
  fi
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/$name" .) >&2
  cp "$src"/config/crd/bases/*.yaml "$out/crds/"
  echo "built $name $version ($(( $(date +%s) - start ))s so far)" >&2
done
echo "$stamp" > "$out/stamp"
echo "built the Flux controllers in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
