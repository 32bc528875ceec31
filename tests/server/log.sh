#!/usr/bin/env bash
# log.sh - the server explains itself: one access-log line per request on stderr (method,
# route, status; for a generation prompt / cached / generated tokens, TTFT, tok/s, how it ended;
# the duration), as text and with --log-format json (every line a JSON object); and CORS for
# allowed origins admitting the headers a browser SDK asks for (Access-Control-Allow-Headers
# reflects Access-Control-Request-Headers), refused origins still refused.
#   bash tests/server/log.sh        (env: BUILD=build, STRATA_DEMO_MODEL=demo, PORT)
# Prints "N passed, N failed" last; exits non-zero on any failure.
set -u
cd "$(dirname "$0")/../.."
exe="${BUILD:-build}/strata"
model="${STRATA_DEMO_MODEL:-demo}"
port="${PORT:-$((24000 + $$ % 2000))}"
url="http://127.0.0.1:$port"
pass=0; fail=0
ok() { if eval "$1"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }
tmp=$(mktemp -d)
json=(-H 'Content-Type: application/json')
chat='{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0}'
long='{"messages":[{"role":"user","content":"Hello"}],"max_tokens":100000,"ignore_eos":true,"stream":true}'

start() { # start FORMAT: the server on $port, its stderr in $tmp/err.FORMAT
    "$exe" serve --model "$model" --port "$port" --backend cpu --threads 1 --log-format "$1" \
        >/dev/null 2>"$tmp/err.$1" &
    pid=$!
    for _ in $(seq 100); do curl -sf "$url/health" >/dev/null 2>&1 && break; sleep 0.1; done
}
stop() { kill -TERM "$pid"; wait "$pid" 2>/dev/null; }
requests() { # the same requests for both formats
    curl -s "$url/health" >/dev/null
    curl -s "$url/v1/chat/completions" "${json[@]}" -d "$chat" >/dev/null
    curl -sN "$url/v1/chat/completions" "${json[@]}" -d "${chat%\}},\"stream\":true}" >/dev/null
    curl -s "$url/v1/chat/completions" "${json[@]}" -d "$chat" >/dev/null # all of it cached
    curl -s "$url/api/chat" "${json[@]}" -d '{"model":"demo","messages":[{"role":"user","content":"Hi"}],"stream":false,"options":{"num_predict":4}}' >/dev/null
    curl -s "$url/no/such/route" >/dev/null
    curl -s --max-time 1 -N "$url/v1/chat/completions" "${json[@]}" -d "$long" >/dev/null # a client that leaves
    sleep 0.3
}

# text
start text
requests
stop
log="$tmp/err.text"
num='[0-9]+(\.[0-9]+)?'
gen="prompt=[0-9]+ cached=[0-9]+ generated=[0-9]+ ttft_ms=$num tok/s=$num"
ok 'grep -Eq "^strata serve: GET /health 200 ms=$num$" "$log"' "text: a line for /health"
ok '[ "$(grep -Ec "^strata serve: POST /v1/chat/completions 200 $gen end=(stop|length) ms=$num$" "$log")" -eq 3 ]' \
    "text: a line per generation with its counts ($(grep -c "POST /v1/chat" "$log") lines)"
ok 'grep -Eq "POST /v1/chat/completions 200 prompt=([0-9]+) cached=\1 generated" "$log"' "text: the re-send's prompt all cached"
ok 'grep -Eq "^strata serve: POST /api/chat 200 $gen end=length ms=$num$" "$log"' "text: an Ollama request"
ok 'grep -Eq "^strata serve: GET /no/such/route 404 ms=$num$" "$log"' "text: a 404"
ok 'grep -Eq "^strata serve: POST /v1/chat/completions 200 .*end=(cancelled|client gone|connection closed)" "$log"' \
    "text: a client that left"
ok '! grep -v "^strata serve: " "$log" | grep -q .' "text: every line is the server's"

