#!/usr/bin/env bash
# Installs the Redis server the gateway's shared-store tests run (Debian's redis-server;
# the tests start their own instance on a free port, so the system service is not needed).
# Once per machine; later runs find it in place.
set -euo pipefail

REDIS=${BASIN_REDIS_SERVER:-/usr/bin/redis-server}
if [ -x "$REDIS" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_redis: $REDIS is missing and this machine has no apt-get; install redis-server and" \
         "set BASIN_REDIS_SERVER to its path" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO=sudo
fi
echo "setup_redis: installing Debian's redis-server (once per machine)"
$SUDO apt-get update -q >/dev/null || true
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends redis-server >/dev/null
# Debian starts the packaged service; the tests need only the binary.
if command -v systemctl >/dev/null 2>&1; then
    $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
fi
