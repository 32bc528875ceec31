#!/usr/bin/env bash
# deps-prefix.sh - here (Debian 12): makes .deps/prefix.tar.xz, what gpu-run.sh builds with on the
# GPU machine, which lacks the Debian libraries strata links: the headers of jansson, pcre2,
# libmicrohttpd and ICU, and the shared libraries of jansson and pcre2 (ICU and libmicrohttpd
# are linked as stubs there: see gpu-run.sh). ~1 MB; carry it with every device call that builds.
#
#   bash scripts/deps-prefix.sh     then run(carry=[".deps/prefix.tar.xz", ...])
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -qq libjansson4 libjansson-dev libpcre2-8-0 libpcre2-dev \
    libmicrohttpd-dev libicu-dev >/dev/null)
for d in "$tmp"/*.deb; do dpkg -x "$d" "$tmp/root"; done
rm -rf .deps/prefix
mkdir -p .deps/prefix/include .deps/prefix/lib
cp -a "$tmp/root/usr/include/." .deps/prefix/include/
cp -a "$tmp"/root/usr/lib/x86_64-linux-gnu/libjansson.so* "$tmp"/root/usr/lib/x86_64-linux-gnu/libpcre2-8.so* \
    .deps/prefix/lib/
tar cJf .deps/prefix.tar.xz -C .deps prefix
rm -rf .deps/prefix
echo ".deps/prefix.tar.xz: $(du -h .deps/prefix.tar.xz | cut -f1)"
