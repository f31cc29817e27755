#!/bin/sh
# Starts the code-interpreter server on :49999 as the default user `user`
# (dropping root if started as root), with its kernels in /home/user. The
# kernels inherit this environment (the template's ENV, whatever the sandbox
# starts this with).
set -eu
PATH=${PATH:-/usr/local/bin:/usr/bin:/bin}
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH=$PATH:/usr/sbin:/sbin ;; esac
export PATH
dir=$(dirname "$(readlink -f "$0")")
cd /home/user 2>/dev/null || cd /
if [ "$(id -u)" = 0 ]; then
  exec runuser -u user -- env HOME=/home/user USER=user LOGNAME=user \
    /usr/bin/python3 "$dir/server.py" --port 49999
fi
exec /usr/bin/python3 "$dir/server.py" --port 49999
