#!/usr/bin/env bash
# `code_exec` isolates model-written code with bubblewrap (Debian package `bubblewrap`). Install it
# when it is missing and this machine can (root with apt-get); otherwise say so and go on: the
# sandbox then reports `code_exec: INACTIVE(bubblewrap not installed)` and never offers the tool.
set -uo pipefail
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "bubblewrap not found: installing the Debian package (code_exec's isolation)"
    if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } >/dev/null 2>&1; then
        exit 0
    fi
    echo "warning: apt-get could not install bubblewrap; code_exec will stay INACTIVE" >&2
    exit 0
fi
echo "note: bubblewrap (bwrap) is not installed; code_exec stays INACTIVE until it is (e.g. apt-get install bubblewrap)" >&2
