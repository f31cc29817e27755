#!/usr/bin/env bash
# Installs on this (Debian 12) host the Debian packages the code-interpreter
# template installs (../packages.txt), so test_server.py can run the server
# here. Idempotent and quiet: does nothing when all are installed, and runs
# `apt-get update` only when one is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mapfile -t pkgs < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/../packages.txt")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "code-interpreter host deps: installing ${missing[*]}" >&2
sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
