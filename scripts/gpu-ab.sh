#!/usr/bin/env bash
# gpu-ab.sh - decode A/B on the GPU machine in one device call. Machines differ from call to call
# by a few percent, so every comparison is made inside one call: this tree is built
# (gpu-run.sh build), random checkpoints made, and tg128 (`strata bench --tg-only`, median of
# REPS) printed for every size x variant; a variant is a line of VAR=VALUE words ("-": none).
# With BASE_TAR (a `git archive` of an older commit made here, carried with the call, e.g. under
# .carry/), that tree is built too and measured first as "base" (its bench predates --tg-only,
# so the full --short bench runs and its tg128 line is kept).
#
#   git archive HEAD~1 src Makefile -o .carry/base.tar
#   SIZES="4b 9b" VARIANTS=$'-\nSTRATA_PDL=0' BASE_TAR=.carry/base.tar scripts/gpu-ab.sh
#   (device call with carry [".deps/prefix.tar.xz", ".carry/base.tar"])
# STRATA_TRACE=1 as a variant prints the GEMV timeline of one decode step (whole output, with the
# DeltaNet / attention phase table, appended to $OUT/trace.txt). AB_ARGS replaces the variants'
# `--tg-only`, e.g. AB_ARGS="--at 32768" for decode at a 32k context alone (the base is then run
# with AB_ARGS too, so it must know them).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-/tmp/strata-gpu-out}
SIZES=${SIZES:-4b}
REPS=${REPS:-3}
VARIANTS=${VARIANTS:--}
mkdir -p "$OUT"
SIZES="$SIZES" scripts/gpu-run.sh build | tail -3
export LD_LIBRARY_PATH=$ROOT/.deps/prefix/lib:$(dirname "$(command -v nvcc)")/../lib64
B=build-gpu/strata
M=${STRATA_MODELS:-/dev/shm/strata-models}
[ -d /dev/shm ] || M=/tmp/strata-models
mkdir -p "$M"
for s in $SIZES; do
    [ -f "$M/$s/config.json" ] || python3 tools/compare_transformers.py random --size "$s" --out "$M/$s" 2>&1 | tail -1
done
BASE=
if [ -n "${BASE_TAR:-}" ] && [ -f "$BASE_TAR" ]; then
    sum=$(md5sum <"$BASE_TAR")
    if [ -x /tmp/strata-base/build/strata ] && [ "$(cat /tmp/strata-base.md5 2>/dev/null)" = "$sum" ]; then
        BASE=/tmp/strata-base/build/strata # built by an earlier gpu-ab.sh of this call
    elif rm -rf /tmp/strata-base && mkdir -p /tmp/strata-base && tar xf "$BASE_TAR" -C /tmp/strata-base &&
        (cd /tmp/strata-base && CPATH=$ROOT/.deps/prefix/include LIBRARY_PATH=$ROOT/.deps/prefix/lib \
        make -j"$(nproc)" BUILD=build NVCC="$(command -v nvcc)" all >/tmp/strata-base.log 2>&1); then
        echo "$sum" >/tmp/strata-base.md5
        BASE=/tmp/strata-base/build/strata
    else
        echo "base build failed:"; tail -5 /tmp/strata-base.log
    fi
fi
for s in $SIZES; do
    if [ -n "$BASE" ] && [ -n "${AB_ARGS:-}" ]; then
        # shellcheck disable=SC2086
        echo "$s base :: $(timeout 300 $BASE bench --model "$M/$s" $AB_ARGS --reps "$REPS" 2>/dev/null | tail -1)"
    elif [ -n "$BASE" ]; then
        echo "$s base :: $(timeout 120 $BASE bench --model "$M/$s" --short --reps "$REPS" 2>/dev/null | grep '^| tg128')"
    fi
    while IFS= read -r v; do
        [ -z "$v" ] && continue
        [ "$v" = - ] && v=""
        # shellcheck disable=SC2086
        env $v timeout 300 $B bench --model "$M/$s" ${AB_ARGS:---tg-only} --reps "$REPS" >"$OUT/ab.tmp" 2>"$OUT/ab.err" ||
            grep -v "loading weights" "$OUT/ab.err" | tail -2
        grep -E "^GEMVs" "$OUT/ab.tmp"
        case "$v" in *STRATA_TRACE=1*) { echo "== $s $v"; cat "$OUT/ab.tmp"; } >>"$OUT/trace.txt" ;; esac
        echo "$s ${v:-(as built)} :: $(tail -1 "$OUT/ab.tmp")"
    done <<<"$VARIANTS"
done 2>&1 | tee "$OUT/ab.txt"
rm -f "$OUT/ab.tmp" "$OUT/ab.err"
