#!/usr/bin/env bash
# Builds SeaweedFS's `weed` (Apache-2.0; the S3-compatible server the blob
# store tests run against) from the Go module proxy, once per machine, into
# the test cache, and prints the binary's path. Its module has a `replace`
# directive, so it cannot be `go install`ed: it is built inside a copy of its
# module source. A cold build takes about 7 minutes on 2 cores.
set -euo pipefail
version=v0.0.0-20261109003541-7506e5f91cd6
cache=${AIRLOCK_TEST_CACHE:-/var/tmp/airlock-test-cache}
out="$cache/seaweedfs-$version/weed"
if [ -x "$out" ]; then echo "$out"; exit 0; fi
[ -x /usr/local/go/bin/go ] && export PATH=/usr/local/go/bin:$PATH
src=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "github.com/seaweedfs/seaweedfs@$version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "seaweedfs: module download failed" >&2; exit 1; }
work=$(mktemp -d /tmp/airlock-seaweedfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$src/." "$work/"
chmod -R u+w "$work"
echo "seaweedfs: building weed $version (first run on this machine only)" >&2
mkdir -p "$(dirname "$out")"
(cd "$work" && go build -ldflags='-s -w' -o "$out.tmp" ./weed)
mv "$out.tmp" "$out"
echo "$out"
