#!/usr/bin/env bash
# gpu-profile.sh - Nsight Compute on chosen decode kernels, on the GPU machine in one device call:
# this tree is built (gpu-run.sh build, with -lineinfo), a random checkpoint made, and
# `strata bench --tg-only` run under ncu for each kernel name regex in KERNELS; per kernel, the
# details page (warp states, scheduler, memory, launch, occupancy, source counters) goes to
# $OUT/details-<n>.txt and the per-instruction source page (SASS with the CUDA lines, stall
# samples and reasons) to $OUT/sass-<n>.csv.gz, which tools/ncu_sass.py reads here. Under ncu
# every kernel runs alone (replayed; clocks and caches left alone), so what it shows is a
# kernel's own latency chain, not the overlap of programmatic dependent launch: use it to ask
# why a phase is slow (run 70 found the DeltaNet step's four serial L2 round trips this way),
# and STRATA_TRACE=1 (gpu-ab.sh) for where the step's time goes.
#
#   SIZES=4b KERNELS="gdn_step_kernel attn_short_kernel" scripts/gpu-profile.sh
#   (device call with carry [".deps/prefix.tar.xz"]; ~80 s for two kernels)
#   python3 tools/ncu_sass.py <files_at>/sass-1.csv.gz --all
#
# SKIP: decode launches of each kernel to skip first (default 200: past the warm-up); COUNT:
# launches profiled (default 1). NCU_ARGS replaces the sections.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
OUT=${OUT:-/tmp/strata-gpu-out}
SIZES=${SIZES:-4b}
KERNELS=${KERNELS:-gdn_step_kernel attn_short_kernel}
mkdir -p "$OUT"
NVEXTRA=-lineinfo SIZES="$SIZES" scripts/gpu-run.sh build | tail -3
LD_LIBRARY_PATH=$ROOT/.deps/prefix/lib:$(dirname "$(command -v nvcc)")/../lib64
export LD_LIBRARY_PATH
NCU=$(command -v ncu || find /opt/nvidia /usr/local -maxdepth 4 -name ncu -type f 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
M=${STRATA_MODELS:-/dev/shm/strata-models}
[ -d /dev/shm ] || M=/tmp/strata-models
mkdir -p "$M"
SECTIONS=${NCU_ARGS:---section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats --section Occupancy}
n=0
for s in $SIZES; do
    [ -f "$M/$s/config.json" ] || python3 tools/compare_transformers.py random --size "$s" --out "$M/$s" 2>&1 | tail -1
    for k in $KERNELS; do
        n=$((n + 1))
        rep=/tmp/strata-ncu-$n
        echo "== $s $k -> details-$n.txt, sass-$n.csv.gz"
        # shellcheck disable=SC2086
        timeout 400 "$NCU" --clock-control none --cache-control none --graph-profiling node \
            -k "regex:$k" --launch-skip "${SKIP:-200}" --launch-count "${COUNT:-1}" $SECTIONS \
            --import-source yes -f -o "$rep" build-gpu/strata bench --model "$M/$s" --tg-only --reps 1 \
            >"/tmp/strata-ncu-$n.log" 2>&1
        echo "exit $?"
        "$NCU" -i "$rep.ncu-rep" --page details >"$OUT/details-$n.txt" 2>&1
        "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass >"$OUT/sass-$n.csv" 2>&1
        gzip -9f "$OUT/sass-$n.csv"
        grep -E "Duration|Warp Cycles Per Issued|Registers Per Thread|Achieved Occupancy|Local Memory Spilling" \
            "$OUT/details-$n.txt" | head -8
    done
done
