#!/usr/bin/env bash
# Builds bin/airlock and bin/airlock-agent (static, CGO_ENABLED=0).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/local/go/bin/go ] && export PATH=/usr/local/go/bin:$PATH
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -o bin/airlock-agent ./cmd/airlock-agent
go build -o bin/airlock ./cmd/airlock
