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
#   run(carry=[".carry/server"]): bash bench/multiturn.sh sampling  # greedy vs sampled over HTTP
#   run(carry=[".carry/server"]): bash bench/multiturn.sh concurrency  # 1-64 streaming clients
# (the tree and both binaries with the debs pass the 64 MiB a call carries)
# Output: $OUT/multiturn.md, $OUT/multiturn.json. Env: SIZE (4b), CTX (32768), MAXTOK (48), SBIN (the
# strata binary; default .carry/server/strata), DEBS (the .debs: bench/server-debs.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
# the runtime libraries unpacked, $OUT, and the random checkpoint $M of $SIZE (made if missing)
setup() {
    OUT=${OUT:-/tmp/strata-gpu-out}
    mkdir -p "$OUT"
    source bench/server-debs.sh unpack /tmp/mt-root
    SIZE=${SIZE:-4b}
    M=/dev/shm/strata-models/$SIZE
    [ -f "$M/config.json" ] || python3 tools/compare_transformers.py random --size "$SIZE" --out "$M" 2>&1 | tail -1
}
# serve PORT LOG ARGS...: strata serve on the random checkpoint $M in the background ($pid), once healthy
serve() {
    local port=$1 log=$2
    shift 2
    ${SBIN:-.carry/server/strata} serve --model "$M" --tokenizer-dir demo --backend cuda --port "$port" "$@" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
}
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
    setup
    S=${SBIN:-.carry/server/strata}
    port=18080
    serve $port "$OUT/serve.log" --ctx "${CTX:-32768}" --test-forced-output
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
sampling) # issue 27's table: decode tok/s over HTTP, greedy against sampled (carry .carry/server)
    setup
    port=18081
    serve $port "$OUT/serve-sampling.log" --ctx 8192
    python3 - "$port" <<'PY' | tee "$OUT/sampling.md"
import json, sys, urllib.request
port = sys.argv[1]
cases = [("greedy", {"temperature": 0}),
         ("T 0.7, top_p 0.8, top_k 20, presence 1.5 (Qwen's)",
          {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "presence_penalty": 1.5}),
         ("T 1.0, top_k 0 (no filter)", {"temperature": 1.0, "top_k": 0, "top_p": 1.0}),
         ("T 1.0, top_p 0.95, top_k 0 (host sampler)", {"temperature": 1.0, "top_k": 0, "top_p": 0.95})]
