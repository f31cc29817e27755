#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a passing test suite: installs
# the Debian packages, starts a private PostgreSQL server for the store tests
# and a private S3-compatible server (SeaweedFS) for the blob store tests,
# builds, and runs every Go test (real runsc, real PostgreSQL, real SQLite).
# Extra arguments go to `go test` (e.g. -run TestName).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
[ -x /usr/local/go/bin/go ] && export PATH=/usr/local/go/bin:$PATH
# SeaweedFS (the S3 server of the blob store tests) builds in the background,
# beside the downloads below; only the first run on a machine builds it.
weedlog=$(mktemp /tmp/airlock-seaweedfs-log.XXXXXX)
setsid ./scripts/seaweedfs.sh >"$weedlog.path" 2>"$weedlog" & # its own group: an early exit stops its go build too
weedpid=$!
trap 'kill -- -"$weedpid" 2>/dev/null || true' EXIT # replaced by cleanup below
./scripts/build.sh
# The E2B SDK suite's npm packages (pinned by test/e2b/package-lock.json).
if command -v npm >/dev/null 2>&1; then npm ci --prefix test/e2b --no-audit --no-fund; fi
# Schemathesis (the property-based API fuzzer of internal/e2e TestAPIFuzz), pinned, in a
# virtualenv kept in the test cache so only the first run on a machine installs it.
cache=${AIRLOCK_TEST_CACHE:-/var/tmp/airlock-test-cache}
schemathesis_version=4.32.5
venv="$cache/venv-schemathesis"
if [ "$(cat "$venv/.version" 2>/dev/null)" != "$schemathesis_version" ]; then
  rm -rf "$venv"; mkdir -p "$cache"
  python3 -m venv "$venv" 2>/dev/null || {
    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null && python3 -m venv "$venv"; }
  "$venv/bin/pip" install -q --disable-pip-version-check "schemathesis==$schemathesis_version"
  echo "$schemathesis_version" >"$venv/.version"
fi
export AIRLOCK_SCHEMATHESIS="$venv/bin/st"

