#!/usr/bin/env bash
# curl.sh - strata serve as curl users see it: the endpoints, a streamed chat read with -N
# (every event a JSON "data:" line, [DONE] last), the error statuses, and SIGTERM.
#   bash tests/server/curl.sh        (env: BUILD=build, STRATA_DEMO_MODEL=demo, PORT)
# Prints "N passed, N failed" last; exits non-zero on any failure.
set -u
cd "$(dirname "$0")/../.."
exe="${BUILD:-build}/strata"
model="${STRATA_DEMO_MODEL:-demo}"
port="${PORT:-$((17000 + $$ % 2000))}"
url="http://127.0.0.1:$port"
pass=0; fail=0
ok() { if eval "$1"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }
tmp=$(mktemp -d)
"$exe" serve --model "$model" --port "$port" --backend cpu --threads 1 --quiet >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 100); do curl -sf "$url/health" >/dev/null 2>&1 && break; sleep 0.1; done

ok '[ "$(curl -s "$url/health")" = "{\"status\":\"ok\"}" ]' "/health"
ok 'curl -s "$url/v1/models" | grep -q "\"object\":\"list\""' "/v1/models"
ok 'curl -s "$url/metrics" | grep -q "^strata_queue_depth 0"' "/metrics queue depth"
ok 'curl -s "$url/metrics" | grep -q "^# TYPE strata_ttft_seconds histogram"' "/metrics TTFT histogram"

body='{"messages":[{"role":"user","content":"Hello"}],"max_tokens":16,"temperature":0,"stream":true}'
curl -sN "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" >"$tmp/sse"
ok '[ "$(grep -c "^data: {" "$tmp/sse")" -ge 2 ]' "streamed events"
ok '[ "$(grep "^data: " "$tmp/sse" | tail -n 1)" = "data: [DONE]" ]' "[DONE] last"
ok '! grep -v "^data: " "$tmp/sse" | grep -q .' "only data lines and blank separators"
ok 'grep -q "\"finish_reason\":\"" "$tmp/sse"' "finish_reason in the stream"
# the prefix cache: the same request again resumes all of its prompt; /metrics counts it
curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "${body/true/false}" >"$tmp/again"
ok 'grep -q "\"prompt_tokens_details\":{\"cached_tokens\":[1-9]" "$tmp/again"' "cached_tokens on a re-send"
curl -s "$url/metrics" >"$tmp/metrics"
ok 'grep -q "^strata_cache_hits_total [1-9]" "$tmp/metrics" && grep -q "^strata_prompt_tokens_cached_total [1-9]" "$tmp/metrics"' "/metrics cache hits and cached tokens"
ok 'grep -q "^strata_cache_budget_bytes [1-9]" "$tmp/metrics" && grep -q "^strata_cache_bytes [1-9]" "$tmp/metrics"' "/metrics cache bytes"
ok '"$exe" serve --model "$model" --cache-mem 12Q 2>&1 | grep -q "cache-mem" ; [ "${PIPESTATUS[0]}" -eq 2 ]' "--cache-mem malformed: an error"

code() { curl -s -o "$tmp/body" -w '%{http_code}' "$@"; }
json=(-H 'Content-Type: application/json')
ok '[ "$(code "$url/apply-template" "${json[@]}" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}")" = 200 ] && grep -q "\"prompt\":\"<|im_start|>user\\\\nHi<|im_end|>" "$tmp/body"' "/apply-template renders the prompt"
ok '[ "$(code "$url/apply-template" "${json[@]}" -d "{\"messages\":3}")" = 400 ]' "/apply-template 400"
# a final assistant message is continued (its content ends the prompt), or closed when asked
ok '[ "$(code "$url/apply-template" "${json[@]}" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"The answer is\"}]}")" = 200 ] && grep -q "The answer is\"}$" "$tmp/body"' "a final assistant message is continued"
ok '[ "$(code "$url/apply-template" "${json[@]}" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"The answer is\"}],\"continue_final_message\":false}")" = 200 ] && grep -q "The answer is<|im_end|>" "$tmp/body"' "continue_final_message false closes it"
ok '[ "$(code "$url/apply-template" "${json[@]}" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"\"}]}")" = 200 ] && grep -q "<|im_start|>assistant\\\\n<think>\\\\n\"}$" "$tmp/body"' "an empty final assistant message is closed and a new turn opened"
# OpenAI's developer role: the system message when it comes first; later, a 400 naming it
ok '[ "$(code "$url/apply-template" "${json[@]}" -d "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"}]}")" = 200 ] && grep -q "\"prompt\":\"<|im_start|>system\\\\nBe brief.<|im_end|>" "$tmp/body"' "developer role as the system message"
ok '[ "$(code "$url/v1/chat/completions" "${json[@]}" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"developer\",\"content\":\"x\"}]}")" = 400 ] && grep -q "messages\[1\] is a developer message" "$tmp/body"' "a later developer message: 400 naming it"
ok '[ "$(code "$url/nope")" = 404 ]' "404"
ok '[ "$(code -X DELETE "$url/v1/models")" = 405 ]' "405"
ok '[ "$(code "$url/v1/chat/completions" "${json[@]}" -d "{bad")" = 400 ] && grep -q "line 1, column" "$tmp/body"' "400 malformed JSON with line/column"
ok '[ "$(code "$url/v1/chat/completions" "${json[@]}" -d "{\"messages\":[],\"max_tokens\":-1}")" = 400 ]' "400 bad field"
ok '[ "$(code "$url/v1/chat/completions" -d "$body")" = 415 ] && grep -q "Content-Type: application/json" "$tmp/body"' "415 without Content-Type: application/json (curl -d sends a form type)"
head -c 9000000 /dev/zero | tr '\0' ' ' >"$tmp/big"
ok '[ "$(code "$url/v1/chat/completions" "${json[@]}" --data-binary @"$tmp/big")" = 413 ]' "413 body over 8 MiB"
ok 'curl -s "$url/health" >/dev/null' "alive after the errors"

kill -TERM "$pid"
for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; ok false "exit on SIGTERM"; else wait "$pid"; rc=$?; ok '[ "$rc" -eq 0 ]' "exit status 0 on SIGTERM"; fi
ok 'grep -q "listening on http://127.0.0.1:$port" "$tmp/out"' "ready line with the URL"
rm -rf "$tmp"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
