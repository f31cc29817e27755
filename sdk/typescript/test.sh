#!/usr/bin/env bash
# CI entry of the TypeScript SDK: install (npm ci, offline cache first),
# build (tsc into dist/), then run every test against a real Airlock: the
# one named by AIRLOCK_URL + AIRLOCK_API_KEY, or an `airlock up` started for
# the run (as root; AIRLOCK_BIN, default <repo>/bin/airlock, built by
# ./scripts/build.sh). Runnable from anywhere; non-zero exit on failure.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
export AIRLOCK_BIN=${AIRLOCK_BIN:-$repo/bin/airlock}
cd "$here"
npm ci --prefer-offline --no-audit --no-fund --loglevel=error
npm run --silent build
exec node test/run.mjs "$@"
