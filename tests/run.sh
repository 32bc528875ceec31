#!/usr/bin/env bash
# Runs each test binary given, echoes its output, sums the "N passed, N failed" lines and prints
# the total last. Exits non-zero if any binary failed or printed no summary.
set -u
total_p=0; total_f=0; bad=0
for t in "$@"; do
    echo "== $t"
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        echo "!! $t printed no summary (exit $rc)"; total_f=$((total_f + 1)); bad=1; continue
    fi
    p=$(echo "$line" | awk '{print $1}'); f=$(echo "$line" | awk '{print $3}')
    total_p=$((total_p + p)); total_f=$((total_f + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "!! $t exited $rc"; total_f=$((total_f + 1))
    fi
    [ "$rc" -ne 0 ] && bad=1
done
echo "$total_p passed, $total_f failed"
[ "$bad" -eq 0 ] && [ "$total_f" -eq 0 ]
