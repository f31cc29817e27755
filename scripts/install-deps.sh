#!/usr/bin/env bash
# Installs what Airlock needs on a Debian 12 host, from Debian's packages:
# debootstrap (builds the base template), PostgreSQL 15 (tests and
# multi-server deployments), iproute2, ca-certificates, and chromium (the
# web console's browser tests, web/test.sh; AIRLOCK_SKIP_CHROMIUM=1 skips it). Go 1.26+ must already
# be installed (Debian 12 ships an older Go); the script says so if not.
# Idempotent: packages already present are not reinstalled.
set -euo pipefail

need=()
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
[ -e /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
command -v curl >/dev/null 2>&1 || need+=(curl)
have_pg=no
for d in /usr/lib/postgresql/*/bin /usr/local/bin /usr/bin; do
  [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && have_pg=yes
done
[ "$have_pg" = yes ] || need+=(postgresql)
if [ "${AIRLOCK_SKIP_NODE:-}" != 1 ]; then
  command -v node >/dev/null 2>&1 || need+=(nodejs npm)
fi
if [ "${AIRLOCK_SKIP_CHROMIUM:-}" != 1 ]; then
  [ -x /usr/bin/chromium ] || need+=(chromium)
fi

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: need root to install: ${need[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq -o DPkg::Lock::Timeout=120 --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=/usr/local/go/bin:$PATH
fi
if ! command -v go >/dev/null 2>&1; then
  echo "install-deps: Go 1.26 or newer is required (Debian 12's golang package is too old); install it to /usr/local/go" >&2
  exit 1
fi
gov=$(go env GOVERSION | sed 's/^go//')
case "$gov" in
  1.2[6-9]*|1.[3-9]*) ;;
  *) echo "install-deps: Go $gov is too old; Airlock needs Go 1.26 or newer" >&2; exit 1 ;;
esac
echo "install-deps: ok (go $gov)"
