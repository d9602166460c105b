#!/usr/bin/env bash
# The end-to-end suite drives some doors with the clients their users run, and some of those are
# JavaScript: the official AG-UI client (`@ag-ui/client`, tests/e2e/agui_client). Install Node.js
# when it is missing and this machine can (root with apt-get, Debian's `nodejs` and `npm`), then
# the clients' locked packages (`npm ci`, skipped when node_modules was installed from this lock).
# Without Node.js the tests that need it fail and say why; nothing else depends on it.
set -uo pipefail
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "Node.js not found: installing Debian's nodejs and npm (the end-to-end tests' JavaScript clients)"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; } >/dev/null 2>&1 \
            || echo "warning: apt-get could not install Node.js; the AG-UI client tests will fail" >&2
    else
        echo "note: Node.js is not installed; the AG-UI client tests need it (e.g. apt-get install nodejs npm)" >&2
        exit 0
    fi
fi
for client in tests/e2e/agui_client; do
    stamp="$client/node_modules/.installed-lock.sha256"
    wanted="$(sha256sum "$client/package-lock.json" | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
        continue  # installed from this very lock
    fi
    if npm ci --prefix "$client" --no-audit --no-fund --loglevel=error >/dev/null; then
        echo "$wanted" > "$stamp"
    else
        echo "warning: npm ci failed in $client" >&2
    fi
done
