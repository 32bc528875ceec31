#!/usr/bin/env bash
# run.sh - runs each fuzz target given (build-fuzz/<target>, built by `make fuzz`) for
# FUZZ_SECONDS (default 60) from its corpora: the committed tests/fuzz/corpus/<target>/, the
# seeds tests/fuzz/seeds.py makes from the fixtures, and what earlier runs found
# (build-fuzz/corpus/<target>/, where new inputs go). A crash, leak, sanitizer report or
# FUZZ_CHECK failure leaves its input in build-fuzz/crashes/<target>/ and fails the target.
# Prints "N passed, N failed" (targets) last; exits non-zero if any failed.
set -u
cd "$(dirname "$0")/../.."
secs="${FUZZ_SECONDS:-60}"
out=build-fuzz
rm -rf "$out/seeds"
python3 tests/fuzz/seeds.py "$out/seeds" || { echo "!! seeds.py failed"; echo "0 passed, 1 failed"; exit 1; }
pass=0; fail=0
for t in "$@"; do
    mkdir -p "$out/corpus/$t" "$out/crashes/$t" "$out/seeds/$t"
    log="$out/$t.log"
    echo "== fuzz $t for ${secs} s"
    "$out/$t" -max_total_time="$secs" -timeout=20 -rss_limit_mb=3072 -max_len=65536 \
        -artifact_prefix="$out/crashes/$t/" -print_final_stats=1 \
        "$out/corpus/$t" "$out/seeds/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    cov=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -n 1 | grep -oE 'cov: [0-9]+' || true)
    if [ "$rc" -eq 0 ]; then
        pass=$((pass + 1))
        echo "$t: ${runs:-?} executions, ${cov:-cov ?}, no failure"
    else
        fail=$((fail + 1))
        echo "!! $t failed (exit $rc) after ${runs:-?} executions; log $log; inputs:"
        ls -1 "$out/crashes/$t/" | sed "s|^|   $out/crashes/$t/|"
        grep -E 'ERROR|FUZZ_CHECK|SUMMARY|runtime error' "$log" | head -n 8
    fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
