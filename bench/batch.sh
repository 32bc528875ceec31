#!/usr/bin/env bash
# batch.sh - continuous batching's numbers on the GPU machine (issue 27 item 3), after
# `scripts/gpu-run.sh build` (it uses build-gpu/strata and the random models gpu-run makes):
# `strata bench --batch` (B sequences decoding together, model_step_rows) at each SIZES model,
# then tg128 alone for the single-sequence path (must not move). Output: $OUT/batch.md.
#   run(carry=[".deps/prefix.tar.xz"]): scripts/gpu-run.sh build,test && bash bench/batch.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/strata-gpu-out}
mkdir -p "$OUT"
S=build-gpu/strata
export LD_LIBRARY_PATH="$(pwd)/.deps/prefix/lib:$(dirname "$(command -v nvcc)")/../lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
MODELS=${STRATA_MODELS:-/dev/shm/strata-models}
for s in ${SIZES:-4b}; do
    [ -f "$MODELS/$s/config.json" ] || python3 tools/compare_transformers.py random --size "$s" --out "$MODELS/$s" 2>&1 | tail -1
    echo "== $s: batched decode ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null))" | tee -a "$OUT/batch.md"
    $S bench --model "$MODELS/$s" --ctx 8192 --batch "${BATCHES:-1,2,4,8,16,32,64}" 2>>"$OUT/batch.err" | tee -a "$OUT/batch.md"
    echo "== $s: tg128 (the single-sequence step)" | tee -a "$OUT/batch.md"
    $S bench --model "$MODELS/$s" --tg-only --reps 5 2>>"$OUT/batch.err" | tee -a "$OUT/batch.md"
done