# json
start json
requests
stop
log="$tmp/err.json"
ok 'python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$log"' "json: every stderr line is a JSON object"
python3 - "$log" >"$tmp/check" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
req = [r for r in rows if r.get("event") == "request"]
gens = [r for r in req if r["route"] == "/v1/chat/completions" and r.get("end") in ("stop", "length")]
keys = {"time", "method", "route", "status", "prompt_tokens", "cached_tokens", "generated_tokens",
        "ttft_ms", "tokens_per_second", "duration_ms", "end"}
print("gens", len(gens), all(keys <= set(g) for g in gens) and all(g["generated_tokens"] > 0 for g in gens))
print("health", any(r["route"] == "/health" and r["status"] == 200 and "prompt_tokens" not in r for r in req))
print("ollama", any(r["route"] == "/api/chat" and r["generated_tokens"] > 0 for r in req))
print("info", any(r.get("msg", "").startswith("loading") for r in rows))
EOF
ok 'grep -q "^gens 3 True$" "$tmp/check"' "json: a generation's fields ($(head -1 "$tmp/check"))"
ok 'grep -q "^health True$" "$tmp/check" && grep -q "^ollama True$" "$tmp/check"' "json: /health, /api/chat"
ok 'grep -q "^info True$" "$tmp/check"' "json: the server's own lines are objects too"
ok '! "$exe" serve --log-format xml 2>"$tmp/e" && grep -q "expected text or json" "$tmp/e"' "--log-format xml: an error"

# CORS: an allowed origin's preflight admits what it asks for; others stay refused
"$exe" serve --model "$model" --port "$port" --backend cpu --threads 1 --quiet >/dev/null 2>&1 &
pid=$!
for _ in $(seq 100); do curl -sf "$url/health" >/dev/null 2>&1 && break; sleep 0.1; done
asked='content-type, x-stainless-os, x-stainless-lang, x-stainless-package-version, authorization'
curl -s -o /dev/null -D "$tmp/h1" -X OPTIONS "$url/v1/chat/completions" -H 'Origin: http://localhost:5173' \
    -H 'Access-Control-Request-Method: POST' -H "Access-Control-Request-Headers: $asked"
ok 'grep -qi "^Access-Control-Allow-Headers: $asked" "$tmp/h1" && grep -qi "^Access-Control-Allow-Origin: http://localhost:5173" "$tmp/h1"' \
    "preflight: the requested headers are reflected"
curl -s -o /dev/null -D "$tmp/h2" -X OPTIONS "$url/api/chat" -H 'Origin: http://127.0.0.1:3000' \
    -H 'Access-Control-Request-Method: POST'
ok 'grep -qi "^Access-Control-Allow-Headers: Authorization, Content-Type, X-Api-Key" "$tmp/h2"' "preflight without a list: the default one"
curl -s -o /dev/null -D "$tmp/h3" -X OPTIONS "$url/v1/chat/completions" -H 'Origin: http://localhost:5173' \
    -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: x-a, bad(header)'
ok 'grep -qi "^Access-Control-Allow-Headers: Authorization, Content-Type, X-Api-Key" "$tmp/h3"' "a malformed list is not echoed"
ok '[ "$(curl -s -o /dev/null -w "%{http_code}" -X OPTIONS "$url/v1/chat/completions" -H "Origin: https://evil.example" \
    -H "Access-Control-Request-Headers: x-stainless-os")" = 403 ]' "another origin's preflight: 403"
curl -s -o /dev/null -D "$tmp/h4" "$url/v1/chat/completions" "${json[@]}" -H 'Origin: http://localhost:5173' \
    -H 'x-stainless-os: Linux' -d "$chat"
ok 'grep -qi "^Access-Control-Allow-Origin: http://localhost:5173" "$tmp/h4"' "the request itself: allowed origin echoed"
kill -TERM "$pid"; wait "$pid" 2>/dev/null
rm -rf "$tmp"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
