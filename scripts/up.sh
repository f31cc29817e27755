#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a running Airlock: installs the
# Debian packages it needs, builds the binaries, and runs `airlock up` (which
# fetches and builds the pinned runsc and the base template on first start).
# Extra arguments go to `airlock up`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
exec ./bin/airlock up "$@"
