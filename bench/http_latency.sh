#!/usr/bin/env bash
# http_latency.sh - issue 5 item 8: engine vs streaming vs HTTP latency on a random-weight
# 4B-shape checkpoint, CUDA backend, on the GPU machine (bench/http_latency.c measures).
#
# The GPU machine has nvcc but not the Debian libraries strata links, and compiling there costs
# device time, so the binary is built here (nvcc 13 compiles sm_90 without a GPU) and travels
# with the runtime .debs it needs (~16 MiB in .carry/server, git-ignored):
#
#   bash bench/http_latency.sh stage            # here: build .carry/server/http_latency + debs
#   run(carry=[".carry/server"]): bash bench/http_latency.sh run     # on the GPU machine
#
# `run` makes the checkpoint with tools/compare_transformers.py random (~20 s), then measures
# (~20 s at REPS=3). Output: $OUT/http_latency.md. Env: SIZE (4b), N (350), PROMPT (54), REPS (3).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
stage)
    NVCC_PATH=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    CUDA_LIB=$(dirname "$NVCC_PATH")/../lib64
    make -j"$(nproc)" BUILD=build-http-gpu NVCC="$NVCC_PATH" build-http-gpu/libstrata.a || exit 1
    mkdir -p .carry/server/debs
    cc -std=c11 -D_GNU_SOURCE -O2 -fopenmp -Isrc -o .carry/server/http_latency bench/http_latency.c \
        build-http-gpu/libstrata.a -ljansson -lpcre2-8 -licuuc -licudata -lmicrohttpd -lunistring \
        -lm -lpthread -L"$CUDA_LIB" -lcublasLt -lcudart_static -ldl -lrt -lstdc++ || exit 1
    bash bench/server-debs.sh download || exit 1
    du -sh .carry/server
    ;;
run)
    OUT=${OUT:-/tmp/strata-gpu-out}
    mkdir -p "$OUT"
    source bench/server-debs.sh unpack /tmp/http-latency-root
    SIZE=${SIZE:-4b}
    M=/dev/shm/strata-http-$SIZE
    [ -f "$M/config.json" ] || python3 tools/compare_transformers.py random --size "$SIZE" --out "$M" 2>&1 | tail -1
    # random checkpoints carry no tokenizer: the demo's (Qwen3 vocabulary; ids past it decode to
    # nothing, so some tokens send no event, but every token is generated, timed and counted)
    timeout 120 .carry/server/http_latency --model "$M" --tokenizer-dir demo --backend cuda \
        --n "${N:-350}" --prompt-tokens "${PROMPT:-54}" --reps "${REPS:-3}" | tee "$OUT/http_latency.md"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    ;;
*)
    echo "usage: bash bench/http_latency.sh stage|run" >&2
    exit 2
    ;;
esac
