#!/usr/bin/env bash
# CI entry of the web console (web/, served by the server at /ui): install
# (npm ci), check that the committed build in internal/ui/dist is exactly
# what this source builds to, then run the end-to-end tests in headless
# Chromium (Debian's chromium, driven by playwright-core) against a real
# Airlock: the one named by AIRLOCK_URL + AIRLOCK_API_KEY, or an `airlock
# up` started for the run (as root; AIRLOCK_BIN, default <repo>/bin/airlock,
# built by ./scripts/build.sh, which embeds internal/ui/dist). Screenshots
# go to docs/images/console-*.png. Without chromium the browser tests are
# skipped, loudly (AIRLOCK_REQUIRE_TESTS=1 makes that a failure).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
export AIRLOCK_BIN=${AIRLOCK_BIN:-$repo/bin/airlock}
cd "$here"
npm ci --prefer-offline --no-audit --no-fund --loglevel=error

# The build is reproducible: rebuild into a scratch directory and compare.
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
AIRLOCK_UI_OUT="$out" npm run --silent build >/dev/null
if ! diff -r "$out" "$repo/internal/ui/dist" >/dev/null; then
  diff -r "$out" "$repo/internal/ui/dist" | head -20 >&2 || true
  echo "web/test.sh: internal/ui/dist is not what web/ builds to: run 'npm run build' in web/ and commit internal/ui/dist" >&2
  exit 1
fi
echo "web console: committed build matches the source"
exec node test/run.mjs "$@"
