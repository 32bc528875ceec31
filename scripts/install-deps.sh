#!/usr/bin/env bash
# Installs the Debian packages strata needs to build and test (Debian 12). Idempotent: asks
# apt-get only for what is missing. Run as root (or with sudo available).
set -euo pipefail
pkgs=(build-essential pkg-config libjansson-dev libpcre2-dev libmicrohttpd-dev libicu-dev curl python3)
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

# the npm clients for tests/server: openai, ollama, playwright-core (pinned by package-lock.json)
srv="$(dirname "$0")/../tests/server/node_modules"
if [ ! -d "$srv/openai" ] || [ ! -d "$srv/ollama" ] || [ ! -d "$srv/playwright-core" ]; then
    npm ci --prefix "$(dirname "$0")/../tests/server" --no-audit --no-fund --loglevel=error
fi
