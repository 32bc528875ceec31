#!/usr/bin/env bash
# multiturn.sh - bench/multiturn.py against strata serve on the GPU machine (issue 25's targets):
# a random-weight checkpoint of SIZE's shape (replies teacher-forced to in-vocabulary text with
# --test-forced-output: the server still runs every decode step), then `strata bench --pp-at`
# for each agent turn's new tokens at their position (the prefill the cache cannot save); first
# tests/test_cache.c on the CUDA backend (the demo model, resumed against fresh prefills): the
# testcache step.
#
# The GPU machine lacks the Debian libraries strata links, so the server is built here and
# travels with the runtime .debs it needs (~17 MiB in .carry/server, git-ignored):
#   bash bench/multiturn.sh stage                                  # here
#   run(carry=[".carry/server"]): bash bench/multiturn.sh run      # on the GPU machine
#   run(carry=[".carry/server/debs", ".carry/tc"]): bash bench/multiturn.sh testcache
# (the tree and both binaries with the debs pass the 64 MiB a call carries)
# Output: $OUT/multiturn.md, $OUT/multiturn.json. Env: SIZE (4b), CTX (32768), MAXTOK (48).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
stage)
    NVCC_PATH=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    make -j"$(nproc)" BUILD=build-http-gpu NVCC="$NVCC_PATH" build-http-gpu/strata \
        build-http-gpu/tests/test_cache || exit 1
    mkdir -p .carry/server/debs .carry/tc
    cp build-http-gpu/strata .carry/server/
    cp build-http-gpu/tests/test_cache .carry/tc/
    strip .carry/server/strata .carry/tc/test_cache
    bash bench/server-debs.sh download || exit 1
    du -sh .carry/server
    ;;
run)
    OUT=${OUT:-/tmp/strata-gpu-out}
    mkdir -p "$OUT"
    source bench/server-debs.sh unpack /tmp/mt-root
    SIZE=${SIZE:-4b}
    M=/dev/shm/strata-models/$SIZE
    [ -f "$M/config.json" ] || python3 tools/compare_transformers.py random --size "$SIZE" --out "$M" 2>&1 | tail -1
    S=.carry/server/strata
    port=18080
    $S serve --model "$M" --tokenizer-dir demo --backend cuda --ctx "${CTX:-32768}" --port $port \
        --test-forced-output >"$OUT/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
    timeout 400 python3 bench/multiturn.py --url "http://127.0.0.1:$port" --forced \
        --max-tokens "${MAXTOK:-48}" --json "$OUT/multiturn.json" \
        --pairs "$OUT/pairs.txt" | tee "$OUT/multiturn.md"
    curl -s "http://127.0.0.1:$port/metrics" | grep -E '^strata_(cache|prompt_tokens)' | tee -a "$OUT/multiturn.md"
    kill $pid; wait $pid
    grep -E 'prefix cache|listening' "$OUT/serve.log"
    pairs=$(cat "$OUT/pairs.txt" 2>/dev/null)
    echo "== the new tokens of each agent turn, prefilled at their position (strata bench --pp-at)"
    [ -n "$pairs" ] && timeout 200 $S bench --model "$M" --backend cuda --ctx "${CTX:-32768}" --reps 3 \
        --pp-at "$pairs" 2>/dev/null | tee -a "$OUT/multiturn.md"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    ;;
testcache) # tests/test_cache.c on the CUDA backend: carry .carry/server/debs and .carry/tc
    OUT=${OUT:-/tmp/strata-gpu-out}
    mkdir -p "$OUT"
    source bench/server-debs.sh unpack /tmp/mt-root
    echo "== test_cache on the GPU (resumed vs fresh prefills of the demo model, CUDA backend)"
    STRATA_TEST_BACKEND=cuda timeout 120 .carry/tc/test_cache 2>&1 | tail -12 | tee "$OUT/test_cache.txt"
    ;;
*)
    echo "usage: bash bench/multiturn.sh stage|run|testcache" >&2
    exit 2
    ;;
esac
