#!/usr/bin/env bash
# Installs the Debian packages strata needs to build and test (Debian 12). Idempotent: asks
# apt-get only for what is missing. Run as root (or with sudo available).
set -euo pipefail
pkgs=(build-essential pkg-config libjansson-dev libpcre2-dev libmicrohttpd-dev libicu-dev curl python3)
# tests/agents runs the agent CLIs in a network namespace: unshare (util-linux) and ip
pkgs+=(iproute2)
# make fuzz: clang with libFuzzer and the sanitizer runtimes (Debian 12: clang-14; the runtimes
# are only recommended by clang, so named)
pkgs+=(clang libclang-rt-14-dev)
# the server tests drive strata with the official openai npm client: Node.js + npm from Debian
# unless a node is already installed
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
# the chat page's test (tests/server/page.mjs) drives Debian's headless Chromium
pkgs+=(chromium)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# the npm clients for tests/server (openai, @anthropic-ai/sdk, ollama, playwright-core, ...: pinned by its
# package-lock.json), again when one that package.json names is missing
srv="$(dirname "$0")/../tests/server"
if ! (cd "$srv" && node -e 'const fs = require("fs"); for (const p of Object.keys(require("./package.json").dependencies))
        if (!fs.existsSync("node_modules/" + p + "/package.json")) process.exit(1)'); then
    npm ci --prefix "$srv" --no-audit --no-fund --loglevel=error
fi
# the agent CLIs for tests/agents (Claude Code, Codex: native binaries from npm, ~800 MB)
agents="$(dirname "$0")/../tests/agents"
if [ ! -x "$agents/node_modules/.bin/claude" ] || [ ! -x "$agents/node_modules/.bin/codex" ]; then
    npm ci --prefix "$agents" --no-audit --no-fund --loglevel=error
fi
