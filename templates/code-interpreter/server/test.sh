#!/usr/bin/env bash
# Runs test_server.py on the host: the template's Debian packages
# (host-deps.sh), then the real e2b-code-interpreter SDK and pytest, pinned,
# in a virtualenv kept in the test cache (only the first run on a machine
# installs them). Extra arguments go to pytest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/host-deps.sh"
sdk_version=2.11.5
pytest_version=9.2.0
want="e2b-code-interpreter==$sdk_version pytest==$pytest_version"
cache=${AIRLOCK_TEST_CACHE:-/var/tmp/airlock-test-cache}
venv="$cache/venv-code-interpreter"
if [ "$(cat "$venv/.version" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"; mkdir -p "$cache"
  # /usr/bin/python3: Debian's, the interpreter the server and kernels use.
  /usr/bin/python3 -m venv "$venv" 2>/dev/null || {
    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null && /usr/bin/python3 -m venv "$venv"; }
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q --disable-pip-version-check $want
  echo "$want" >"$venv/.version"
fi
cd "$here"
rc=0
"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider test_server.py "$@" || rc=$?
# 5: pytest collected nothing to run (the module skipped itself, saying why).
if [ "$rc" = 5 ]; then echo "code-interpreter server tests: all SKIPPED (see above)" >&2; rc=0; fi
exit "$rc"