import time
def ttft():  # wall time to the first streamed chunk of a 54-token-ish chat request
    body = {"messages": [{"role": "user", "content": "Write a short story about a fox. " * 4}],
            "max_tokens": 2, "stream": True, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            if line.startswith(b"data: {"):
                return (time.time() - t0) * 1e3
def one_token(i):  # a non-streamed request of one token: wall time and the engine's prompt_ms
    body = {"messages": [{"role": "user", "content": f"Write story number {i} about a fox. " * 4}],
            "max_tokens": 1, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    res = json.load(urllib.request.urlopen(req, timeout=60))
    return (time.time() - t0) * 1e3, res["timings"]["prompt_ms"]
urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read()  # the client's own first-use costs
w0, p0 = one_token(0)
later = sorted(one_token(i) for i in range(1, 6))[2]
first = ttft()
later_s = sorted(ttft() for _ in range(5))[2]
print(f"first request after start-up (one token, not streamed): {w0:.1f} ms wall, engine prompt_ms {p0:.1f}; "
      f"later ones (median of 5, other prompts): {later[0]:.1f} ms wall, prompt_ms {later[1]:.1f}")
print(f"TTFT over HTTP (streaming, the same prompt each time): first {first:.1f} ms, later (median of 5) {later_s:.1f} ms\n")
print("| request (300 tokens, /v1/completions, 3 runs) | server decode tok/s |\n|---|---|")
for name, fields in cases:
    tps = []
    for r in range(3):
        body = {"prompt": "The quick brown fox", "max_tokens": 300, "ignore_eos": True, "seed": r + 1}
        body.update(fields)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        res = json.load(urllib.request.urlopen(req, timeout=120))
        tps.append(res["timings"]["predicted_per_second"])
    print(f"| {name} | {' / '.join(f'{t:.1f}' for t in tps)} |")
# issue 28's targets: a nested schema of ~20 fields (chat, greedy, until the JSON closes), and
# logprobs with top_logprobs 20 (300 tokens, greedy)
leaf = lambda i: [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"}][i % 4]
inner = {"type": "object", "properties": {f"f{i}": leaf(i) for i in range(6)}, "required": [f"f{i}" for i in range(6)],
         "additionalProperties": False}
schema = {"type": "object", "additionalProperties": False,
          "properties": {**{f"a{i}": leaf(i) for i in range(6)}, "b": inner,
                         "c": {"type": "array", "items": inner, "maxItems": 2}, "d": {"enum": ["x", "y", "z"]}},
          "required": [f"a{i}" for i in range(6)] + ["b", "c", "d"]}
def chat(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    res = json.load(urllib.request.urlopen(req, timeout=120))
    return res, (time.time() - t0) * 1e3
for name, extra in [("chat, json_schema (~20 fields, nested), greedy", {"response_format": {"type": "json_schema",
                     "json_schema": {"name": "s", "schema": schema, "strict": True}}}),
                    ("chat, plain, greedy (the same length)", {}),
                    ("chat, logprobs + top_logprobs 20, greedy, 300 tokens", {"logprobs": True, "top_logprobs": 20,
                     "max_tokens": 300, "ignore_eos": True})]:
    out = []
    for r in range(3):
        body = {"messages": [{"role": "user", "content": "Describe a fox as JSON."}], "max_tokens": 400,
                "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}
        body.update(extra)
        if not extra:
            body.update({"max_tokens": n_json, "ignore_eos": True})
        res, ms = chat(body)
        t = res["timings"]
        if "response_format" in extra:
            n_json = max(t["predicted_n"], 2)
            try:
                json.loads(res["choices"][0]["message"]["content"]); valid = "valid JSON"
            except Exception:
                valid = "NOT valid JSON"
        out.append(f"{t['predicted_per_second']:.1f} ({t['predicted_n']} tok, prompt {t['prompt_ms']:.1f} ms)")
    print(f"| {name} | {' / '.join(out)}{' ' + valid if 'response_format' in extra else ''} |")
PY
    kill $pid; wait $pid
    ;;
concurrency) # bench/concurrency.py: 1, 4, 16, 64 streaming clients (carry .carry/server)
    setup
    port=18082
    serve $port "$OUT/serve-concurrency.log" --ctx 8192 --test-forced-output
    timeout 300 python3 bench/concurrency.py --url "http://127.0.0.1:$port" --forced \
        --clients "${CLIENTS:-1,4,16,64}" --max-tokens "${MAXTOK:-64}" --requests "${REQUESTS:-1}" \
        --late "${LATE:-15}" --json "$OUT/concurrency.json" \
        | tee "$OUT/concurrency.md"
    # the engine thread's time in the emit callbacks against decode (every round together)
    curl -s "http://127.0.0.1:$port/metrics" |
        grep -E '^strata_(stream_emit_seconds|decode_seconds|prompt_seconds|tokens_generated|batched_round[a-z_]*)_total' |
        tee -a "$OUT/concurrency.md"
    kill $pid; wait $pid
    ;;
testcache) # tests/test_cache.c on the CUDA backend: carry .carry/server/debs and .carry/tc
    OUT=${OUT:-/tmp/strata-gpu-out}
    mkdir -p "$OUT"
    source bench/server-debs.sh unpack /tmp/mt-root
    echo "== test_cache on the GPU (resumed vs fresh prefills of the demo model, CUDA backend)"
    STRATA_TEST_BACKEND=cuda timeout 120 .carry/tc/test_cache 2>&1 | tail -12 | tee "$OUT/test_cache.txt"
    ;;
*)
    echo "usage: bash bench/multiturn.sh stage|run|testcache|sampling|concurrency" >&2
    exit 2
    ;;
esac
