#!/usr/bin/env bash
# The console's end-to-end tests (tests/e2e/test_console.py) drive a real browser: Playwright
# (a Python dependency of the workspace) with Debian's Chromium, since Playwright's own browser
# download needs a CDN this project does not count on. Install Debian's `chromium` when it is
# missing and this machine can (root with apt-get); otherwise say so and go on: only those tests
# need it, and they fail saying why.
set -uo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "chromium not found: installing Debian's chromium (the console's browser tests)"
    if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core; } >/dev/null 2>&1; then
        exit 0
    fi
    echo "warning: apt-get could not install chromium; the console's browser tests will fail" >&2
    exit 0
fi
echo "note: chromium is not installed; the console's browser tests need it (e.g. apt-get install chromium)" >&2
