#!/usr/bin/env bash
# gpu-profile.sh - Nsight Compute on chosen decode kernels, on the GPU machine in one device call:
# this tree is built (gpu-run.sh build), a random checkpoint made, and `strata bench --tg-only`
# run under ncu for each kernel name regex in KERNELS; the warp-state (stall reasons), scheduler,
# memory and source-counter sections go to $OUT/ncu-<n>.txt (gzipped). Under ncu every kernel
# runs alone (replayed, clocks left alone), so what it shows is a kernel's own latency chain, not
# the overlap of programmatic dependent launch: use it to ask why a phase is slow, and
# STRATA_TRACE=1 (gpu-ab.sh) for where the step's time goes.
#
#   SIZES=4b KERNELS="gdn_step_kernel attn_short_kernel" scripts/gpu-profile.sh
#   (device call with carry [".deps/prefix.tar.xz"])
#
# SKIP: decode launches of each kernel to skip first (default 200: past the warm-up); COUNT:
# launches profiled (default 3). NCU_ARGS replaces the sections.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
OUT=${OUT:-/tmp/strata-gpu-out}
SIZES=${SIZES:-4b}
KERNELS=${KERNELS:-gdn_step_kernel attn_short_kernel}
mkdir -p "$OUT"
SIZES="$SIZES" scripts/gpu-run.sh build | tail -3
LD_LIBRARY_PATH=$ROOT/.deps/prefix/lib:$(dirname "$(command -v nvcc)")/../lib64
export LD_LIBRARY_PATH
NCU=$(command -v ncu || find /opt/nvidia/nsight-compute -maxdepth 2 -name ncu -type f 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
M=${STRATA_MODELS:-/dev/shm/strata-models}
[ -d /dev/shm ] || M=/tmp/strata-models
mkdir -p "$M"
SECTIONS=${NCU_ARGS:---section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats --section Occupancy}
n=0
for s in $SIZES; do
    [ -f "$M/$s/config.json" ] || python3 tools/compare_transformers.py random --size "$s" --out "$M/$s" 2>&1 | tail -1
    for k in $KERNELS; do
        n=$((n + 1))
        f="$OUT/ncu-$n.txt"
        echo "== $s $k -> $(basename "$f").gz"
        # shellcheck disable=SC2086
        timeout 500 "$NCU" --clock-control none --graph-profiling node -k "regex:$k" \
            --launch-skip "${SKIP:-200}" --launch-count "${COUNT:-3}" $SECTIONS \
            build-gpu/strata bench --model "$M/$s" --tg-only --reps 1 >"$f" 2>&1
        echo "exit $?"
        grep -E "Stall|stall|Warp Cycles Per Issued|Duration|Registers Per Thread|Achieved Occupancy" "$f" | head -20
        gzip -9f "$f"
    done
done
