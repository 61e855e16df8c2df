#!/usr/bin/env bash
# Build the latency benchmark's two programs, once: svc (the service, a static binary that
# goes into an OCI image) and loadgen (the open-loop load generator, run on the host).
# Later runs reuse them while what they are built from is unchanged. Prints the directory.
#
#   tests/latency/build.sh                  # build if needed, print the bin directory
#   HEADROOM_LATENCY_DIR=/x build.sh        # put the binaries elsewhere
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${HEADROOM_LATENCY_DIR:-$repo/.cache/latency}"
stamp="$(cat "$here/go.mod" "$here/go.sum" "$here"/cmd/*/main.go "$0" | sha256sum | cut -c1-16)"
if [[ -x "$out/svc" && -x "$out/loadgen" && "$(cat "$out/stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "$out"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "Go is needed to build the latency benchmark's service: install Go 1.26+ (https://go.dev/dl/)" >&2
  exit 1
fi
mkdir -p "$out"
start=$(date +%s)
(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/" ./cmd/svc ./cmd/loadgen) >&2
echo "$stamp" > "$out/stamp"
echo "built the latency service and load generator in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