# A private PostgreSQL for this run, stopped on exit.
pgbin=
for d in /usr/lib/postgresql/*/bin /usr/local/bin /usr/bin; do
  if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then pgbin=$d; break; fi
done
[ -n "$pgbin" ] || { echo "test: no PostgreSQL binaries found" >&2; exit 1; }
pgdir=$(mktemp -d /tmp/airlock-pg.XXXXXX)
chmod 755 "$pgdir"
pguser=postgres
id "$pguser" >/dev/null 2>&1 || useradd --system --no-create-home "$pguser"
chown "$pguser" "$pgdir"
port=$(( 25000 + RANDOM % 10000 ))
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u "$pguser" -- "$@"; else "$@"; fi; }
as_pg "$pgbin/initdb" -D "$pgdir/data" -U airlock --auth=trust >/dev/null
as_pg "$pgbin/pg_ctl" -D "$pgdir/data" -l "$pgdir/log" -w \
  -o "-p $port -k $pgdir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null
s3pid= s3socks=
cleanup() {
  kill -- -"$weedpid" 2>/dev/null || true
  as_pg "$pgbin/pg_ctl" -D "$pgdir/data" -m fast stop >/dev/null 2>&1 || true
  if [ -n "$s3pid" ]; then kill "$s3pid" 2>/dev/null || true; wait "$s3pid" 2>/dev/null || true; fi
  rm -f $s3socks # the Unix sockets SeaweedFS opens beside its gRPC ports
  rm -rf "$pgdir"
}
trap cleanup EXIT
export AIRLOCK_TEST_POSTGRES_URL="postgres://airlock@127.0.0.1:$port/postgres?sslmode=disable"
echo "test: PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port"

# A private S3-compatible server (SeaweedFS, built once per machine by
# scripts/seaweedfs.sh) for the blob store tests, with one access key; its data
# lives beside PostgreSQL's and goes with it.
if ! wait "$weedpid"; then cat "$weedlog" >&2; echo "test: building SeaweedFS failed" >&2; exit 1; fi
weed=$(cat "$weedlog.path"); rm -f "$weedlog" "$weedlog.path"
mkdir -p "$pgdir/s3"
cat >"$pgdir/s3/identities.json" <<'JSON'
{"identities":[{"name":"airlock-test","credentials":[{"accessKey":"airlocktest","secretKey":"airlocktestsecret"}],"actions":["Admin","Read","Write","List","Tagging"]}]}
JSON
# Every port explicit (gRPC ones too; the Iceberg and Lance listeners off),
# so nothing collides with a fixed default; tried on fresh ports up to 3 times.
start_s3() {
  # PostgreSQL is on 25000-34999; these stay clear of it and of each other.
  s3port=$(( 36000 + RANDOM % 4000 )); sw=$(( 50000 + RANDOM % 4000 ))
  rm -rf "$pgdir/s3/data"; mkdir -p "$pgdir/s3/data"
  "$weed" server -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$pgdir/s3/data" -master.volumeSizeLimitMB=256 \
    -master.port=$sw -master.port.grpc=$(( sw + 5000 )) -volume.port=$(( sw + 1 )) -volume.port.grpc=$(( sw + 5001 )) \
    -filer.port=$(( sw + 2 )) -filer.port.grpc=$(( sw + 5002 )) \
    -s3 -s3.port=$s3port -s3.port.grpc=$(( s3port + 4000 )) -s3.port.iceberg=0 -s3.port.lance=0 \
    -s3.config="$pgdir/s3/identities.json" >"$pgdir/s3/log" 2>&1 &
  s3pid=$!
  for p in $sw $(( sw + 1 )) $(( sw + 2 )) $s3port $(( sw + 5000 )) $(( sw + 5001 )) $(( sw + 5002 )) $(( s3port + 4000 )); do
    for k in master volume filer s3; do s3socks="$s3socks /tmp/seaweedfs-$k-$p.sock /tmp/seaweedfs-$k-grpc-$p.sock"; done
  done
  for _ in $(seq 1 60); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$s3port/" || true)" = 403 ]; then return 0; fi
    kill -0 "$s3pid" 2>/dev/null || break
    sleep 1
  done
  echo "test: SeaweedFS's S3 gateway did not come up on 127.0.0.1:$s3port; its log ends:" >&2
  tail -20 "$pgdir/s3/log" >&2
  kill "$s3pid" 2>/dev/null || true; wait "$s3pid" 2>/dev/null || true; s3pid=
  return 1
}
start_s3 || start_s3 || start_s3 || { echo "test: no S3 server" >&2; exit 1; }
export AWS_ACCESS_KEY_ID=airlocktest AWS_SECRET_ACCESS_KEY=airlocktestsecret
export AIRLOCK_TEST_S3_URL="s3://airlock-test?endpoint=http://127.0.0.1:$s3port&region=us-east-1"
echo "test: SeaweedFS $("$weed" version 2>/dev/null | awk 'NR == 1 {print $3}') S3 on 127.0.0.1:$s3port"

# Root's login shell on some machines runs `pyenv rehash`, which waits up to a minute on a
# lock file; a login shell killed mid-rehash leaves the lock behind and every later `bash -l`
# stalls. Host-side agent tests start `bash -l` (as the E2B SDK does), so clear a stale lock.
lock="${HOME:-/root}/.pyenv/shims/.pyenv-shim"
if [ -e "$lock" ] && ! pgrep -f pyenv-rehash >/dev/null; then rm -f "$lock"; fi

go vet ./...
# One package at a time (-p 1): the gVisor, QEMU (TCG) and end-to-end
# packages each load the machine's cores; run side by side on 2 cores they
# starve each other into timeouts, and one after another they take ~7 min.
go test -p 1 -count=1 -timeout 60m "$@" ./...
# The code interpreter's server (templates/code-interpreter), on the host with
# the template's Debian packages and the real e2b-code-interpreter SDK, and
# every fuzz target for a bounded time (scripts/fuzz.sh), on full runs only.
# The SDKs' own suites (sdk/*/test.sh: each installs its pinned packages and
# starts an `airlock up` of bin/airlock over the test cache's runsc) run the
# shared conformance scenario and their own tests, on full runs; so does the
# web console's (web/test.sh: its committed build is what web/ builds to,
# then its browser tests in headless Chromium, screenshots in docs/images).
if [ $# -eq 0 ]; then
  export AIRLOCK_TEST_CACHE=$cache
  ./sdk/typescript/test.sh
  ./web/test.sh
  ./sdk/python/test.sh
  ./templates/code-interpreter/server/test.sh
  ./scripts/fuzz.sh
fi
