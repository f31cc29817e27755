#!/usr/bin/env bash
# The Python SDK's test entry (CI runs it): a cached venv with pinned test
# dependencies, the SDK installed from ./sdk/python as a wheel (so the
# packaging is tested), then pytest against a real Airlock (the tests start
# `airlock up` themselves unless AIRLOCK_URL and AIRLOCK_API_KEY are set).
#
# Usage: sdk/python/test.sh [pytest args…]   (from anywhere)
# Env:   AIRLOCK_TEST_CACHE (default /var/tmp/airlock-test-cache) holds the venv;
#        AIRLOCK_BIN (default <repo>/bin/airlock, built by ./scripts/build.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${AIRLOCK_TEST_CACHE:-/var/tmp/airlock-test-cache}
mkdir -p "$cache"

# Pinned versions for the tests (the package itself declares ranges).
pins=(pytest==9.2.0 pytest-asyncio==1.5.0 httpx==0.28.1 websockets==17.4 hatchling==1.33.0)

# The venv is keyed by the package's dependencies and the pins.
key=$(
  {
    python3 - "$here/pyproject.toml" <<'PY' 2>/dev/null || cat "$here/pyproject.toml"
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(sorted(p.get("dependencies", [])), p.get("requires-python", ""), p.get("optional-dependencies", {}))
PY
    printf '%s\n' "${pins[@]}"
  } | sha256sum | cut -c1-12
)
venv="$cache/venv-sdk-python-$key"

exec 9>"$cache/venv-sdk-python.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    rm -rf "$venv"
    echo "test.sh: python3 -m venv failed; installing python3-venv" >&2
    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation "$here"
  touch "$venv/.complete"
fi
# The SDK itself, every run (non-editable: built as a wheel from the tree).
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps "$here"
flock -u 9

cd "$repo"
export AIRLOCK_BIN=${AIRLOCK_BIN:-$repo/bin/airlock}
export AIRLOCK_TEST_CACHE="$cache"
exec "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider sdk/python/tests "$@"
