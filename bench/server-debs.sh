#!/usr/bin/env bash
# server-debs.sh - the Debian runtime libraries a strata binary built here needs on the GPU
# machine (which has none of them), for bench/http_latency.sh, bench/multiturn.sh and
# bench/kernels.sh:
#   bash bench/server-debs.sh download            # here: $DEBS/*.deb (~13 MiB)
#   source bench/server-debs.sh unpack ROOT       # there: unpacked into ROOT, LD_LIBRARY_PATH set
# DEBS: the folder of the .debs (default .carry/server/debs).
DEBS=${DEBS:-.carry/server/debs}
case "${1:-}" in
download)
    mkdir -p "$DEBS"
    (cd "$DEBS" && rm -f ./*.deb &&
        apt-get download libffi8 libjansson4 libtasn1-6 libmicrohttpd12 libidn2-0 libpcre2-8-0 \
            libnettle8 libhogweed6 libp11-kit0 libunistring2 libgmp10 libgnutls30 libicu72) ;;
unpack)
    mkdir -p "$2"
    for f in "$DEBS"/*.deb; do dpkg -x "$f" "$2"; done
    export LD_LIBRARY_PATH=$2/usr/lib/x86_64-linux-gnu:$(dirname "$(command -v nvcc)")/../lib64 ;;
*)
    echo "usage: bash bench/server-debs.sh download | source bench/server-debs.sh unpack ROOT" >&2
    false ;;
esac
