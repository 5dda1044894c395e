#!/usr/bin/env bash
# Installs the headless browser the report tests open pages in: Debian's Chromium
# (package chromium), driven through Playwright's Python package (a dev extra, which
# never downloads a browser of its own). Once per machine; later runs find it in place.
set -euo pipefail

CHROMIUM=${BASIN_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_browser: $CHROMIUM is missing and this machine has no apt-get; install Chromium and" \
         "set BASIN_CHROMIUM to its path" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO=sudo
fi
echo "setup_browser: installing Debian's chromium (once per machine)"
$SUDO apt-get update -q >/dev/null || true
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null
