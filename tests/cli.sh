#!/usr/bin/env bash
# cli.sh - the strata command line on the demo model: run (ids and text, greedy is
# deterministic), info, tokenize round trip, render, and the error paths (bad option, missing
# model, id outside the vocabulary, prompt longer than the context). Prints "N passed, N failed".
#   bash tests/cli.sh      (env: BUILD=build)
set -u
cd "$(dirname "$0")/.."
exe="${BUILD:-build}/strata"
pass=0; fail=0
ok() { if eval "$1"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }
tmp=$(mktemp -d)

# run --prompt-ids: ids out, greedy twice gives the same ids, timings on stderr
"$exe" run --prompt-ids "9707 11 1879" -n 8 --backend cpu --threads 1 >"$tmp/a" 2>"$tmp/ae"
"$exe" run --prompt-ids "9707 11 1879" -n 8 --backend cpu --threads 1 >"$tmp/b" 2>/dev/null
ok '[ "$(wc -w <"$tmp/a")" -ge 1 ] && cmp -s "$tmp/a" "$tmp/b"' "run --prompt-ids: deterministic ids"
ok 'grep -q "prefill .* ms" "$tmp/ae" && grep -q "decode .* tok/s" "$tmp/ae"' "run: timings"

# run --prompt --chat: the demo answers in text and stops at <|im_end|>
"$exe" run --prompt "Hello!" --chat -n 64 --backend cpu --threads 1 >"$tmp/c" 2>"$tmp/ce"
ok 'grep -q "finish: stop" "$tmp/ce"' "run --chat: stops at EOS"
ok '[ -s "$tmp/c" ] && ! grep -q "<|im_end|>" "$tmp/c"' "run --chat: text, EOS not printed"

# info
"$exe" info >"$tmp/i" 2>&1
ok 'grep -q "^layers .*Gated DeltaNet" "$tmp/i" && grep -q "^KV cache .* bytes per token" "$tmp/i"' "info"
ok 'grep -q "^DeltaNet state .* bytes per sequence" "$tmp/i" && grep -q "^parameters" "$tmp/i"' "info: state, parameters"

# tokenize round trip
printf 'Héllo, wörld! 123' | "$exe" tokenize >"$tmp/t"
ok '[ "$("$exe" tokenize --decode <"$tmp/t")" = "Héllo, wörld! 123" ]' "tokenize / --decode round trip"
ok '! printf "\xff\xfe" | "$exe" tokenize >/dev/null 2>"$tmp/te" && grep -q "invalid UTF-8" "$tmp/te"' "tokenize: invalid UTF-8 refused"

# render
echo '{"messages":[{"role":"user","content":"Hi"}]}' | "$exe" render >"$tmp/r"
ok 'grep -q "^<|im_start|>user$" "$tmp/r" && grep -q "^<|im_start|>assistant$" "$tmp/r"' "render"
ok '! echo "{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\"}]}" | "$exe" render >/dev/null 2>&1' "render: refusal exits non-zero"

# bench: decode at a given context alone (the demo model on the CPU; its context is 32,768)
"$exe" bench --backend cpu --at 100 --reps 1 >"$tmp/b" 2>/dev/null; rc=$?
ok '[ $rc -eq 0 ] && grep -Eq "^decode at 100 .*: [0-9.]+ tok/s" "$tmp/b"' "bench --at"
"$exe" bench --backend cpu --at 40000 --reps 1 >/dev/null 2>"$tmp/b2"; rc=$?
ok '[ $rc -eq 2 ] && grep -q "needs a context of 40050" "$tmp/b2"' "bench --at past the context"
"$exe" bench --backend cpu --at 12x >/dev/null 2>"$tmp/b3"; rc=$?
ok '[ $rc -eq 2 ] && grep -q -- "--at must be an integer from 2" "$tmp/b3"' "bench: malformed number refused"
"$exe" bench --backend cpu --pp-at 5 >/dev/null 2>"$tmp/b4"; rc=$?
ok '[ $rc -eq 2 ] && grep -q -- "--pp-at .5.: expected P:N pairs" "$tmp/b4"' "bench --pp-at malformed: an error"

# errors: clear message, non-zero exit, no crash (exit < 128)
"$exe" run --model /nonexistent --prompt-ids 1 >/dev/null 2>"$tmp/e1"; rc=$?
ok '[ $rc -eq 1 ] && grep -q "config.json: cannot open" "$tmp/e1"' "missing model"
"$exe" run --prompt-ids "999999999" --backend cpu >/dev/null 2>"$tmp/e2"; rc=$?
ok '[ $rc -eq 1 ] && grep -q "outside the vocabulary" "$tmp/e2"' "id outside the vocabulary"
"$exe" run --prompt-ids "1 2 3 4 5" --ctx 4 --backend cpu >/dev/null 2>"$tmp/e3"; rc=$?
ok '[ $rc -eq 1 ] && grep -q "does not fit the context" "$tmp/e3"' "prompt longer than the context"
"$exe" run --frobnicate >/dev/null 2>"$tmp/e4"; rc=$?
ok '[ $rc -eq 2 ] && grep -q "unknown or incomplete option" "$tmp/e4"' "bad option"
"$exe" info --model tests/bad/st_truncated >/dev/null 2>"$tmp/e5"; rc=$?
ok '[ $rc -eq 1 ] && grep -q "truncated file" "$tmp/e5"' "truncated checkpoint"

