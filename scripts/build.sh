#!/usr/bin/env bash
# Builds bin/airlock and bin/airlock-agent (static, CGO_ENABLED=0).
# bin/airlock embeds the web console as committed in internal/ui/dist: no
# npm here. After changing web/, run `npm run build` in web/ first (and
# commit internal/ui/dist); web/test.sh fails while the two differ.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/local/go/bin/go ] && export PATH=/usr/local/go/bin:$PATH
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -o bin/airlock-agent ./cmd/airlock-agent
go build -o bin/airlock ./cmd/airlock
