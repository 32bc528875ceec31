#!/usr/bin/env bash
# kernels.sh - CUDA kernel work in one short device call, with the binaries built here (nothing
# is built on the GPU machine, which saves its build's minutes of device time): test_cuda by size,
# `strata bench` by size, A/B of environment switches through `strata bench --pp-at`, Nsight
# Compute on the kernels of a 4,096-token 4B prefill, the transformers comparison over 2,048
# tokens. The twenty-second session's runs 179-183 were made this way (bench/RESULTS.md).
#
#   bash bench/kernels.sh stage                       # here: .carry/kernels (~16 MiB, git-ignored)
#   run(carry=[".carry/kernels"]): TESTS="4B demo" BENCH="4b 9b" bash bench/kernels.sh run
#
# Env of run (every step optional; each writes its files under $OUT and prints a digest):
#   TESTS       test_cuda sizes, in order (4B demo 0.8B 9B 27B); default "4B demo 0.8B 27B", "-": none;
#               SIZE@VAR=VALUE[:VAR2=VALUE2] runs that size under that environment
#   TEST_ENV    VAR=VALUE words test_cuda runs under (an experiment's switch)
#   TEST_TIMEOUT  seconds a test_cuda size may take (default 300)
#   BENCH       random checkpoints to `strata bench` (0.8b 2b 4b 9b); default 4b, "-": none
#   BENCH_ARGS  default "--reps 3" (the full bench: pp512, 4k / 16k / 32k prefill, per-op tables)
#   BENCH_GREP  an egrep of the bench lines printed (default: the summary and prefill lines)
#   AB          variants compared by `strata bench --pp-at $PPAT` on 4b, in order, ABR rounds:
#               VAR=VALUE[:VAR2=VALUE2] words, "-" for none; PPAT default 0:4096,0:16384
#   NCU         a kernel-name regex profiled by ncu (NCU_COUNT launches, default 4) in an NCU_T-token
#               (default 4,096) 4B prefill, or in `strata $NCU_CMD` (e.g. "bench --model /dev/shm/strata-models/4b
#               --ctx 8192 --batch 4")
#   COMPARE     sizes for compare_transformers.py compare --long 2048 (0.8b 4b); SIZE@VAR=VALUE[:..]
#               runs strata under that environment; COMPARE_TIMEOUT seconds a size (default 400)
#   AHEAD       random checkpoints (e.g. 4b) on which `strata_logits ... ahead 40` checks greedy batched
#               decode run ahead (choices fed on the device) against fed by the host
#   BATCH       variants of `strata bench --model 4b --ctx 8192 --batch $BATCHES` (default
#               1,2,3,4,8,12,16), in order: VAR=VALUE[:VAR2=VALUE2] words, "-" for none, "base"
#               for the binary in .carry/base (another tree's `stage`, copied there)
#   CONC        variants (as BATCH's) of bench/multiturn.sh concurrency (1-64 streaming clients)
#   TGAB        rounds of `strata bench --tg-only` on 4b, this tree's binary then .carry/base's
#               (an A/B of single-sequence decode that a machine's drift cannot bias)
#   KTRACE      strata commands, "|" between them ($M the checkpoints' folder, e.g. "bench --model
#               \$M/4b --ctx 8192 --pp-at 0:512 --reps 3"), each run with bench/kernel_trace.c
#               injected: every kernel's start and end as it ran, to $OUT/ktrace-I.csv.xz, and
#               bench/ktrace.py's digest of its longest phase (KTRACE_SHOW: another --show); a
#               command's leading VAR=VALUE words are its environment (e.g. "STRATA_EXP_BF=1 bench ...")
#   NCU_SRC     a regex of demangled kernel names (e.g. "gdn_step_kernel.*bool\)1>"): per-SASS-
#               instruction stall samples of one launch (after NCU_SKIP, default 5) in `strata
#               $NCU_CMD`, to $OUT/sass.csv (columns as Nsight Compute's source page)
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=.carry/kernels
export DEBS=$DIR/debs
case "${1:-}" in
stage)
    NVCC_PATH=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    make -j"$(nproc)" BUILD=build-http-gpu NVCC="$NVCC_PATH" build-http-gpu/strata \
        build-http-gpu/tests/test_cuda || exit 1
    cc -std=c11 -D_GNU_SOURCE -O2 -fopenmp -Isrc -o build-http-gpu/strata_logits tools/strata_logits.c \
        build-http-gpu/libstrata.a -ljansson -lpcre2-8 -licuuc -licudata -lmicrohttpd -lm -lpthread \
        -L"$(dirname "$NVCC_PATH")/../lib64" -lcublasLt -lcudart_static -ldl -lrt -lstdc++ || exit 1
    mkdir -p "$DIR"
    rm -f "$DIR"/*.xz "$DIR"/strata "$DIR"/test_cuda "$DIR"/strata_logits "$DIR"/*.so* # (what a run here unpacked)
    CUDA_LIB=$(dirname "$NVCC_PATH")/../lib
    cc -std=c11 -O2 -shared -fPIC -I"$(dirname "$NVCC_PATH")/../include" -Wl,-rpath,'$ORIGIN' \
        -o build-http-gpu/libkernel_trace.so bench/kernel_trace.c -L"$CUDA_LIB" -lcupti -lstdc++ || exit 1
    cp -L "$CUDA_LIB/libcupti.so.13" build-http-gpu/libcupti.so.13 || exit 1
    for b in build-http-gpu/strata build-http-gpu/tests/test_cuda build-http-gpu/strata_logits \
        build-http-gpu/libkernel_trace.so build-http-gpu/libcupti.so.13; do
        strip -o "$DIR/$(basename "$b")" "$b" && xz -T0 -9 -f "$DIR/$(basename "$b")" || exit 1
    done
    [ -n "$(ls "$DEBS"/*.deb 2>/dev/null)" ] || bash bench/server-debs.sh download || exit 1
    du -sh "$DIR"
    exit 0
    ;;
run) ;;
*)
    echo "usage: bash bench/kernels.sh stage | run   (see the top of the file)" >&2
    exit 2
    ;;
esac

OUT=${OUT:-/tmp/strata-gpu-out}
mkdir -p "$OUT"
for f in "$DIR"/*.xz .carry/base/*.xz; do [ -f "$f" ] && xz -dkf "$f" && chmod +x "${f%.xz}"; done
source bench/server-debs.sh unpack /tmp/kernels-root
BIN=$DIR
M=/dev/shm/strata-models
TESTS=${TESTS:-4B demo 0.8B 27B}
BENCH=${BENCH:-4b}
[ "$TESTS" = - ] && TESTS=
[ "$BENCH" = - ] && BENCH=
need=$BENCH
[ -n "${AB:-}" ] && need="$need 4b"
[ -n "${NCU:-}" ] && need="$need 4b"
[ -n "${BATCH:-}${CONC:-}${TGAB:-}${NCU_SRC:-}${KTRACE:-}" ] && need="$need 4b"
need="$need ${AHEAD:-}"
# the checkpoints, made while test_cuda runs
(for s in $(echo $need | tr ' ' '\n' | sort -u); do
    [ -f $M/$s/config.json ] || python3 tools/compare_transformers.py random --size "$s" --out "$M/$s" 2>&1 | tail -1
done) >"$OUT/models.txt" 2>&1 &
mk=$!
for w in $TESTS; do # SIZE, or SIZE@VAR=VALUE[:VAR2=VALUE2] (that size under that environment)
    s=${w%%@*} e=
    [ "$s" != "$w" ] && e=${w#*@} && e=${e//:/ }
    t0=$(date +%s)
    f=$OUT/test_cuda-${w//[^A-Za-z0-9._-]/_}.txt
    env ${TEST_ENV:-} $e timeout "${TEST_TIMEOUT:-300}" "$BIN/test_cuda" "$s" >"$f" 2>&1
    echo "== test_cuda $w: rc $?, $(($(date +%s) - t0)) s: $(tail -1 "$f")"
    grep FAIL "$f" | head -20
done
wait $mk
cat "$OUT/models.txt"
for s in $BENCH; do
    timeout 400 "$BIN/strata" bench --model "$M/$s" ${BENCH_ARGS:---reps 3} >"$OUT/bench-$s.txt" 2>&1
    echo "== bench $s: rc $?"
    grep -E "${BENCH_GREP:-^\| (pp512|tg128|engine TTFT|prefill [0-9]+ )|gdn|gemm|flash|total}" "$OUT/bench-$s.txt"
done
if [ -n "${AB:-}" ]; then
    for r in $(seq "${ABR:-1}"); do
        for v in $AB; do
            e=${v//:/ }
            [ "$v" = - ] && e=
            echo "== $v (round $r)"
            env $e "$BIN/strata" bench --model "$M/4b" --reps 3 --pp-at "${PPAT:-0:4096,0:16384}" 2>&1 |
                tee -a "$OUT/ab.txt" | grep "^prefill"
        done
    done
fi
# a variant word: its binary ($vbin) and environment ($venv)
variant() {
    vbin=$BIN/strata venv=
    case "$1" in
    -) ;;
    base) vbin=.carry/base/strata ;;
    *) venv=${1//:/ } ;;
    esac
}
for v in ${BATCH:-}; do
    variant "$v"
    echo "== batch $v"
    env $venv timeout 200 "$vbin" bench --model "$M/4b" --ctx 8192 --batch "${BATCHES:-1,2,3,4,8,12,16}" 2>&1 |
        tee -a "$OUT/batch-${v//[^A-Za-z0-9._-]/_}.txt" | grep -E "^\| [0-9]|per-op|gemm|gemv|gdn|attention|norm|total"
done
for v in ${CONC:-}; do
    variant "$v"
    echo "== concurrency $v"
    env $venv SBIN=$vbin OUT=$OUT/conc-${v//[^A-Za-z0-9._-]/_} bash bench/multiturn.sh concurrency 2>&1 | grep -E "^\||clients:|arriving|^strata_"
done
if [ -n "${NCU:-}" ]; then
    NCUB=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    ids=$(python3 -c "import random; random.seed(1); print(' '.join(str(random.randrange(1000, 200000)) for _ in range(${NCU_T:-4096})))")
    timeout 300 "$NCUB" -k "regex:$NCU" -c "${NCU_COUNT:-4}" --section SpeedOfLight --section WarpStateStats \
        --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        "$BIN/strata" ${NCU_CMD:-run --model "$M/4b" --prompt-ids "$ids" -n 1 --ctx 8192 --backend cuda} >"$OUT/ncu.txt" 2>&1
    echo "== ncu: rc $?"
    grep -E "^  [a-z_ ]+<?.*\(|Duration|Throughput|Warp Cycles|Achieved Occupancy|Issued Ipc|Registers Per|L2 Hit" "$OUT/ncu.txt" | head -120
fi
for r in $(seq "${TGAB:-0}"); do
    for b in $BIN/strata .carry/base/strata; do
        echo "== tg128 $b (round $r): $($b bench --model "$M/4b" --tg-only --reps 3 2>&1 | grep -E '^tg128')"
    done
done
if [ -n "${KTRACE:-}" ]; then
    i=0
    IFS='|' read -ra kcmds <<<"$KTRACE"
    for c in "${kcmds[@]}"; do
        i=$((i + 1))
        c=${c//\$M/$M}
        e= # leading VAR=VALUE words: the command's environment (an experiment's switch)
        while [[ $c =~ ^\ *([A-Za-z_][A-Za-z0-9_]*=[^ ]*)\ +(.*)$ ]]; do
            e="$e ${BASH_REMATCH[1]}" c=${BASH_REMATCH[2]}
        done
        echo "== ktrace $i:$e strata $c"
        env $e CUDA_INJECTION64_PATH=$PWD/$BIN/libkernel_trace.so KTRACE_OUT=$OUT/ktrace-$i.csv \
            timeout 300 "$BIN/strata" $c >"$OUT/ktrace-$i.txt" 2>&1
        echo "rc $?; $(wc -l <"$OUT/ktrace-$i.csv") kernels"
        python3 bench/ktrace.py "$OUT/ktrace-$i.csv" --show "${KTRACE_SHOW:-longest}" --top 25 | tail -40
        xz -T0 -f "$OUT/ktrace-$i.csv"
    done
fi
if [ -n "${NCU_SRC:-}" ]; then
    NCUB=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    timeout 300 "$NCUB" --kernel-name-base demangled -k "regex:$NCU_SRC" --launch-skip "${NCU_SKIP:-5}" -c 1 \
        --section SourceCounters --section WarpStateStats --import-source no -o "$OUT/src" -f \
        "$BIN/strata" ${NCU_CMD:-bench --model "$M/4b" --ctx 8192 --batch 4} >/dev/null 2>&1
    echo "== ncu source: rc $?"
    "$NCUB" -i "$OUT/src.ncu-rep" --page source --print-source sass --csv >"$OUT/sass.csv" 2>&1
    head -1 "$OUT/sass.csv"
fi
for s in ${AHEAD:-}; do
    python3 -c "import random, struct; random.seed(5); open('$OUT/ahead-ids.bin', 'wb').write(struct.pack('<64i', *[random.randrange(1000, 100000) for _ in range(64)]))"
    timeout 120 "$BIN/strata_logits" "$M/$s" cuda "$OUT/ahead-ids.bin" "$OUT/ahead-$s.bin" ahead 40 >"$OUT/ahead-$s.txt" 2>&1
    echo "== ahead $s: rc $?: $(tail -1 "$OUT/ahead-$s.txt")"
done
for w in ${COMPARE:-}; do # SIZE, or SIZE@VAR=VALUE[:VAR2=VALUE2] (strata under that environment)
    s=${w%%@*} e=
    [ "$s" != "$w" ] && e=${w#*@} && e=${e//:/ }
    f=$OUT/compare-${w//[^A-Za-z0-9._-]/_}
    t0=$(date +%s)
    env $e PYTHONUNBUFFERED=1 timeout "${COMPARE_TIMEOUT:-400}" python3 tools/compare_transformers.py compare \
        --size "$s" --work "$M" --strata-logits "$BIN/strata_logits" --long 2048 --json "$f.json" >"$f.txt" 2>&1
    echo "== compare $w: rc $?, $(($(date +%s) - t0)) s"
    grep -v "train step" "$f.txt" | grep -E "\[(un)?trained|greedy|prefill|batched|rror"
done
