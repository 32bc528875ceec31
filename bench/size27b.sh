#!/usr/bin/env bash
# size27b.sh - issue 30's numbers on the GPU machine: a random checkpoint of the Qwen3.5-27B
# shape (make_random_model.py --tiled: every tensor cut from one seeded block per init, 54 GB at
# disk speed; speed depends only on shapes), `strata bench` on it, and the default context with
# the device memory it takes (a run without --ctx; nvidia-smi polled while it runs).
# Run after `scripts/gpu-run.sh build` (it uses build-gpu/strata). Output under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/strata-gpu-out}
mkdir -p "$OUT"
S=build-gpu/strata
export LD_LIBRARY_PATH="$(pwd)/.deps/prefix/lib:$(dirname "$(command -v nvcc)")/../lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
shm_kb=$(df -k --output=avail /dev/shm | tail -1)
M=/dev/shm/strata-models/27b
[ "$shm_kb" -gt $((60 * 1024 * 1024)) ] || M=/tmp/strata-models/27b
echo "== $(date -u +%FT%TZ) 27b checkpoint in $M ($(df -h --output=avail /dev/shm | tail -1) free in /dev/shm)"
if [ ! -f "$M/config.json" ]; then
    t0=$(date +%s)
    python3 tools/make_random_model.py --size 27b --out "$M" --tiled --shard-gb 4 | tail -1
    echo "made in $(($(date +%s) - t0)) s"
fi
echo "== strata bench ${BENCH_ARGS:-}"
$S bench --model "$M" ${BENCH_ARGS:-} 2>"$OUT/bench27.err" | tee "$OUT/bench27.md"
tail -2 "$OUT/bench27.err"
echo "== the default context (no --ctx) and the device memory it takes"
(while sleep 0.5; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done) >"$OUT/mem27.txt" &
poll=$!
$S run --model "$M" --backend cuda --prompt-ids "1 2 3 4" -n 4 2>&1 | grep -v 'loading weights' | tail -5
kill $poll
echo "peak device memory used: $(sort -n "$OUT/mem27.txt" | tail -1) MiB of $(nvidia-smi --query-gpu=memory.total --format=csv,noheader)"
$S info --model "$M" 2>&1 | grep -E 'parameters|weight bytes|KV cache|DeltaNet state|max positions'
[ -n "${KEEP:-}" ] || rm -rf "$M"
