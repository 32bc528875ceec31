#!/usr/bin/env bash
# agents.sh - Claude Code and Codex against strata (agents.mjs), inside a network namespace with
# loopback only (unshare -n; -rn when not root), so the CLIs reach nothing but the server.
#   npm ci --prefix tests/agents && bash tests/agents/agents.sh
# Prints "N passed, N failed" last; a missing CLI or namespace is a failure, never a skip.
set -u
cd "$(dirname "$0")/../.."
for c in claude codex; do
    if [ ! -x "tests/agents/node_modules/.bin/$c" ]; then
        echo "FAIL: tests/agents/node_modules/.bin/$c is missing (npm ci --prefix tests/agents)"
        echo "0 passed, 1 failed"
        exit 1
    fi
done
ns=(unshare -n)
[ "$(id -u)" -ne 0 ] && ns=(unshare -rn)
if ! "${ns[@]}" true 2>/dev/null; then
    echo "FAIL: cannot make a network namespace with '${ns[*]}' (needs root or unprivileged user namespaces)"
    echo "0 passed, 1 failed"
    exit 1
fi
exec "${ns[@]}" sh -c 'ip link set lo up 2>/dev/null || ifconfig lo up 2>/dev/null || true; exec node tests/agents/agents.mjs'
