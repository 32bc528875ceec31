#!/usr/bin/env bash
# layers.sh - the folders of src/ are the layers and an include runs downward only:
#   cli > api > engine > {model, text} > util
# model/cpu and model/cuda (the backends) sit beneath model: of model/ they include only the
# interface they implement (backend.h and the config.h it carries), never model.h or the loader.
# Each file's quoted includes are checked against the layers it may reach; one test per file, and
# one that a wrong include is caught (a file written for the purpose). Prints "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0

# The layer of a path under src/ and the headers (as written in #include, from src/) it may name.
layer_of() {
    case "$1" in
        src/cli/*) echo cli ;; src/api/*) echo api ;; src/engine/*) echo engine ;;
        src/model/cpu/*) echo cpu ;; src/model/cuda/*) echo cuda ;; src/model/*) echo model ;;
        src/text/*) echo text ;; src/util.*) echo util ;; *) echo unknown ;;
    esac
}
allowed() { # layer header-path-from-src
    local h=$2
    case "$1" in
        cli) true ;;
        api) [[ $h == api/* || $h == engine/* || $h == model/* || $h == text/* || $h == util.h ]] ;;
        engine) [[ $h == engine/* || $h == model/* || $h == text/* || $h == util.h ]] ;;
        model) [[ $h == model/* || $h == util.h ]] ;;
        cpu) [[ $h == model/cpu/* || $h == model/backend.h || $h == model/config.h || $h == util.h ]] ;;
        cuda) [[ $h == model/cuda/* || $h == model/backend.h || $h == model/config.h || $h == util.h ]] ;;
        text) [[ $h == text/* || $h == util.h ]] ;;
        util) [[ $h == util.h ]] ;;
        *) false ;;
    esac
}
# Prints the offending includes of file $1 (an #include "x" is resolved as the compiler does:
# beside the file first, then from src/).
check_file() {
    local f=$1 l dir inc path bad=0
    l=$(layer_of "$f"); dir=$(dirname "$f")
    while read -r inc; do
        if [ -e "$dir/$inc" ]; then path=$(realpath --relative-to=src "$dir/$inc")
        elif [ -e "src/$inc" ]; then path=$inc
        else echo "  $f: #include \"$inc\" not found under src/"; bad=1; continue; fi
        allowed "$l" "$path" || { echo "  $f ($l) includes $path"; bad=1; }
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    return $bad
}

while IFS= read -r f; do
    if [ "$(layer_of "$f")" = unknown ]; then
        fail=$((fail + 1)); echo "FAIL: $f is in no layer (src/ holds only the layer folders and util)"
    elif out=$(check_file "$f"); then pass=$((pass + 1))
    else fail=$((fail + 1)); echo "FAIL: $f includes upward:"; echo "$out"; fi
done < <(find src -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) | sort)

# the check itself catches an upward include (engine -> api) and passes a downward one
tmpf=src/engine/.layers_probe.c
trap 'rm -f "$tmpf"' EXIT
printf '#include "api/server.h"\n' >"$tmpf"
if check_file "$tmpf" >/dev/null; then fail=$((fail + 1)); echo "FAIL: engine -> api not caught"
else pass=$((pass + 1)); fi
printf '#include "model/model.h"\n#include "sampler.h"\n' >"$tmpf"
if check_file "$tmpf" >/dev/null; then pass=$((pass + 1))
else fail=$((fail + 1)); echo "FAIL: engine -> model flagged"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