# every command explains itself: --version, --help exit 0; a malformed number is an error
ok '"$exe" --version | grep -q "^strata [0-9]"' "--version"
for c in run info bench serve; do
    ok '"$exe" '$c' --help | grep -q "usage: strata '$c'"' "$c --help exits 0 with its usage"
done
ok '! "$exe" serve --port abc 2>"$tmp/e" && grep -q -- "--port must be an integer from 0 to 65535" "$tmp/e"' "--port abc: an error, not a random port"
ok '! "$exe" serve --ctx -5 2>"$tmp/e" && grep -q -- "--ctx must be an integer" "$tmp/e"' "--ctx -5: an error"
ok '! "$exe" serve --parallel 0 2>"$tmp/e" && grep -q -- "--parallel must be an integer from 1 to 64" "$tmp/e"' "--parallel 0: an error"
ok '! "$exe" serve --parallel 65 2>"$tmp/e" && grep -q -- "--parallel must be an integer from 1 to 64" "$tmp/e"' "--parallel 65: an error"
ok '"$exe" bench --model demo --backend cpu --batch 1,x >/dev/null 2>"$tmp/e"; [ $? -eq 2 ] && grep -q -- "--batch" "$tmp/e"' "bench --batch 1,x: an error"
ok '"$exe" bench --model demo --backend cpu --batch 1,2 >"$tmp/o" 2>/dev/null && grep -q "^| 2 | " "$tmp/o"' "bench --batch 1,2: a row per size"
ok 'grep -q "^mixed step" "$tmp/o" && [ "$(grep -c "^| 2 | " "$tmp/o")" -eq 2 ]' "bench --batch 1,2: the mixed step of B 2 too"
ok '! "$exe" run --prompt hi -n x 2>"$tmp/e" && grep -q -- "-n must be an integer" "$tmp/e"' "run -n x: an error"

# checkpoints strata does not read are named as such: GGUF (by magic or by name), a directory of
# GGUF files, another architecture; a chat reply shows no raw </think>
printf 'GGUF\003\000\000\000' >"$tmp/model.bin"
: >"$tmp/empty.gguf"
mkdir -p "$tmp/ggufdir" "$tmp/llama"
printf 'GGUF' >"$tmp/ggufdir/Qwen3.5-4B-Q4_K_M.gguf"
echo '{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":8}' >"$tmp/llama/config.json"
echo '{"model_type":"mistral","hidden_size":8}' >"$tmp/mistral.json"; mkdir -p "$tmp/mistral"; mv "$tmp/mistral.json" "$tmp/mistral/config.json"
"$exe" info "$tmp/model.bin" >/dev/null 2>"$tmp/g1"; rc=$?
ok '[ $rc -eq 1 ] && grep -q "model.bin is a GGUF file: strata does not read GGUF" "$tmp/g1"' "info: GGUF by its magic"
"$exe" run --model "$tmp/empty.gguf" --prompt-ids 1 >/dev/null 2>"$tmp/g2"; rc=$?
ok '[ $rc -eq 1 ] && grep -q "empty.gguf is a GGUF file" "$tmp/g2"' "run: GGUF by its name"
"$exe" serve "$tmp/ggufdir" --port 0 >/dev/null 2>"$tmp/g3"; rc=$?
ok '[ $rc -eq 1 ] && grep -q "holds GGUF files (Qwen3.5-4B-Q4_K_M.gguf) and no config.json" "$tmp/g3"' "serve: a directory of GGUF files"
"$exe" serve "$tmp/model.bin" --port 0 >/dev/null 2>"$tmp/g4"; rc=$?
ok '[ $rc -eq 1 ] && grep -q "is a GGUF file" "$tmp/g4" && ! grep -q "cannot open" "$tmp/g4"' "serve: GGUF named before the tokenizer is looked for"
"$exe" info "$tmp/llama" >/dev/null 2>"$tmp/g5"; rc=$?
ok '[ $rc -eq 1 ] && grep -q "found \"LlamaForCausalLM\" (model_type \"llama\"): this is not a Qwen3.5 checkpoint" "$tmp/g5"' "another architecture named"
"$exe" info "$tmp/mistral" >/dev/null 2>"$tmp/g6"; rc=$?
ok '[ $rc -eq 1 ] && grep -q "model_type: expected .*found \"mistral\": this is not a Qwen3.5 checkpoint" "$tmp/g6"' "another model_type named"
"$exe" run --prompt "Hello!" --chat -n 64 --backend cpu --threads 1 >"$tmp/c2" 2>"$tmp/c2e"
ok '[ -s "$tmp/c2" ] && ! grep -q "think>" "$tmp/c2" "$tmp/c2e"' "run --chat: no raw </think>"
"$exe" run --prompt "Hello!" --chat -n 3 --backend cpu --threads 1 >/dev/null 2>"$tmp/c3e"
ok '! grep -q "think>" "$tmp/c3e"' "run --chat, cut inside the reasoning: no raw tag"
rm -rf "$tmp"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
